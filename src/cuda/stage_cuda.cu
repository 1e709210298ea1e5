// stage_cuda.cu: CUDA backend of megamoe staging.
//
// Two kernels, chosen on the host (see docs/DESIGN.md):
//  * stage_fast_kernel<In, G, UE8M0, Mode, Shape>: G in {32, 128}; hidden rows and x_q
//    rows contiguous and 16-byte aligned. One thread owns a 16-element "chunk" of one token
//    row (two 16 B loads of bf16/fp16, four of fp32; one 16 B store of fp8). Consecutive
//    threads own consecutive chunks of the flattened [T, H] problem. The G/16 threads of a
//    group reduce amax with xor-shuffles; the group's first thread stores the scale: an
//    fp32, or (UE8M0) its exponent byte straight into the packed int32 word and into the
//    shared-expert copy. Shape: one chunk per thread, with the top-k repack done by blocks
//    of its own after the quantizing blocks (one entry per thread, so no warp does both),
//    whenever the grid fits the cap; beyond (prefill) a grid-stride loop in which the first
//    threads of each row also repack its top-k (k = j, j + H/16, ...). For MN-major scale
//    layouts from 2^18 chunks, token tiles: a 256-thread block owns 8 tokens x 512 columns
//    (one warp per token), gathers the scales in shared memory and stores them with
//    consecutive threads on consecutive tokens, so 8 tokens share each scale line.
//  * stage_generic_kernel<In, UE8M0>: every other case (any G, any strides, misaligned
//    pointers). One thread owns one UE8M0 word (4 groups) or one fp32-scale group and
//    walks it with strided scalar accesses.
// Both use the numerics of core/numerics.h (the same code as the CPU backend). Offsets are
// 64-bit, except in the fast kernel's 32-bit modes, which the host picks only when every
// offset fits (Mode). Any T is launchable. No allocation, no host synchronization: safe
// under CUDA-graph capture. Optional PDL (sm_90+).
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
// Kernel parameters (passed by value), for Idx = uint32_t (the fast kernel's 32-bit modes:
// strides and offsets fit, see fits_idx32) or int64_t (everything else).
// Kernel arguments live in the constant bank; at decode sizes every first touch of a
// constant-cache line is a stall on the critical path, so fields are grouped by who needs
// them when (32-bit layout, 64-byte lines, arguments from 16 bytes into the first line):
// the quantizing warps before their first load (line A, 48 bytes), their scale stores
// (line B), the top-k warps (lines C, D), then what only the general kernel reads.
enum : uint32_t { kFlagPdl = 1u, kFlagIdsI64 = 2u, kFlagWBF16 = 4u, kFlagWF16 = 8u };

template <typename Idx>
struct ParamsT {
  // A: before the first load of hidden states.
  const void* hs;
  uint8_t* xq;
  Idx hs_s0, xq_s0;
  Idx n_chunks;              // fast path: T * cpr
  uint32_t quant_blocks;     // kSplitTopk: blocks below quantize, the rest repack top-k
  core::FastDivU32 cpr_div;  // fast path: chunk index -> row (32-bit modes)
  uint32_t flags;            // kFlag*: launched with PDL, ids int64, weights bf16 / fp16
  // B: scale stores.
  void* sf;
  uint32_t* shared_sf;  // nullable
  Idx sf_s0, sf_s1, sh_s0, sh_s1;
  core::FastDivU32 bm_div;  // shared rows: token -> block of shared_bm rows (32-bit modes)
  Idx abm;                  // aligned_block_m(shared_bm)
  Idx cpr;                  // 16-element chunks per row (H / 16)
  Idx hs_s1, xq_s1, G;      // general kernel only (filling the line)
  // C, D: top-k.
  const void* ids;
  const void* w;
  const uint8_t* pad;  // nullable
  int64_t* idx_out;
  float* w_out;
  Idx ids_s0, ids_s1, w_s0, w_s1, pad_s0, io_s0, io_s1, wo_s0, wo_s1;
  core::FastDivU32 k_div;  // split top-k shape: entry index -> row
  Idx n_topk;              // T * K
  Idx K;
  // Tile shape (and T also the general kernel).
  Idx T;
  Idx n_tiles;              // tile shape: ceil(T / kTileTokens) * seg_div.divisor
  core::FastDivU32 seg_div;  // tile shape: warp-wide segments (32 chunks) per row
  // General kernel only.
  Idx H, shared_bm;
};
using Params32 = ParamsT<uint32_t>;
using Params64 = ParamsT<int64_t>;
static_assert(offsetof(Params32, sf) == 48, "line A holds what the quantizing warps read before loading");
static_assert(offsetof(Params32, ids) == 112, "scale-store fields fill line B");

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
  // Hardware conversion: equal to core::half_to_float for all 65536 inputs up to NaN
  // payloads (tests/cuda/test_cuda_numerics.cu, HalfToFloatMatchesHardware), which hidden
  // states never show (amax ignores NaN, every NaN quantizes to the fp8 NaN).
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
__device__ __forceinline__ Idx offset(Idx i, Idx s0, Idx k, Idx s1) {
  return i * s0 + k * s1;
}

/// Top-k entry (t, k): padded rows get id -1 and weight 0, others a copy (ids widened to
/// int64, weights to fp32). Both loads (and the padding flag's) issue before any use.
template <typename Idx>
__device__ __forceinline__ void repack_entry(const ParamsT<Idx>& p, Idx t, Idx k) {
  const Idx ioff = offset(t, p.ids_s0, k, p.ids_s1);
  const Idx woff = offset(t, p.w_s0, k, p.w_s1);
  const int64_t id = (p.flags & kFlagIdsI64) ? static_cast<const int64_t*>(p.ids)[ioff]
                                             : static_cast<int64_t>(static_cast<const int32_t*>(p.ids)[ioff]);
  const bool w16 = (p.flags & (kFlagWBF16 | kFlagWF16)) != 0;
  const uint32_t wbits = w16 ? static_cast<uint32_t>(static_cast<const uint16_t*>(p.w)[woff])
                             : static_cast<const uint32_t*>(p.w)[woff];
  const uint8_t pad = p.pad != nullptr ? p.pad[t * p.pad_s0] : uint8_t{0};
  // fp16 weights by the software rule: the hardware conversion canonicalizes NaN payloads,
  // and a kept NaN weight is copied bit-exactly.
  const float w = (p.flags & kFlagWBF16)  ? core::bf16_to_float(static_cast<uint16_t>(wbits))
                  : (p.flags & kFlagWF16) ? core::half_to_float(static_cast<uint16_t>(wbits))
                                          : core::bits_float(wbits);
  p.idx_out[offset(t, p.io_s0, k, p.io_s1)] = pad != 0 ? int64_t{-1} : id;
  p.w_out[offset(t, p.wo_s0, k, p.wo_s1)] = pad != 0 ? 0.0f : w;
}

/// Top-k repack of row t, entries k = first, first + step, ...
template <typename Idx>
__device__ __forceinline__ void repack_topk(const ParamsT<Idx>& p, Idx t, Idx first, Idx step) {
  for (Idx k = first; k < p.K; k += step) repack_entry(p, t, k);
}

/// Row of shared_x_sf for token t (fastdiv in the 32-bit modes).
template <typename Idx>
__device__ __forceinline__ Idx shared_row(const ParamsT<Idx>& p, Idx t) {
  if constexpr (sizeof(Idx) == 4) {
    const Idx q = core::fastdiv(t, p.bm_div);
    return core::shared_sf_row_qm(q, t - q * p.bm_div.divisor, p.abm);
  } else {
    return core::shared_sf_row(t, p.shared_bm);
  }
}

/// UE8M0 word w of row t, and its shared-expert copy.
template <typename Idx>
__device__ __forceinline__ void store_word(const ParamsT<Idx>& p, Idx t, Idx w, uint32_t word) {
  static_cast<uint32_t*>(p.sf)[offset(t, p.sf_s0, w, p.sf_s1)] = word;
  if (p.shared_sf != nullptr) p.shared_sf[offset(shared_row(p, t), p.sh_s0, w, p.sh_s1)] = word;
}

/// fp32 scale of group g of row t.
template <typename Idx>
__device__ __forceinline__ void store_fp32_scale(const ParamsT<Idx>& p, Idx t, Idx g, float scale) {
  static_cast<float*>(p.sf)[offset(t, p.sf_s0, g, p.sf_s1)] = scale;
}

/// Byte b (bits 8b..8b+7, little-endian) of UE8M0 word w of row t, and its shared copy.
template <typename Idx>
__device__ __forceinline__ void store_word_byte(const ParamsT<Idx>& p, Idx t, Idx w, uint32_t b, uint32_t e) {
  reinterpret_cast<uint8_t*>(static_cast<uint32_t*>(p.sf) + offset(t, p.sf_s0, w, p.sf_s1))[b] = static_cast<uint8_t>(e);
  if (p.shared_sf != nullptr) {
    reinterpret_cast<uint8_t*>(p.shared_sf + offset(shared_row(p, t), p.sh_s0, w, p.sh_s1))[b] = static_cast<uint8_t>(e);
  }
}

// ---------------------------------------------------------------------------------------
// Fast path.
constexpr int kChunk = 16;  // elements per thread

/// 16-byte global store; kStream: streaming (evict-first) store.
template <bool kStream>
__device__ __forceinline__ void store16(void* ptr, const uint32_t (&v)[4]) {
  if constexpr (kStream) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(v[0]), "r"(v[1]),
                 "r"(v[2]), "r"(v[3])
                 : "memory");
  } else {
    *static_cast<uint4*>(ptr) = make_uint4(v[0], v[1], v[2], v[3]);
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
template <Mode kMode>
using IdxOf = std::conditional_t<kMode == Mode::kIdx64Stream, int64_t, uint32_t>;

/// How the fast kernel's grid covers the work, chosen on the host.
enum class Shape {
  kLoop,         ///< grid-stride loop over 16-element chunks (grid capped); top-k repacked by
                 ///< the first threads of each row, k = j, j + H/16, ...
  kSplitTopk,    ///< one chunk per thread, no loop (32-bit modes); top-k entries by blocks
                 ///< of their own after the quantizing blocks, one entry per thread
  kTile,         ///< (32-bit modes) a 256-thread block owns a tile of kTileTokens tokens x
                 ///< 512 columns, one warp per token; scales gathered in shared memory and
                 ///< stored token-fastest, so MN-major scale layouts (x_sf or shared_x_sf
                 ///< transposed) get 8 tokens' words per line instead of one; block-stride
                 ///< loop over tiles beyond the grid cap; top-k blocks as kSplitTopk
};
constexpr int kTileTokens = 8;                     // tokens (warps) per tile
constexpr int kTileThreads = 32 * kTileTokens;     // block size of the tile shape

/// Index c's row t and position in the row j, for `per_row` items per row (fastdiv by
/// cpr_div in the 32-bit modes, where cpr_div.divisor == per_row).
template <typename Idx>
__device__ __forceinline__ void row_and_chunk(const ParamsT<Idx>& p, Idx c, Idx& t, Idx& j) {
  if constexpr (sizeof(Idx) == 4) {
    t = core::fastdiv(c, p.cpr_div);
    j = c - t * p.cpr_div.divisor;
  } else {
    t = c / p.cpr;
    j = c - t * p.cpr;
  }
}

/// Quantize chunk j of row t (a no-op unless active, but every lane must call it:
/// shuffles). kTopk: the row's first threads also repack its top-k entries. kTile: the
/// group's scale goes to this warp's row of the block's shared-memory tile (an exponent
/// byte or an fp32's bits, at the group's index within the warp's 32 chunks) instead of
/// global memory.
template <int In, int G, bool UE8M0, bool kStream, bool kTopk, bool kTile, typename Idx>
__device__ __forceinline__ void stage_at(const ParamsT<Idx>& p, Idx t, Idx j, bool active, uint32_t* tile) {
  static_assert(G % kChunk == 0 && G <= 128, "fast path groups span whole chunks");
  constexpr int kTPG = G / kChunk;  // threads per group
  RawChunk<In> x;
  if (active) {
    load_chunk<In>(static_cast<const typename InTraits<In>::T*>(p.hs) + offset(t, p.hs_s0, j * kChunk, Idx{1}), x);
    // Top-k entries of row t go while the chunk's loads are in flight: their loads overlap,
    // and their registers are free again before the quantization needs them.
    if constexpr (kTopk) {
      if (j < p.K) repack_topk(p, t, j, p.cpr);
    }
  } else {
#pragma unroll
    for (int i = 0; i < RawChunk<In>::kWords; ++i) x.w[i] = 0u;
  }
  float amax = chunk_amax<In>(x);
#pragma unroll
  for (int off = 1; off < kTPG; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  if (!active) return;
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
  store16<kStream>(p.xq + offset(t, p.xq_s0, j * kChunk, Idx{1}), packed);
  // The group's first thread stores its scale: an fp32, or (UE8M0) its exponent byte into
  // the packed word and the shared-expert copy.
  if (j % kTPG != 0) return;
  if constexpr (kTile) {  // j = 32 * segment + lane
    const uint32_t gl = (threadIdx.x % 32u) / kTPG;  // group in the warp's segment
    if constexpr (UE8M0) reinterpret_cast<uint8_t*>(tile)[gl] = static_cast<uint8_t>(gs.ue8m0);
    else tile[gl] = __float_as_uint(gs.scale);
    return;
  }
  const Idx g = j / kTPG;  // group in the row
  if constexpr (UE8M0) {
    store_word_byte(p, t, g / 4, static_cast<uint32_t>(g % 4), gs.ue8m0);
  } else {
    store_fp32_scale(p, t, g, gs.scale);
  }
}

/// Quantize 16-element chunk c of the flattened problem (see stage_at).
template <int In, int G, bool UE8M0, bool kStream, bool kTopk, typename Idx>
__device__ __forceinline__ void stage_chunk(const ParamsT<Idx>& p, Idx c) {
  Idx t, j;
  row_and_chunk(p, c, t, j);
  stage_at<In, G, UE8M0, kStream, kTopk, false>(p, t, j, c < p.n_chunks, nullptr);
}

/// Tile i of the tile shape: warp w quantizes token kTileTokens * (i / segments) + w,
/// chunks 32 * (i % segments) + lane; then the block stores the tile's scales with
/// consecutive threads on consecutive tokens (UE8M0: whole words, to x_sf and the shared
/// copy). Every thread of the block must call it (barriers).
template <int In, int G, bool UE8M0, bool kStream>
__device__ __forceinline__ void stage_tile(const Params32& p, uint32_t i) {
  constexpr uint32_t kItems = UE8M0 ? 512u / (4u * G) : 512u / G;  // words or groups per segment
  constexpr uint32_t kChunksPerItem = UE8M0 ? 4u * G / kChunk : G / kChunk;
  __shared__ uint32_t tile[kTileTokens][kItems];
  const uint32_t tg = core::fastdiv(i, p.seg_div), seg = i - tg * p.seg_div.divisor;
  const uint32_t warp = threadIdx.x / 32u, t = tg * kTileTokens + warp, j = seg * 32u + threadIdx.x % 32u;
  stage_at<In, G, UE8M0, kStream, false, true>(p, t, j, t < p.T && j < p.cpr, tile[warp]);
  __syncthreads();
  if (threadIdx.x < kTileTokens * kItems) {
    const uint32_t k = threadIdx.x % kTileTokens, item = threadIdx.x / kTileTokens;
    const uint32_t tt = tg * kTileTokens + k, g = seg * kItems + item;  // word (UE8M0) or group
    if (tt < p.T && g * kChunksPerItem < p.cpr) {
      if constexpr (UE8M0) store_word(p, tt, g, tile[k][item]);
      else store_fp32_scale(p, tt, g, __uint_as_float(tile[k][item]));
    }
  }
  if (i + p.quant_blocks < p.n_tiles) __syncthreads();  // (block-uniform) the tile is free for the next one
}

/// The fast kernel: G in {32, 128}, rows contiguous and 16-byte aligned in and out.
template <int In, int G, bool UE8M0, Mode kMode, Shape kShape>
__global__ void __launch_bounds__(256, In == kInF32 ? 6 : kFastBlocksPerSm16)
    stage_fast_kernel(const ParamsT<IdxOf<kMode>> p) {
  using Idx = IdxOf<kMode>;
  static_assert(kShape == Shape::kLoop || sizeof(Idx) == 4, "one-pass shapes use 32-bit indices");
  constexpr bool kStream = kMode != Mode::kIdx32;
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  if constexpr (kShape == Shape::kLoop) {
    // 32-bit modes: the host checked n + gridDim.x * blockDim.x < 2^32 (no wrap-around).
    for (Idx base = static_cast<Idx>(blockIdx.x) * blockDim.x; base < p.n_chunks;
         base += static_cast<Idx>(gridDim.x) * blockDim.x) {
      stage_chunk<In, G, UE8M0, kStream, true>(p, base + threadIdx.x);
    }
  } else {
    if (blockIdx.x >= p.quant_blocks) {  // block-uniform: a top-k block
      const Idx e = (blockIdx.x - p.quant_blocks) * blockDim.x + threadIdx.x;
      if (e >= p.n_topk) return;
      const Idx t = core::fastdiv(e, p.k_div);
      repack_entry(p, t, e - t * p.K);
      return;
    }
    if constexpr (kShape == Shape::kTile) {
      for (uint32_t i = blockIdx.x; i < p.n_tiles; i += p.quant_blocks) stage_tile<In, G, UE8M0, kStream>(p, i);
    } else {
      stage_chunk<In, G, UE8M0, kStream, false>(p, blockIdx.x * blockDim.x + threadIdx.x);
    }
  }
}

// ---------------------------------------------------------------------------------------
// General path: any G, any strides, any alignment.
template <int In, bool UE8M0>
__global__ void __launch_bounds__(256) stage_generic_kernel(const Params64 p) {
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
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
        store_fp32_scale<int64_t>(p, t, j, gs.scale);
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
std::atomic<int> g_max_waves{0}, g_streaming{-1}, g_block_threads{0}, g_shape{-1};
Tuning tuning() {
  return Tuning{g_max_waves.load(), g_streaming.load(), g_block_threads.load(), g_shape.load()};
}

/// Token tiles (Shape::kTile) pay for their barrier and shared-memory pass only where scale
/// stores are scattered: an MN-major x_sf or shared_x_sf (consecutive tokens adjacent),
/// from 2^18 chunks (T >= 1024 at H = 4096, >= 586 at 7168). Measured (bench_kernel
/// scale_layouts at e429493, H200): at T = 1024-16384 tiles are 2-12% faster for MN-major
/// x_sf and transposed shared_x_sf (one exception: 4096 x 7168 with bm = 64, +1.2%); up to
/// 23% slower at T <= 256 and 0.4-23% slower with row-major scales.
constexpr int64_t kTileFrom = int64_t{1} << 18;
bool mn_major_scales(const StageArgs& a) {
  auto mn = [](const TensorRef& t) { return t.shape[0] > 1 && t.shape[1] > 1 && t.strides[0] < t.strides[1]; };
  return mn(a.x_sf) || (a.shared_x_sf && mn(*a.shared_x_sf));
}

/// Threads per block of the fast kernel: 128 up to T = 256 at H = 7168 (measured 1-2%
/// faster than 64 at T = 1..8 and than 256 at T = 256, bench_kernel tune_block at 61f4f5a),
/// 256 beyond (the blocks-per-SM limit then caps residency).
int block_threads_for(int64_t chunks, int device) {
  return chunks <= int64_t{1024} * sm_count(device) ? 128 : 256;
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

/// Blocks for a grid-stride kernel: enough resident blocks to cover the chip several
/// times (the kernel loops beyond), never more than kMaxGridThreads threads.
int64_t capped_blocks(int64_t work_items, int threads, int device) {
  const Tuning tn = tuning();
  const int64_t waves = tn.max_waves > 0 ? tn.max_waves : kDefaultMaxWaves;
  const int64_t max_blocks = static_cast<int64_t>(sm_count(device)) * 8 * waves * (256 / threads);
  return std::max<int64_t>(
      1, std::min({(work_items + threads - 1) / threads, max_blocks, kMaxGridThreads / threads}));
}

template <typename Kernel, typename P>
void launch(Kernel kernel, const P& prm, int64_t blocks, int threads, cudaStream_t stream, bool pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, prm), "cudaLaunchKernelEx(staging)");
}

/// The kernel parameters in index type Idx. For uint32_t, fits_idx32 has checked that every
/// offset, hence every stride of a dimension longer than 1, fits; strides of length-1
/// dimensions only ever multiply 0, so their truncation is harmless.
template <typename Idx>
ParamsT<Idx> make_params(const StageArgs& a, const detail::Problem& p) {
  auto I = [](int64_t v) { return static_cast<Idx>(v); };
  auto fastdiv_of = [](int64_t d) {  // used in the 32-bit modes only, where d fits
    return core::make_fastdiv(static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(d, 0xFFFFFFFF))));
  };
  ParamsT<Idx> prm = {};
  prm.hs = a.hidden_states.data;
  prm.hs_s0 = I(a.hidden_states.strides[0]);
  prm.hs_s1 = I(a.hidden_states.strides[1]);
  prm.ids = a.topk_ids.data;
  prm.ids_s0 = I(a.topk_ids.strides[0]);
  prm.ids_s1 = I(a.topk_ids.strides[1]);
  prm.w = a.topk_weights.data;
  prm.w_s0 = I(a.topk_weights.strides[0]);
  prm.w_s1 = I(a.topk_weights.strides[1]);
  if (a.is_padding) {
    prm.pad = static_cast<const uint8_t*>(a.is_padding->data);
    prm.pad_s0 = I(a.is_padding->strides[0]);
  }
  prm.xq = static_cast<uint8_t*>(a.x_q.data);
  prm.xq_s0 = I(a.x_q.strides[0]);
  prm.xq_s1 = I(a.x_q.strides[1]);
  prm.sf = a.x_sf.data;
  prm.sf_s0 = I(a.x_sf.strides[0]);
  prm.sf_s1 = I(a.x_sf.strides[1]);
  if (a.shared_x_sf) {
    prm.shared_sf = static_cast<uint32_t*>(a.shared_x_sf->data);
    prm.sh_s0 = I(a.shared_x_sf->strides[0]);
    prm.sh_s1 = I(a.shared_x_sf->strides[1]);
    prm.shared_bm = I(p.shared_bm);
    prm.abm = I(core::aligned_block_m(p.shared_bm));
    prm.bm_div = fastdiv_of(p.shared_bm);
  }
  prm.idx_out = static_cast<int64_t*>(a.topk_idx_out.data);
  prm.io_s0 = I(a.topk_idx_out.strides[0]);
  prm.io_s1 = I(a.topk_idx_out.strides[1]);
  prm.w_out = static_cast<float*>(a.topk_weights_out.data);
  prm.wo_s0 = I(a.topk_weights_out.strides[0]);
  prm.wo_s1 = I(a.topk_weights_out.strides[1]);
  prm.T = I(p.T);
  prm.H = I(p.H);
  prm.K = I(p.K);
  prm.G = I(p.G);
  prm.n_topk = I(p.T * p.K);
  prm.k_div = fastdiv_of(p.K);
  prm.cpr = I(p.H / kChunk);
  prm.n_chunks = I(p.T * (p.H / kChunk));
  prm.cpr_div = fastdiv_of(p.H / kChunk);
  prm.flags = (a.enable_pdl ? kFlagPdl : 0u) |  // griddepcontrol only when launched with PDL
              (a.topk_ids.dtype == DType::kInt64 ? kFlagIdsI64 : 0u) |
              (a.topk_weights.dtype == DType::kBFloat16 ? kFlagWBF16 : 0u) |
              (a.topk_weights.dtype == DType::kFloat16 ? kFlagWF16 : 0u);
  return prm;
}

template <int In, int G, bool UE8M0, Mode kMode>
void launch_shape(Params32& p, Shape shape, int threads, int64_t loop_blocks, int device, cudaStream_t stream,
                  bool pdl) {
  if (shape == Shape::kLoop) {
    return launch(stage_fast_kernel<In, G, UE8M0, kMode, Shape::kLoop>, p, loop_blocks, threads, stream, pdl);
  }
  if (shape == Shape::kTile) {
    const int64_t segs = (static_cast<int64_t>(p.cpr) + 31) / 32;
    const int64_t tiles = (static_cast<int64_t>(p.T) + kTileTokens - 1) / kTileTokens * segs;
    const int64_t quant_blocks = capped_blocks(tiles * kTileThreads, kTileThreads, device);
    const int64_t topk_blocks = (static_cast<int64_t>(p.n_topk) + kTileThreads - 1) / kTileThreads;
    p.n_tiles = static_cast<uint32_t>(tiles);
    p.seg_div = core::make_fastdiv(static_cast<uint32_t>(segs));
    p.quant_blocks = static_cast<uint32_t>(quant_blocks);
    return launch(stage_fast_kernel<In, G, UE8M0, kMode, Shape::kTile>, p, quant_blocks + topk_blocks, kTileThreads,
                  stream, pdl);
  }
  const int64_t quant_blocks = (static_cast<int64_t>(p.n_chunks) + threads - 1) / threads;
  const int64_t topk_blocks = (static_cast<int64_t>(p.n_topk) + threads - 1) / threads;
  p.quant_blocks = static_cast<uint32_t>(quant_blocks);
  launch(stage_fast_kernel<In, G, UE8M0, kMode, Shape::kSplitTopk>, p, quant_blocks + topk_blocks, threads, stream, pdl);
}

template <int In, int G, bool UE8M0>
void launch_fast(const StageArgs& a, const detail::Problem& p, bool idx32, int device, cudaStream_t stream) {
  const int64_t chunks = p.T * (p.H / kChunk);
  const Tuning tn = tuning();
  const bool st = tn.streaming >= 0 ? tn.streaming != 0 : chunks >= kStreamStoresFrom;
  const int threads = tn.block_threads > 0 ? tn.block_threads : block_threads_for(chunks, device);
  const int64_t loop_blocks = capped_blocks(chunks, threads, device);
  if (!idx32) {
    return launch(stage_fast_kernel<In, G, UE8M0, Mode::kIdx64Stream, Shape::kLoop>, make_params<int64_t>(a, p),
                  loop_blocks, threads, stream, a.enable_pdl);
  }
  // Token tiles for MN-major scales from kTileFrom chunks; otherwise one pass whenever the
  // capped grid would not loop anyway.
  const bool one_pass = (chunks + threads - 1) / threads <= loop_blocks;
  const bool tiles = chunks >= kTileFrom && mn_major_scales(a);
  const Shape shape = tn.shape >= 0 ? static_cast<Shape>(tn.shape)
                      : tiles       ? Shape::kTile
                      : one_pass    ? Shape::kSplitTopk
                                    : Shape::kLoop;
  Params32 prm = make_params<uint32_t>(a, p);
  if (st) {
    return launch_shape<In, G, UE8M0, Mode::kIdx32Stream>(prm, shape, threads, loop_blocks, device, stream,
                                                           a.enable_pdl);
  }
  return launch_shape<In, G, UE8M0, Mode::kIdx32>(prm, shape, threads, loop_blocks, device, stream, a.enable_pdl);
}

template <int In>
void dispatch_in(const StageArgs& a, const detail::Problem& p, bool fast, bool idx32, int device, cudaStream_t stream) {
  if (fast) {
    if (p.G == 32) {
      if (p.ue8m0) return launch_fast<In, 32, true>(a, p, idx32, device, stream);
      return launch_fast<In, 32, false>(a, p, idx32, device, stream);
    }
    if (p.ue8m0) return launch_fast<In, 128, true>(a, p, idx32, device, stream);
    return launch_fast<In, 128, false>(a, p, idx32, device, stream);
  }
  const int64_t units = p.T * (p.H / (p.ue8m0 ? 4 * p.G : p.G));
  const int64_t blocks = capped_blocks(units, 256, device);
  const Params64 prm = make_params<int64_t>(a, p);
  if (p.ue8m0) return launch(stage_generic_kernel<In, true>, prm, blocks, 256, stream, a.enable_pdl);
  return launch(stage_generic_kernel<In, false>, prm, blocks, 256, stream, a.enable_pdl);
}

/// The fast kernel's 32-bit modes apply: no tensor reaches below its data pointer
/// (negative strides) or 2^31 elements above it, chunk indices never wrap (n_chunks plus
/// one loop grid of threads < 2^32: capped_blocks() never makes one of more than
/// kMaxGridThreads; a one-pass grid ends within a block of n_chunks), and the T * K top-k
/// entries fit 31 bits.
bool fits_idx32(const StageArgs& a, const detail::Problem& p, int64_t n_chunks) {
  for (const detail::NamedTensor& n : detail::named_tensors(a)) {
    const detail::Extent e = detail::element_extent(*n.t);
    if (e.lo < 0 || e.hi >= (int64_t{1} << 31)) return false;
  }
  return n_chunks + kMaxGridThreads < (int64_t{1} << 32) && p.T * p.K < (int64_t{1} << 31);
}

}  // namespace

void set_tuning(const Tuning& t) {
  g_max_waves.store(t.max_waves);
  g_streaming.store(t.streaming);
  g_block_threads.store(t.block_threads);
  g_shape.store(t.shape);
}

void prepare_inputs(const StageArgs& a, const detail::Problem& p, Stream stream_handle) {
  const bool fp8 = p.fmt == core::Format::kFp8Ue8m0 || p.fmt == core::Format::kFp8Fp32;
  if (!fp8 || p.floor != core::kAmaxFloor || p.has_nonfinite) {
    throw Error(ErrorCode::kUnsupported, "megamoe: hidden_quant: the CUDA backend of this build stages fp8 with the "
                                         "default amax floor and no non-finite counter, got " + to_string(p.scheme));
  }
  const bool fast = (p.G == 32 || p.G == 128) && rows_vectorizable(a.hidden_states) &&
                    rows_vectorizable(a.x_q);
  const bool idx32 = fast && fits_idx32(a, p, p.T * (p.H / kChunk));
  const int device = a.hidden_states.device.index;
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  switch (a.hidden_states.dtype) {
    case DType::kBFloat16: dispatch_in<kInBF16>(a, p, fast, idx32, device, stream); break;
    case DType::kFloat16: dispatch_in<kInF16>(a, p, fast, idx32, device, stream); break;
    default: dispatch_in<kInF32>(a, p, fast, idx32, device, stream); break;
  }
}

}  // namespace cuda
}  // namespace megamoe
