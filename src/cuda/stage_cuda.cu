// stage_cuda.cu: CUDA backend of megamoe staging.
//
// Two kernels, chosen on the host (see docs/DESIGN.md):
//  * stage_fast_kernel<In, G, UE8M0, Mode>: G in {32, 128}; hidden rows and x_fp8 rows contiguous
//    and 16-byte aligned. One thread owns a 16-element "chunk" of one token row (two 16 B
//    loads of bf16/fp16, four of fp32; one 16 B store of fp8). Consecutive threads own
//    consecutive chunks of the flattened [T, H] problem, so a warp reads 512 (bf16)
//    contiguous bytes per load instruction. The G/16 threads of a group reduce amax with
//    xor-shuffles; the G/4 threads of a UE8M0 word OR their exponent bytes together and the
//    first of them stores the word (and its shared-expert copy). Top-k repack is spread
//    over the threads of each row (thread j of row t handles k = j, j + H/16, ...).
//  * stage_generic_kernel<In, UE8M0>: every other case (any G, any strides, misaligned
//    pointers). One thread owns one UE8M0 word (4 groups) or one fp32-scale group and
//    walks it with strided scalar accesses.
// Both use the numerics of core/numerics.h (the same code as the CPU backend). Offsets are
// 64-bit, except in the fast kernel's 32-bit modes, which the host picks only when every
// offset fits (Mode). Grid-stride loops make any T launchable. No allocation, no host
// synchronization: safe under CUDA-graph capture. Optional PDL (sm_90+).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/fastdiv.h"
#include "core/layout.h"
#include "core/numerics.h"
#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "cuda/packed_amax.cuh"
#include "cuda/tuning.h"
#include "validate.h"

namespace megamoe {
namespace cuda {
namespace {

using core::GroupScale;

// ---------------------------------------------------------------------------------------
// Kernel parameters (passed by value).
// Kernel arguments live in the constant bank; at decode sizes every first touch of a
// constant-cache line is a stall on the critical path, so fields are grouped by when the
// fast kernel needs them: what it reads before its first load fills the first line
// (48 bytes after the 16 the driver uses), then the store side, then the top-k side.
struct Params {
  // Before the first load (fast path).
  const void* hs;
  int64_t hs_s0;
  int64_t n_chunks;          // fast path: T * cpr
  core::FastDivU32 cpr_div;  // fast path: division by cpr for 32-bit chunk indices
  int pdl;                   // launched with programmatic stream serialization: run griddepcontrol
  int64_t K;
  // Stores of the quantized chunk and its scale.
  uint8_t* xq;
  int64_t xq_s0;
  void* sf;
  int64_t sf_s0, sf_s1;
  int64_t cpr;  // fast path: 16-element chunks per row (H / 16)
  // Top-k.
  const void* ids;
  int64_t ids_s0, ids_s1;
  const void* w;
  int64_t w_s0, w_s1;
  const uint8_t* pad;  // nullable
  int64_t pad_s0;
  int64_t* idx_out;
  int64_t io_s0, io_s1;
  float* w_out;
  int64_t wo_s0, wo_s1;
  int ids_i64;  // topk_ids dtype is int64
  int w_dtype;  // 0 fp32, 1 bf16, 2 fp16
  // Rarely or generic-path only.
  uint32_t* shared_sf;  // nullable
  int64_t sh_s0, sh_s1;
  int64_t shared_bm;
  int64_t hs_s1, xq_s1;
  int64_t T, H, G;
};
static_assert(offsetof(Params, xq) == 48, "hot fields fill the first 48 bytes");

enum InKind { kInBF16 = 0, kInF16 = 1, kInF32 = 2 };

template <int In>
struct InTraits;
template <>
struct InTraits<kInBF16> {
  using T = uint16_t;
  static __device__ __forceinline__ float to_float(uint16_t v) { return core::bf16_to_float(v); }
};
template <>
struct InTraits<kInF16> {
  using T = uint16_t;
  static __device__ __forceinline__ float to_float(uint16_t v) { return __half2float(__ushort_as_half(v)); }
};
template <>
struct InTraits<kInF32> {
  using T = float;
  static __device__ __forceinline__ float to_float(float v) { return v; }
};

__device__ __forceinline__ void pdl_wait_and_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Element offsets are computed in Idx: int64_t in general, uint32_t when the host has
// checked that every tensor's strides are non-negative and its largest offset is below
// 2^31 (fewer instructions on the decode critical path; see Mode below).
template <typename Idx>
__device__ __forceinline__ Idx offset(Idx i, int64_t s0, Idx k, int64_t s1) {
  return i * static_cast<Idx>(s0) + k * static_cast<Idx>(s1);
}

/// Top-k repack of row t, entries k = first, first + step, ...: padded rows get id -1 and
/// weight 0, others a copy (ids widened to int64, weights to fp32). All loads of an entry
/// are issued before any of their values is used, so they overlap.
template <typename Idx>
__device__ __forceinline__ void repack_topk(const Params& p, Idx t, Idx first, Idx step) {
  for (Idx k = first; k < static_cast<Idx>(p.K); k += step) {
    const Idx ioff = offset(t, p.ids_s0, k, p.ids_s1);
    const Idx woff = offset(t, p.w_s0, k, p.w_s1);
    const int64_t id = p.ids_i64 ? static_cast<const int64_t*>(p.ids)[ioff]
                                 : static_cast<int64_t>(static_cast<const int32_t*>(p.ids)[ioff]);
    const uint32_t wbits = p.w_dtype == 0 ? static_cast<const uint32_t*>(p.w)[woff]
                                          : static_cast<uint32_t>(static_cast<const uint16_t*>(p.w)[woff]);
    const uint8_t pad = p.pad != nullptr ? p.pad[t * static_cast<Idx>(p.pad_s0)] : uint8_t{0};
    const float w = p.w_dtype == 0   ? core::bits_float(wbits)
                    : p.w_dtype == 1 ? core::bf16_to_float(static_cast<uint16_t>(wbits))
                                     : core::half_to_float(static_cast<uint16_t>(wbits));
    p.idx_out[offset(t, p.io_s0, k, p.io_s1)] = pad != 0 ? int64_t{-1} : id;
    p.w_out[offset(t, p.wo_s0, k, p.wo_s1)] = pad != 0 ? 0.0f : w;
  }
}

template <typename Idx>
__device__ __forceinline__ void store_word(const Params& p, Idx t, Idx w, uint32_t word) {
  static_cast<uint32_t*>(p.sf)[offset(t, p.sf_s0, w, p.sf_s1)] = word;
  if (p.shared_sf != nullptr) {
    const Idx r = core::shared_sf_row(t, static_cast<Idx>(p.shared_bm));
    p.shared_sf[offset(r, p.sh_s0, w, p.sh_s1)] = word;
  }
}

// ---------------------------------------------------------------------------------------
// Fast path.
constexpr int kChunk = 16;  // elements per thread

/// 16-byte global store; kStream: streaming (evict-first) store.
template <bool kStream>
__device__ __forceinline__ void store16(void* ptr, uint4 v) {
  if constexpr (kStream) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
  } else {
    *static_cast<uint4*>(ptr) = v;
  }
}

/// One chunk as loaded: 8 packed words for 16-bit inputs, 16 floats' bits for fp32.
template <int In>
struct RawChunk {
  static constexpr int kWords = In == kInF32 ? kChunk : kChunk / 2;
  uint32_t w[kWords];
};

template <int In>
__device__ __forceinline__ void load_chunk(const typename InTraits<In>::T* src, RawChunk<In>& c) {
#pragma unroll
  for (int i = 0; i < RawChunk<In>::kWords / 4; ++i) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(src) + i);
    c.w[4 * i + 0] = u.x;
    c.w[4 * i + 1] = u.y;
    c.w[4 * i + 2] = u.z;
    c.w[4 * i + 3] = u.w;
  }
}

/// Element i of the chunk as fp32 (exact).
template <int In>
__device__ __forceinline__ float element(const RawChunk<In>& c, int i) {
  if constexpr (In == kInF32) return __uint_as_float(c.w[i]);
  else if constexpr (In == kInBF16) return widen<Half2Kind::kBF16>(c.w[i / 2], i % 2);
  else return widen<Half2Kind::kF16>(c.w[i / 2], i % 2);
}

/// NaN-ignoring max |x| over the chunk (core::fmax_nan_ignoring of core::abs_bits).
template <int In>
__device__ __forceinline__ float chunk_amax(const RawChunk<In>& c) {
  if constexpr (In == kInBF16) return abs_max_packed<Half2Kind::kBF16>(c.w);
  else if constexpr (In == kInF16) return abs_max_packed<Half2Kind::kF16>(c.w);
  else {
    float m[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) m[i] = core::abs_bits(__uint_as_float(c.w[i]));
#pragma unroll
    for (int width = kChunk / 2; width >= 1; width /= 2) {
#pragma unroll
      for (int i = 0; i < width; ++i) m[i] = fmaxf(m[i], m[i + width]);
    }
    return m[0];
  }
}

// Resident 256-thread blocks per SM the fast kernel is built for: the SM's thread limit
// (2048 on sm_80/90/100, 1536 on sm_86/87/89) for 16-bit inputs, which then fit 32
// registers; fp32 inputs hold twice the bytes per chunk and get 6 blocks (40 registers).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
constexpr int kFastBlocksPerSm16 = 6;
#else
constexpr int kFastBlocksPerSm16 = 8;
#endif

/// Index width and store policy of the fast kernel, chosen on the host.
enum class Mode {
  kIdx32,        ///< 32-bit chunk indices and offsets, default stores (decode, mid sizes)
  kIdx32Stream,  ///< 32-bit, evict-first fp8 stores (outputs larger than L2)
  kIdx64Stream,  ///< 64-bit everything (T*H or an offset beyond 2^31), evict-first stores
};

/// The chunk c's row t and chunk-in-row j.
template <typename Idx>
__device__ __forceinline__ void row_and_chunk(const Params& p, Idx c, Idx& t, Idx& j) {
  if constexpr (sizeof(Idx) == 4) {
    t = core::fastdiv(c, p.cpr_div);
    j = c - t * p.cpr_div.divisor;
  } else {
    t = c / p.cpr;
    j = c - t * p.cpr;
  }
}

/// One 16-element chunk per thread per grid-stride step.
template <int In, int G, bool UE8M0, Mode kMode>
__global__ void __launch_bounds__(256, In == kInF32 ? 6 : kFastBlocksPerSm16) stage_fast_kernel(const Params p) {
  static_assert(G % kChunk == 0 && G <= 128, "fast path groups span whole chunks");
  using Idx = std::conditional_t<kMode == Mode::kIdx64Stream, int64_t, uint32_t>;
  constexpr bool kStream = kMode != Mode::kIdx32;
  constexpr int kTPG = G / kChunk;  // threads per group
  constexpr int kTPW = G / 4;       // threads per UE8M0 word (4 groups)
  if (p.pdl) pdl_wait_and_trigger();
  const Idx n = static_cast<Idx>(p.n_chunks);
  const Idx cpr = static_cast<Idx>(p.cpr);
  const int lane = threadIdx.x & 31;
  // 32-bit modes: the host checked n + gridDim.x * blockDim.x < 2^32 (no wrap-around).
  for (Idx base = static_cast<Idx>(blockIdx.x) * blockDim.x; base < n;
       base += static_cast<Idx>(gridDim.x) * blockDim.x) {
    const Idx c = base + threadIdx.x;
    const bool active = c < n;
    Idx t, j;
    row_and_chunk(p, c, t, j);
    RawChunk<In> x;
    if (active) {
      load_chunk<In>(static_cast<const typename InTraits<In>::T*>(p.hs) + offset(t, p.hs_s0, j * kChunk, 1), x);
      // Top-k entries of row t go while the chunk's loads are in flight: their loads overlap,
      // and their registers are free again before the quantization needs them.
      if (j < static_cast<Idx>(p.K)) repack_topk(p, t, j, cpr);
    } else {
#pragma unroll
      for (int i = 0; i < RawChunk<In>::kWords; ++i) x.w[i] = 0u;
    }
    float amax = chunk_amax<In>(x);
#pragma unroll
    for (int off = 1; off < kTPG; off <<= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    }
    const GroupScale gs = core::group_scale(amax, UE8M0);
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = core::fp8x2_e4m3_from_float(core::mul_rn(element<In>(x, 4 * i + 0), gs.inv),
                                                      core::mul_rn(element<In>(x, 4 * i + 1), gs.inv));
      const uint32_t hi = core::fp8x2_e4m3_from_float(core::mul_rn(element<In>(x, 4 * i + 2), gs.inv),
                                                      core::mul_rn(element<In>(x, 4 * i + 3), gs.inv));
      packed[i] = lo | (hi << 16);
    }
    uint32_t word = 0;
    if constexpr (UE8M0) {
      word = gs.ue8m0 << (8 * ((lane % kTPW) / kTPG));
#pragma unroll
      for (int off = 1; off < kTPW; off <<= 1) word |= __shfl_xor_sync(0xFFFFFFFFu, word, off);
    }
    if (!active) continue;
    store16<kStream>(p.xq + offset(t, p.xq_s0, j * kChunk, 1), make_uint4(packed[0], packed[1], packed[2], packed[3]));
    if constexpr (UE8M0) {
      if (lane % kTPW == 0) store_word(p, t, j / kTPW, word);
    } else {
      if (lane % kTPG == 0) static_cast<float*>(p.sf)[offset(t, p.sf_s0, j / kTPG, p.sf_s1)] = gs.scale;
    }
  }
}

// ---------------------------------------------------------------------------------------
// General path: any G, any strides, any alignment.
template <int In, bool UE8M0>
__global__ void __launch_bounds__(256) stage_generic_kernel(const Params p) {
  if (p.pdl) pdl_wait_and_trigger();
  using Tr = InTraits<In>;
  const auto* hs = static_cast<const typename Tr::T*>(p.hs);
  const int64_t span = UE8M0 ? 4 * p.G : p.G;  // elements per unit
  const int64_t upr = p.H / span;              // units per row
  const int64_t n = p.T * upr;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += stride) {
    const int64_t t = u / upr, j = u - t * upr;
    const int64_t groups = UE8M0 ? 4 : 1;
    uint32_t word = 0;
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int64_t h0 = j * span + gi * p.G;
      float amax = 0.0f;
      for (int64_t i = 0; i < p.G; ++i) {
        amax = fmaxf(amax, core::abs_bits(Tr::to_float(hs[t * p.hs_s0 + (h0 + i) * p.hs_s1])));
      }
      const GroupScale gs = core::group_scale(amax, UE8M0);
      for (int64_t i = 0; i < p.G; ++i) {
        const float x = Tr::to_float(hs[t * p.hs_s0 + (h0 + i) * p.hs_s1]);
        p.xq[t * p.xq_s0 + (h0 + i) * p.xq_s1] = core::quantize(x, gs.inv);
      }
      if (UE8M0) {
        word |= gs.ue8m0 << (8 * gi);
      } else {
        static_cast<float*>(p.sf)[t * p.sf_s0 + j * p.sf_s1] = gs.scale;
      }
    }
    if (UE8M0) store_word<int64_t>(p, t, j, word);
    repack_topk<int64_t>(p, t, j, upr);
  }
}

// ---------------------------------------------------------------------------------------
// Host side.
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(ErrorCode::kCuda, std::string("megamoe: CUDA error in ") + what + ": " +
                                      cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
}

int sm_count(int device) {
  static std::atomic<int> cache[64];
  if (device >= 0 && device < 64) {
    int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int v = 0;
  check_cuda(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute");
  if (device >= 0 && device < 64) cache[device].store(v, std::memory_order_relaxed);
  return v;
}

// Host-side launch heuristics (see docs/DESIGN.md). Overridable for benchmarking only.
// Evict-first fp8 stores once the output outgrows L2's useful share (T*H >= 8M elements,
// e.g. T >= 1171 at H = 7168): measured time -18% at 2048 x 7168 and -17% at 4096 x 4096,
// neutral at 2048 x 4096, at 1024 x 7168 (below the threshold) and at prefill sizes.
constexpr int64_t kStreamStoresFrom = int64_t{1} << 19;  // 16-element chunks
constexpr int64_t kDefaultMaxWaves = 16;  // grid cap, in waves of (8 blocks of 256) per SM
constexpr int64_t kMaxGridThreads = int64_t{1} << 26;  // whatever the tuning: 32-bit modes rely on it
std::atomic<int> g_max_waves{0}, g_streaming{-1}, g_block_threads{0};
Tuning tuning() { return Tuning{g_max_waves.load(), g_streaming.load(), g_block_threads.load()}; }

int sm_count(int device);

/// Decode sizes: smaller blocks spread the few chunks over more SMs (shorter per-SM issue).
int block_threads_for(int64_t chunks, int device) {
  const int64_t sms = sm_count(device);
  if (chunks <= 64 * sms) return 64;
  if (chunks <= 128 * sms) return 128;
  return 256;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

/// Fast path: contiguous, 16-byte aligned rows in and out.
bool rows_vectorizable(const TensorRef& t) {
  const int64_t es = dtype_size(t.dtype);
  return t.strides[1] == 1 && ((t.strides[0] * es) % 16 == 0 || t.shape[0] == 1) && aligned16(t.data);
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

template <typename Kernel>
void launch(Kernel kernel, const Params& prm, int64_t work_items, int kThreads, int device,
            cudaStream_t stream, bool pdl) {
  // Enough resident blocks to cover the chip several times; the kernels grid-stride beyond.
  const Tuning tn = tuning();
  const int64_t waves = tn.max_waves > 0 ? tn.max_waves : kDefaultMaxWaves;
  const int64_t max_blocks = static_cast<int64_t>(sm_count(device)) * 8 * waves * (256 / kThreads);
  const int64_t blocks = std::max<int64_t>(
      1, std::min({(work_items + kThreads - 1) / kThreads, max_blocks, kMaxGridThreads / kThreads}));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, prm), "cudaLaunchKernelEx(staging)");
}

template <int In, int G, bool UE8M0>
void launch_fast(const Params& prm, bool idx32, int device, cudaStream_t stream, bool pdl) {
  const int64_t chunks = prm.n_chunks;
  const Tuning tn = tuning();
  const bool st = tn.streaming >= 0 ? tn.streaming != 0 : chunks >= kStreamStoresFrom;
  const int threads = tn.block_threads > 0 ? tn.block_threads : block_threads_for(chunks, device);
  if (!idx32) return launch(stage_fast_kernel<In, G, UE8M0, Mode::kIdx64Stream>, prm, chunks, threads, device, stream, pdl);
  if (st) return launch(stage_fast_kernel<In, G, UE8M0, Mode::kIdx32Stream>, prm, chunks, threads, device, stream, pdl);
  return launch(stage_fast_kernel<In, G, UE8M0, Mode::kIdx32>, prm, chunks, threads, device, stream, pdl);
}

template <int In>
void dispatch_in(const Params& prm, const detail::Problem& p, bool fast, bool idx32, int device,
                 cudaStream_t stream, bool pdl) {
  if (fast) {
    if (p.G == 32) {
      if (p.ue8m0) return launch_fast<In, 32, true>(prm, idx32, device, stream, pdl);
      return launch_fast<In, 32, false>(prm, idx32, device, stream, pdl);
    }
    if (p.ue8m0) return launch_fast<In, 128, true>(prm, idx32, device, stream, pdl);
    return launch_fast<In, 128, false>(prm, idx32, device, stream, pdl);
  }
  const int64_t units = p.T * (p.H / (p.ue8m0 ? 4 * p.G : p.G));
  if (p.ue8m0) return launch(stage_generic_kernel<In, true>, prm, units, 256, device, stream, pdl);
  return launch(stage_generic_kernel<In, false>, prm, units, 256, device, stream, pdl);
}

/// The fast kernel's 32-bit modes apply: no tensor reaches below its data pointer
/// (negative strides) or 2^31 elements above it, and chunk indices never wrap (n plus one
/// grid of threads < 2^32; launch() never makes a grid of more than kMaxGridThreads).
bool fits_idx32(const StageArgs& a, int64_t n_chunks) {
  for (const detail::NamedTensor& n : detail::named_tensors(a)) {
    const detail::Extent e = detail::element_extent(*n.t);
    if (e.lo < 0 || e.hi >= (int64_t{1} << 31)) return false;
  }
  return n_chunks + kMaxGridThreads < (int64_t{1} << 32);
}

}  // namespace

void set_tuning(const Tuning& t) {
  g_max_waves.store(t.max_waves);
  g_streaming.store(t.streaming);
  g_block_threads.store(t.block_threads);
}

void prepare_inputs(const StageArgs& a, const detail::Problem& p, Stream stream_handle) {
  Params prm = {};
  prm.hs = a.hidden_states.data;
  prm.hs_s0 = a.hidden_states.strides[0];
  prm.hs_s1 = a.hidden_states.strides[1];
  prm.ids = a.topk_ids.data;
  prm.ids_s0 = a.topk_ids.strides[0];
  prm.ids_s1 = a.topk_ids.strides[1];
  prm.w = a.topk_weights.data;
  prm.w_s0 = a.topk_weights.strides[0];
  prm.w_s1 = a.topk_weights.strides[1];
  if (a.is_padding) {
    prm.pad = static_cast<const uint8_t*>(a.is_padding->data);
    prm.pad_s0 = a.is_padding->strides[0];
  }
  prm.xq = static_cast<uint8_t*>(a.x_fp8.data);
  prm.xq_s0 = a.x_fp8.strides[0];
  prm.xq_s1 = a.x_fp8.strides[1];
  prm.sf = a.x_sf.data;
  prm.sf_s0 = a.x_sf.strides[0];
  prm.sf_s1 = a.x_sf.strides[1];
  if (a.shared_x_sf) {
    prm.shared_sf = static_cast<uint32_t*>(a.shared_x_sf->data);
    prm.sh_s0 = a.shared_x_sf->strides[0];
    prm.sh_s1 = a.shared_x_sf->strides[1];
    prm.shared_bm = p.shared_bm;
  }
  prm.idx_out = static_cast<int64_t*>(a.topk_idx_out.data);
  prm.io_s0 = a.topk_idx_out.strides[0];
  prm.io_s1 = a.topk_idx_out.strides[1];
  prm.w_out = static_cast<float*>(a.topk_weights_out.data);
  prm.wo_s0 = a.topk_weights_out.strides[0];
  prm.wo_s1 = a.topk_weights_out.strides[1];
  prm.T = p.T;
  prm.H = p.H;
  prm.K = p.K;
  prm.G = p.G;
  prm.ids_i64 = a.topk_ids.dtype == DType::kInt64;
  prm.w_dtype = a.topk_weights.dtype == DType::kFloat32 ? 0 : a.topk_weights.dtype == DType::kBFloat16 ? 1 : 2;
  prm.pdl = a.enable_pdl;  // griddepcontrol only when launched with PDL

  const bool fast = (p.G == 32 || p.G == 128) && rows_vectorizable(a.hidden_states) &&
                    rows_vectorizable(a.x_fp8);
  prm.cpr = p.H / kChunk;
  prm.n_chunks = p.T * prm.cpr;
  // 32-bit chunk indices divide by cpr with a multiplier (only used when idx32).
  prm.cpr_div = core::make_fastdiv(static_cast<uint32_t>(std::min<int64_t>(prm.cpr, 0xFFFFFFFF)));
  const bool idx32 = fits_idx32(a, prm.n_chunks);
  const int device = a.hidden_states.device.index;
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  switch (a.hidden_states.dtype) {
    case DType::kBFloat16: dispatch_in<kInBF16>(prm, p, fast, idx32, device, stream, a.enable_pdl); break;
    case DType::kFloat16: dispatch_in<kInF16>(prm, p, fast, idx32, device, stream, a.enable_pdl); break;
    default: dispatch_in<kInF32>(prm, p, fast, idx32, device, stream, a.enable_pdl); break;
  }
}

}  // namespace cuda
}  // namespace megamoe
