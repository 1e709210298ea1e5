// bench_kernel.cu: C++ timing of megamoe's CUDA staging from CUDA-graph replays, next to a
// device memcpy of the same byte count (the roofline) and an empty kernel, plus the PDL
// producer->staging pair. Prints one JSON object per line.
//   usage: bench_kernel [--quick | --probes (shared-copy and probe rows) | --shared (shared-copy rows)
//                        | --formats (one row per activation format and size, with its plan)
//                        | --one-format SCHEME T H [CALLS [graph]] (three calls, for ncu; a trace
//                          build's CALLS calls, a sync after each or one graph of them)]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/fastdiv.h"
#include "core/layout.h"
#include "core/numerics.h"
#include "cuda/kernels/packed_amax.cuh"
#include "formats/recipe.h"
#include "cuda/policy/plan.h"
#include "megamoe/megamoe.h"
#include "megamoe/plan.h"
#include "contract/validate.h"
#include "cuda_bench.cuh"

using namespace megamoe;
using namespace std::string_literals;

__global__ void empty_kernel() {}
__global__ void trigger_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// A stand-in for the layer before staging: rewrites the hidden states (x = x * 1).
// Like PDL-aware engine kernels, it lets its dependent launch early (the dependent still
// waits for its completion in griddepcontrol.wait before reading anything).
__global__ void producer_kernel(uint16_t* x, int64_t n) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i];
}

// Anatomy of the fast kernel at decode sizes (bf16, MXFP8, K = 8): the bare memory round
// trip the staging kernel cannot avoid (each thread loads 32 B of bf16 and stores 16 B),
// then the same work added step by step, to see where the time above it goes.
struct ProbeArgs {
  const uint4* hs;
  uint4* xq;
  uint32_t* sf;
  const int32_t* ids;
  const float* w;
  const uint8_t* pad;
  int64_t* io;
  float* wo;
  uint32_t n, cpr, K;
  megamoe::core::FastDivU32 div;
};

// The probes' quantization of 16 bf16 elements (8 packed words) with MXFP8 group parameters gs.
__device__ __forceinline__ uint4 probe_quantize(const uint32_t (&words)[8], const megamoe::core::GroupParams& gs) {
  namespace mc = megamoe::core;
  uint32_t q[4];
  for (int i = 0; i < 4; ++i) {
    auto e = [&](int k) { return megamoe::cuda::widen<megamoe::cuda::Half2Kind::kBF16>(words[k / 2], k % 2); };
    q[i] = mc::fp8x2_e4m3_from_float(mc::mul_rn(e(4 * i), gs.m), mc::mul_rn(e(4 * i + 1), gs.m)) |
           (static_cast<uint32_t>(mc::fp8x2_e4m3_from_float(mc::mul_rn(e(4 * i + 2), gs.m),
                                                             mc::mul_rn(e(4 * i + 3), gs.m))) << 16);
  }
  return make_uint4(q[0], q[1], q[2], q[3]);
}

// kStage: 0 bare round trip, 1 + index division, 2 + quantization (packed amax, shuffle,
// scale, fp8), 3 + UE8M0 word (3 shuffles, store), 4 + top-k repack, 5 = 4 with core::fastdiv.
template <int kStage>
__global__ void probe_anatomy(ProbeArgs a) {
  namespace mc = megamoe::core;
  const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = c < a.n;
  const uint32_t t = kStage == 0 ? 0u : kStage == 5 ? mc::fastdiv(c, a.div) : c / a.cpr;
  const uint32_t j = c - t * a.cpr;
  uint4 u0 = make_uint4(0, 0, 0, 0), u1 = u0;
  if (active) {
    u0 = a.hs[2 * (static_cast<uint64_t>(t) * a.cpr + j)];
    u1 = a.hs[2 * (static_cast<uint64_t>(t) * a.cpr + j) + 1];
    if (kStage >= 4 && j < a.K) {
      const uint64_t o = static_cast<uint64_t>(t) * a.K + j;
      const bool pd = a.pad[t] != 0;
      const int32_t id = a.ids[o];
      const float w = a.w[o];
      a.io[o] = pd ? -1 : id;
      a.wo[o] = pd ? 0.0f : w;
    }
  }
  if (kStage <= 1) {
    if (active) a.xq[c] = make_uint4(u0.x ^ u0.y, u0.z ^ u0.w, u1.x ^ u1.y, u1.z ^ u1.w);
    return;
  }
  const uint32_t words[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
  float amax = megamoe::cuda::abs_max_packed<megamoe::cuda::Half2Kind::kBF16>(words);
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  const mc::GroupParams gs = mc::group_params<mc::Format::kFp8Ue8m0>(amax, mc::kAmaxFloor, 0.0f);
  const uint4 q = probe_quantize(words, gs);
  uint32_t word = 0;
  if (kStage >= 3) {
    word = gs.sf << (8 * ((threadIdx.x % 8) / 2));
    for (int off = 1; off < 8; off <<= 1) word |= __shfl_xor_sync(0xFFFFFFFFu, word, off);
  }
  if (!active) return;
  a.xq[c] = q;
  if (kStage >= 3 && threadIdx.x % 8 == 0) a.sf[static_cast<uint64_t>(t) * (a.cpr / 8) + j / 8] = word;
}

// Bare round trip with more bytes per thread: each thread loads kLoads x 16 B of bf16 and
// stores kLoads x 8 B (the fp8 size), for the shape of the mid sizes (T = 256..2048).
template <int kLoads>
__global__ void probe_roundtrip(const uint4* __restrict__ in, uint2* __restrict__ out, uint32_t n16) {
  const uint32_t base = (blockIdx.x * blockDim.x + threadIdx.x) * kLoads;
  uint4 u[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) u[i] = base + i < n16 ? in[base + i] : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    if (base + i < n16) out[base + i] = make_uint2(u[i].x ^ u[i].y, u[i].z ^ u[i].w);
  }
}

// The staging kernel's round trip (32 B of bf16 in, 16 B of fp8 out per thread) with the
// loads either as the library does them (each thread's 32 contiguous bytes: a warp's load
// instruction reads 16 B of every 32 B over 1 KB) or warp-contiguous (a thread reads
// 16-byte units lane and lane + 32 of its warp's 64; stores follow the same units, 8 B
// each). Separates the load pattern from the store pattern the `roundtrip` rows mix.
template <bool kContiguous>
__global__ void probe_pattern(const uint4* __restrict__ in, uint8_t* __restrict__ out, uint32_t n16) {
  const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t u0 = kContiguous ? (c & ~31u) * 2u + lane : 2u * c;
  const uint32_t u1 = kContiguous ? u0 + 32u : u0 + 1u;
  const uint4 a = u0 < n16 ? in[u0] : make_uint4(0, 0, 0, 0);
  const uint4 b = u1 < n16 ? in[u1] : make_uint4(0, 0, 0, 0);
  const uint2 x = make_uint2(a.x ^ a.y, a.z ^ a.w), y = make_uint2(b.x ^ b.y, b.z ^ b.w);
  if constexpr (kContiguous) {
    if (u0 < n16) reinterpret_cast<uint2*>(out)[u0] = x;
    if (u1 < n16) reinterpret_cast<uint2*>(out)[u1] = y;
  } else if (u1 < n16) {
    reinterpret_cast<uint4*>(out)[c] = make_uint4(x.x, x.y, y.x, y.y);
  }
}

// The library's per-thread ownership (32 contiguous bytes in, 16 out) reached two other
// ways: (kBulk = false) each warp loads its 1 KB with warp-contiguous 16-B loads and
// transposes it through shared memory; (kBulk = true) one thread per block brings the
// block's whole slice in with one cp.async.bulk (TMA) on an mbarrier. Blocks of kThreads.
template <int kThreads, bool kBulk>
__global__ void __launch_bounds__(kThreads) probe_staged(const uint4* __restrict__ in, uint4* __restrict__ out,
                                                         uint32_t n16) {
  __shared__ __align__(128) uint4 tile[2 * kThreads];
  const uint32_t base = blockIdx.x * (2u * kThreads);  // first unit of the block
  const uint32_t c = blockIdx.x * kThreads + threadIdx.x;
  const uint32_t lane = threadIdx.x & 31u, w0 = (threadIdx.x & ~31u) * 2u;
  if constexpr (!kBulk) {
    const uint32_t u0 = base + w0 + lane, u1 = u0 + 32u;
    tile[w0 + lane] = u0 < n16 ? in[u0] : make_uint4(0, 0, 0, 0);
    tile[w0 + lane + 32] = u1 < n16 ? in[u1] : make_uint4(0, 0, 0, 0);
    __syncwarp();
  } else {
#if __CUDA_ARCH__ >= 900
    __shared__ __align__(8) uint64_t bar;
    const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    const uint32_t units = min(2u * kThreads, n16 - base);
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(units * 16u) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       static_cast<uint32_t>(__cvta_generic_to_shared(tile))),
                   "l"(in + base), "r"(units * 16u), "r"(b)
                   : "memory");
    }
    __syncthreads();
    uint32_t done = 0;
    while (!done) {
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done)
                   : "r"(b)
                   : "memory");
    }
#endif
  }
  const uint4 a = tile[2 * threadIdx.x], d = tile[2 * threadIdx.x + 1];
  if (2 * c + 1 < n16) out[c] = make_uint4(a.x ^ a.y, a.z ^ a.w, d.x ^ d.y, d.z ^ d.w);
}

// The quantizing work of the library (bf16, MXFP8: 16 elements per thread, fp8 store, UE8M0
// byte, and its shared-expert copy when shared_sf is given) with the row uniform per block: blockIdx.y is the row,
// blockIdx.x the segment of it, so no per-thread division and the row's addresses are
// block-uniform. No top-k. The question: is index math what separates the library from
// the bare round trip at T = 256?
__global__ void probe_rowblock(ProbeArgs a, uint8_t* __restrict__ shared_sf) {
  namespace mc = megamoe::core;
  const uint32_t t = blockIdx.y;
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = j < a.cpr;
  const uint4* __restrict__ row = a.hs + 2ull * t * a.cpr;
  uint4 u0 = make_uint4(0, 0, 0, 0), u1 = u0;
  if (active) {
    u0 = __ldg(row + 2 * j);
    u1 = __ldg(row + 2 * j + 1);
  }
  const uint32_t words[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
  float amax = megamoe::cuda::abs_max_packed<megamoe::cuda::Half2Kind::kBF16>(words);
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  if (!active) return;
  const mc::GroupParams gs = mc::group_params<mc::Format::kFp8Ue8m0>(amax, mc::kAmaxFloor, 0.0f);
  const uint4 q = probe_quantize(words, gs);
  a.xq[static_cast<uint64_t>(t) * a.cpr + j] = q;
  if (j % 2 != 0) return;
  const uint32_t sfw = a.cpr / 8;  // UE8M0 words per row
  reinterpret_cast<uint8_t*>(a.sf + static_cast<uint64_t>(t) * sfw)[j / 2] = static_cast<uint8_t>(gs.sf);
  if (shared_sf != nullptr) {
    shared_sf[static_cast<uint64_t>(j / 8) * (gridDim.y * 4) + t * 4 + (j / 2) % 4] = static_cast<uint8_t>(gs.sf);
  }
}

/// A staging call run through an explicit plan: the library's own, changed by `change`
/// (then its grid recomputed), so the heuristics' alternatives can be timed.
struct Planned {
  StageArgs a;
  detail::Problem p;
  cuda::Plan plan;
  void operator()(cudaStream_t s) const { cuda::launch(plan, a, p, s); }
};
Planned planned(const StageArgs& a, const std::function<void(cuda::Plan&)>& change) {
  Planned r{a, detail::validate_args(a), {}};
  const cuda::DeviceInfo dev = cuda::device_info(a.hidden_states.device.index);
  r.plan = cuda::plan(r.p, a, dev);
  if (change) {
    change(r.plan);
    cuda::fill_grid(r.plan, r.p, dev);
  }
  return r;
}
/// Plan changes of the sweeps below.
void force_tile(cuda::Plan& p) {
  p.shape = cuda::Shape::kTile;
  p.threads = cuda::kTileThreads;
}
std::function<void(cuda::Plan&)> force_threads(int threads) {
  return [=](cuda::Plan& p) { p.threads = threads; };
}
std::function<void(cuda::Plan&)> force_stores(bool evict_first) {
  return [=](cuda::Plan& p) { p.store = evict_first ? cuda::StorePolicy::kEvictFirst : cuda::StorePolicy::kDefault; };
}
std::function<void(cuda::Plan&)> force_shape(cuda::Shape shape, int threads) {
  return [=](cuda::Plan& p) {
    p.shape = shape;
    p.threads = threads;
  };
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int64_t K = 8;
  const int64_t maxT = 65536, maxH = 7168;
  void *hs, *xq, *sf, *ids, *w, *io, *wo, *pad, *cpy;
  CK(cudaMalloc(&hs, maxT * maxH * 2));
  CK(cudaMalloc(&xq, maxT * maxH));
  CK(cudaMalloc(&sf, maxT * maxH / 32 * 4));
  CK(cudaMalloc(&ids, maxT * K * 4));
  CK(cudaMalloc(&w, maxT * K * 4));
  CK(cudaMalloc(&io, maxT * K * 8));
  CK(cudaMalloc(&wo, maxT * K * 4));
  CK(cudaMalloc(&pad, maxT));
  CK(cudaMalloc(&cpy, maxT * maxH * 4));
  {  // random inputs: bf16 randn*17-ish, ids, weights, every 5th token padded
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 17.f);
    std::vector<uint16_t> h(maxT * maxH);
    for (auto& x : h) {
      float f = nd(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      x = static_cast<uint16_t>(u >> 16);
    }
    CK(cudaMemcpy(hs, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    std::vector<int32_t> id(maxT * K);
    std::vector<float> ww(maxT * K);
    std::vector<uint8_t> p(maxT);
    for (size_t i = 0; i < id.size(); ++i) id[i] = rng() % 256, ww[i] = (rng() % 1000) / 1000.f;
    for (int64_t t = 0; t < maxT; ++t) p[t] = t % 5 == 4;
    CK(cudaMemcpy(ids, id.data(), id.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, ww.data(), ww.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pad, p.data(), p.size(), cudaMemcpyHostToDevice));
  }
  const double empty_us = time_graph(s, [&] { empty_kernel<<<1, 32, 0, s>>>(); }, 100, 20);
  std::printf("{\"kind\":\"empty_kernel\",\"us\":%.3f}\n", empty_us);
  std::vector<int64_t> Ts = {1, 8, 64, 256, 1024, 2048, 4096, 16384, 65536};
  if (quick) Ts = {1, 64, 1024, 4096, 16384};
  const Device d = Device::cuda(0);
  // MXFP8 and fp32-g128 both have H / 128 scale columns (int32 words or floats).
  auto make_args = [&](int64_t T, int64_t H, const QuantScheme& q) {
    StageArgs a;
    a.hidden_states = TensorRef(hs, DType::kBFloat16, {T, H}, d);
    a.topk_ids = TensorRef(ids, DType::kInt32, {T, K}, d);
    a.topk_weights = TensorRef(w, DType::kFloat32, {T, K}, d);
    a.is_padding = TensorRef(pad, DType::kBool, {T}, d);
    a.x_q = TensorRef(xq, DType::kFloat8E4M3, {T, H}, d);
    a.x_sf = TensorRef(sf, q.ue8m0() ? DType::kInt32 : DType::kFloat32, {T, H / 128}, d);
    a.topk_idx_out = TensorRef(io, DType::kInt64, {T, K}, d);
    a.topk_weights_out = TensorRef(wo, DType::kFloat32, {T, K}, d);
    a.hidden_quant = q;
    return a;
  };
  auto mxfp8_args = [&](int64_t T, int64_t H) { return make_args(T, H, QuantScheme::mxfp8()); };
  auto probe_args = [&](int64_t T) {  // anatomy probes: H = 7168 (448 chunks per row)
    return ProbeArgs{static_cast<const uint4*>(hs), static_cast<uint4*>(xq), static_cast<uint32_t*>(sf),
                     static_cast<const int32_t*>(ids), static_cast<const float*>(w), static_cast<const uint8_t*>(pad),
                     static_cast<int64_t*>(io), static_cast<float*>(wo), static_cast<uint32_t>(T * 448), 448u,
                     static_cast<uint32_t>(K), megamoe::core::make_fastdiv(448)};
  };
  if (argc > 2 && std::strcmp(argv[1], "--anatomy-one") == 0) {  // for ncu: library vs probe
    const int64_t T = std::atoll(argv[2]);
    const ProbeArgs pa = probe_args(T);
    StageArgs a = mxfp8_args(T, 7168);
    for (int i = 0; i < 3; ++i) {
      prepare_inputs(a, s);
      probe_anatomy<5><<<(pa.n + 127) / 128, 128, 0, s>>>(pa);
    }
    CK(cudaStreamSynchronize(s));
    return 0;
  }
  if (argc > 3 && std::strcmp(argv[1], "--one") == 0) {  // for ncu: a few calls of one size
    StageArgs a = mxfp8_args(std::atoll(argv[2]), std::atoll(argv[3]));
    for (int i = 0; i < 3; ++i) prepare_inputs(a, s);
    CK(cudaStreamSynchronize(s));
    return 0;
  }
  // Every activation format's arguments (library plans): outputs shaped by output_shapes,
  // NVFP4 static's device global scale, NVFP4 per-token's x_scales.
  float* gs = nullptr;
  float* xs = nullptr;
  CK(cudaMalloc(&gs, 4));
  CK(cudaMalloc(&xs, maxT * 4));
  const float gs_value = 17.0f / 2688.0f;
  CK(cudaMemcpy(gs, &gs_value, 4, cudaMemcpyHostToDevice));
  const QuantScheme formats[] = {QuantScheme::mxfp8(), QuantScheme::fp8_fp32_g128(), QuantScheme::mxfp4(),
                                 QuantScheme::mxfp4(Rounding::kNearestEven), QuantScheme::nvfp4_static(),
                                 QuantScheme::nvfp4_per_token()};
  auto format_args = [&](int64_t T, int64_t H, const QuantScheme& q) {
    const OutputShapes sh = output_shapes(T, H, K, q);
    StageArgs a = make_args(T, H, q);
    a.x_q = TensorRef(xq, sh.x_q.dtype, {T, sh.x_q.shape[1]}, d);
    a.x_sf = TensorRef(sf, sh.x_sf.dtype, {T, sh.x_sf.shape[1]}, d);
    if (sh.global_scale) a.global_scale = TensorRef(gs, DType::kFloat32, {1}, d);
    if (sh.x_scales) a.x_scales = TensorRef(xs, DType::kFloat32, {T}, d);
    return a;
  };
  if (argc > 4 && std::strcmp(argv[1], "--one-format") == 0) {  // for ncu: SCHEME T H (bf16 input)
    const QuantScheme* q = nullptr;
    for (const QuantScheme& c : formats) {
      if (scheme_name(c) == argv[2]) q = &c;
    }
    if (q == nullptr) return std::fprintf(stderr, "unknown scheme %s\n", argv[2]), 2;
    const StageArgs a = format_args(std::atoll(argv[3]), std::atoll(argv[4]), *q);
    std::printf("%s\n", explain(a).c_str());
    // [CALLS [graph]]: CALLS calls, each followed by a synchronization, or captured into one
    // CUDA graph replayed once, back to back as the benchmarks time them (a trace build,
    // scripts/device.sh trace: its device printf buffer holds ~1 MB of lines a sync).
    const int calls = argc > 5 ? std::atoi(argv[5]) : 3;
    if (argc > 6 && std::strcmp(argv[6], "graph") == 0) {
      prepare_inputs(a, s);
      CK(cudaStreamSynchronize(s));
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < calls; ++i) prepare_inputs(a, s);
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
      return 0;
    }
    for (int i = 0; i < calls; ++i) {
      prepare_inputs(a, s);
      CK(cudaStreamSynchronize(s));
    }
    return 0;
  }
  const bool probes_only = argc > 1 && std::strcmp(argv[1], "--probes") == 0;
  // Every activation format (library plans), H = 7168, next to MXFP8: time and plan text.
  const bool shared_only = argc > 1 && std::strcmp(argv[1], "--shared") == 0;
  if (!probes_only && !shared_only) {
    for (const QuantScheme& q : formats) {
      for (int64_t T : {int64_t{1}, int64_t{64}, int64_t{1024}, int64_t{16384}}) {
        const int64_t H = 7168;
        const OutputShapes sh = output_shapes(T, H, K, q);
        const StageArgs a = format_args(T, H, q);
        const double us = time_graph(s, [&] { prepare_inputs(a, s); }, T >= 16384 ? 5 : 20, T >= 16384 ? 10 : 30);
        const double bytes = T * H * 2.0 + sh.x_q.numel() + sh.x_sf.numel() * 4.0 + T * K * 20.0 + T;
        std::printf("{\"kind\":\"formats\",\"scheme\":\"%s\",\"T\":%lld,\"H\":%lld,\"us\":%.3f,\"TBps\":%.3f,"
                    "\"plan\":\"%s\"}\n",
                    scheme_name(q).c_str(), (long long)T, (long long)H, us, bytes / us * 1e-6, explain(a).c_str());
        std::fflush(stdout);
      }
    }
  }
  if (argc > 1 && std::strcmp(argv[1], "--formats") == 0) return 0;
  // Scale layouts, each with the heuristic's shape ("..._d") and token tiles forced ("..._tile"):
  // no shared copy; the MXFP8 shared-expert copy into a transposed (MN-major) view of an
  // [H/128, R] buffer (bm 128 and 64) and into a row-major [R, H/128] tensor; MN-major x_sf
  // (DeepGEMM's SM90 layout, g * align(T, 4) + t) for MXFP8 words and fp32-g128 scales.
  for (int64_t H : {int64_t{7168}, int64_t{4096}}) {
    for (int64_t T : {int64_t{1}, int64_t{64}, int64_t{256}, int64_t{1024}, int64_t{4096}, int64_t{16384}}) {
      const int calls = T >= 16384 ? 5 : 20;
      const int64_t W = H / 128, Ta = (T + 3) / 4 * 4;
      std::string row;
      auto both = [&](const std::string& name, const StageArgs& a) {
        for (bool tile : {false, true}) {
          const Planned call = planned(a, tile ? force_tile : std::function<void(cuda::Plan&)>{});
          const double us = time_graph(s, [&] { call(s); }, calls, 20);
          row += ",\"" + name + (tile ? "_tile" : "_d") + "\":" + std::to_string(us);
        }
      };
      StageArgs a = mxfp8_args(T, H);
      both("none", a);
      for (int64_t bm : {int64_t{128}, int64_t{64}}) {
        const int64_t R = megamoe::output_shapes(T, H, 8, megamoe::QuantScheme::mxfp8(), bm).shared_x_sf->shape[0];
        a.shared_block_m = bm;
        a.shared_x_sf = TensorRef(cpy, DType::kInt32, {R, W}, {1, R}, d);
        both("shared_tr_bm" + std::to_string(bm), a);
        if (bm == 128) {
          a.shared_x_sf = TensorRef(cpy, DType::kInt32, {R, W}, d);
          both("shared_rm_bm128", a);
        }
      }
      StageArgs m = mxfp8_args(T, H);
      m.x_sf = TensorRef(sf, DType::kInt32, {T, W}, {1, Ta}, d);
      both("mxfp8_sf_mn", m);
      StageArgs f = make_args(T, H, QuantScheme::fp8_fp32_g128());
      f.x_sf = TensorRef(sf, DType::kFloat32, {T, W}, {1, Ta}, d);
      both("fp32_sf_mn", f);
      std::printf("{\"kind\":\"scale_layouts\",\"T\":%lld,\"H\":%lld%s}\n", (long long)T, (long long)H, row.c_str());
      std::fflush(stdout);
    }
  }
  if (argc > 1 && std::strcmp(argv[1], "--shared") == 0) return 0;
  if (!probes_only) {
    for (int64_t H : {int64_t{7168}, int64_t{4096}}) {
      for (int sch = 0; sch < 2; ++sch) {
        const QuantScheme q = sch == 0 ? QuantScheme::mxfp8() : QuantScheme::fp8_fp32_g128();
        for (int64_t T : Ts) {
          StageArgs a = make_args(T, H, q);
          const int64_t sfc = H / 128;
          const double bytes = T * H * 2.0 + T * H + T * sfc * 4.0 + T * K * (4 + 4 + 8 + 4) + T;
          const int calls = T >= 16384 ? 5 : 20;
          const int reps = T >= 16384 ? 10 : 30;
          const double us = time_graph(s, [&] { prepare_inputs(a, s); }, calls, reps);
          const size_t half = static_cast<size_t>(bytes / 2);
          const double mc = time_graph(
              s, [&] { CK(cudaMemcpyAsync(cpy, static_cast<char*>(cpy) + (maxT * maxH * 2), half, cudaMemcpyDeviceToDevice, s)); },
              calls, reps);
          // PDL pair: producer (rewrites hidden) then staging, with and without PDL.
          const int64_t n = T * H;
          auto pair = [&](bool pdl) {
            a.enable_pdl = pdl;
            return time_graph(s, [&] {
              producer_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(static_cast<uint16_t*>(hs), n);
              prepare_inputs(a, s);
            }, calls, reps);
          };
          const double pair_off = pair(false), pair_on = pair(true);
          a.enable_pdl = false;
          std::printf("{\"kind\":\"stage\",\"scheme\":\"%s\",\"T\":%lld,\"H\":%lld,\"bytes\":%.0f,\"us\":%.3f,"
                      "\"TBps\":%.3f,\"memcpy_us\":%.3f,\"memcpy_TBps\":%.3f,\"frac_memcpy\":%.3f,"
                      "\"pair_us\":%.3f,\"pair_pdl_us\":%.3f}\n",
                      sch == 0 ? "mxfp8" : "fp32_g128", (long long)T, (long long)H, bytes, us,
                      bytes / us * 1e-6, mc, bytes / mc * 1e-6, mc / us, pair_off, pair_on);
          std::fflush(stdout);
        }
      }
    }
    // Launch-heuristic sweeps: block size at decode sizes; evict-first stores at prefill.
    for (int64_t H : {int64_t{7168}, int64_t{4096}}) {
      for (int64_t T : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{256}}) {
        StageArgs a = mxfp8_args(T, H);
        for (int bs : {64, 128, 256}) {
          const Planned call = planned(a, force_threads(bs));
          const double us = time_graph(s, [&] { call(s); }, 20, 30);
          std::printf("{\"kind\":\"tune_block\",\"T\":%lld,\"H\":%lld,\"threads\":%d,\"us\":%.3f}\n",
                      (long long)T, (long long)H, bs, us);
        }
      }
      for (int64_t T : {int64_t{256}, int64_t{1024}, int64_t{2048}, int64_t{4096}, int64_t{16384}, int64_t{65536}}) {
        StageArgs a = mxfp8_args(T, H);
        const double bytes = T * H * 3.0 + T * H / 128 * 4.0 + T * K * 20.0 + T;
        const int calls = T >= 16384 ? 5 : 20;
        for (int st : {0, 1}) {
          const Planned call = planned(a, force_stores(st == 1));
          const double us = time_graph(s, [&] { call(s); }, calls, 15);
          std::printf("{\"kind\":\"tune_stores\",\"T\":%lld,\"H\":%lld,\"streaming\":%d,\"us\":%.3f,\"TBps\":%.3f}\n",
                      (long long)T, (long long)H, st, us, bytes / us * 1e-6);
        }
      }
    }
    // Fast-kernel shapes (32-bit modes), same process: 0 grid-stride loop, 1 one pass with
    // top-k blocks of their own; 128- and 256-thread blocks.
    for (int64_t H : {int64_t{7168}, int64_t{4096}}) {
      for (int sch = 0; sch < 2; ++sch) {
        const QuantScheme q = sch == 0 ? QuantScheme::mxfp8() : QuantScheme::fp8_fp32_g128();
        for (int64_t T : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{256}, int64_t{1024}, int64_t{2048}, int64_t{4096},
                          int64_t{16384}}) {
          StageArgs a = make_args(T, H, q);
          std::string row;
          for (int shape : {0, 1}) {
            for (int threads : {128, 256}) {
              const Planned call = planned(a, force_shape(shape == 0 ? cuda::Shape::kLoop : cuda::Shape::kSplitTopk, threads));
              const double us = time_graph(s, [&] { call(s); }, T >= 16384 ? 5 : 20, 30);
              row += ",\"s" + std::to_string(shape) + "t" + std::to_string(threads) + "\":" + std::to_string(us);
            }
          }
          const double dflt = time_graph(s, [&] { prepare_inputs(a, s); }, 20, 30);
          std::printf("{\"kind\":\"tune_shape\",\"scheme\":\"%s\",\"T\":%lld,\"H\":%lld,\"default\":%.3f%s}\n",
                      sch == 0 ? "mxfp8" : "fp32_g128", (long long)T, (long long)H, dflt, row.c_str());
          std::fflush(stdout);
        }
      }
    }
  }  // !probes_only
  // Bare round trips with 1, 2, 4, 8 x 16 B loaded per thread and 64..512-thread blocks.
  for (int64_t T : {int64_t{64}, int64_t{256}, int64_t{1024}}) {
    const uint32_t n16 = static_cast<uint32_t>(T * 7168 * 2 / 16);
    std::string row;
    auto one = [&](auto kl, int threads) {
      constexpr int L = decltype(kl)::value;
      const unsigned blocks = (n16 / L + threads - 1) / threads;
      const double us = time_graph(s, [&] {
        probe_roundtrip<L><<<blocks, threads, 0, s>>>(static_cast<const uint4*>(hs), static_cast<uint2*>(xq), n16);
      }, 20, 30);
      row += ",\"l" + std::to_string(L) + "t" + std::to_string(threads) + "\":" + std::to_string(us);
    };
    for (int threads : {64, 128, 256, 512}) {
      one(std::integral_constant<int, 1>{}, threads);
      one(std::integral_constant<int, 2>{}, threads);
      one(std::integral_constant<int, 4>{}, threads);
      one(std::integral_constant<int, 8>{}, threads);
    }
    std::printf("{\"kind\":\"roundtrip\",\"T\":%lld,\"H\":7168%s}\n", (long long)T, row.c_str());
    std::fflush(stdout);
  }
  // Load pattern at equal stores and block sizes (see probe_pattern).
  for (int64_t T : {int64_t{64}, int64_t{256}, int64_t{1024}}) {
    const uint32_t n16 = static_cast<uint32_t>(T * 7168 * 2 / 16);
    std::string row;
    for (int threads : {128, 256, 512, 1024}) {
      const unsigned blocks = (n16 / 2 + threads - 1) / threads;
      const double lib = time_graph(s, [&] {
        probe_pattern<false><<<blocks, threads, 0, s>>>(static_cast<const uint4*>(hs), static_cast<uint8_t*>(xq), n16);
      }, 20, 30);
      const double contig = time_graph(s, [&] {
        probe_pattern<true><<<blocks, threads, 0, s>>>(static_cast<const uint4*>(hs), static_cast<uint8_t*>(xq), n16);
      }, 20, 30);
      row += ",\"library_t" + std::to_string(threads) + "\":" + std::to_string(lib) + ",\"contiguous_t" +
             std::to_string(threads) + "\":" + std::to_string(contig);
    }
    std::printf("{\"kind\":\"load_pattern\",\"T\":%lld,\"H\":7168%s}\n", (long long)T, row.c_str());
    std::fflush(stdout);
  }
  // Library ownership through a shared-memory transpose or one bulk copy per block.
  for (int64_t T : {int64_t{64}, int64_t{256}, int64_t{1024}}) {
    const uint32_t n16 = static_cast<uint32_t>(T * 7168 * 2 / 16);
    std::string row;
    auto one = [&](auto kt, auto kb) {
      constexpr int kT = decltype(kt)::value;
      constexpr bool kB = decltype(kb)::value;
      const unsigned blocks = (n16 / 2 + kT - 1) / kT;
      const double us = time_graph(s, [&] {
        probe_staged<kT, kB><<<blocks, kT, 0, s>>>(static_cast<const uint4*>(hs), static_cast<uint4*>(xq), n16);
      }, 20, 30);
      row += std::string(",\"") + (kB ? "bulk" : "smem") + "_t" + std::to_string(kT) + "\":" + std::to_string(us);
    };
    using std::integral_constant;
    one(integral_constant<int, 128>{}, std::false_type{});
    one(integral_constant<int, 256>{}, std::false_type{});
    one(integral_constant<int, 512>{}, std::false_type{});
    one(integral_constant<int, 128>{}, std::true_type{});
    one(integral_constant<int, 256>{}, std::true_type{});
    one(integral_constant<int, 512>{}, std::true_type{});
    std::printf("{\"kind\":\"staged_loads\",\"T\":%lld,\"H\":7168%s}\n", (long long)T, row.c_str());
    std::fflush(stdout);
  }
  // Row-uniform blocks (probe_rowblock): 1, 2 or 4 blocks per 448-chunk row.
  for (int64_t T : {int64_t{64}, int64_t{256}, int64_t{1024}}) {
    const ProbeArgs pa = probe_args(T);
    std::string row;
    // As the library is timed here: no shared-expert copy (and, once, with it).
    for (int per_row : {1, 2, 4}) {
      const int threads = (448 / per_row + 31) / 32 * 32;
      const double us = time_graph(s, [&] {
        probe_rowblock<<<dim3(per_row, static_cast<unsigned>(T)), threads, 0, s>>>(pa, nullptr);
      }, 20, 30);
      row += ",\"per_row" + std::to_string(per_row) + "_t" + std::to_string(threads) + "\":" + std::to_string(us);
    }
    const double with_shared = time_graph(s, [&] {
      probe_rowblock<<<dim3(4, static_cast<unsigned>(T)), 128, 0, s>>>(pa, static_cast<uint8_t*>(cpy));
    }, 20, 30);
    row += ",\"per_row4_t128_shared\":" + std::to_string(with_shared);
    StageArgs a = mxfp8_args(T, 7168);
    const double lib = time_graph(s, [&] { prepare_inputs(a, s); }, 20, 30);
    std::printf("{\"kind\":\"rowblock\",\"T\":%lld,\"H\":7168,\"library\":%.3f%s}\n", (long long)T, lib, row.c_str());
    std::fflush(stdout);
  }
  // Kernel anatomy at decode sizes (128-thread blocks, H = 7168).
  for (int64_t T : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{256}}) {
    const ProbeArgs pa = probe_args(T);
    const unsigned blocks = (pa.n + 127) / 128;
    auto stage = [&](auto k) {
      return time_graph(s, [&] { probe_anatomy<decltype(k)::value><<<blocks, 128, 0, s>>>(pa); }, 20, 30);
    };
    using std::integral_constant;
    const double us[6] = {stage(integral_constant<int, 0>{}), stage(integral_constant<int, 1>{}),
                          stage(integral_constant<int, 2>{}), stage(integral_constant<int, 3>{}),
                          stage(integral_constant<int, 4>{}), stage(integral_constant<int, 5>{})};
    StageArgs a = mxfp8_args(T, 7168);
    const double st = time_graph(s, [&] { prepare_inputs(a, s); }, 20, 30);
    std::printf("{\"kind\":\"anatomy\",\"T\":%lld,\"roundtrip\":%.3f,\"div\":%.3f,\"quant\":%.3f,\"word\":%.3f,\"topk\":%.3f,"
                "\"topk_fastdiv\":%.3f,\"library\":%.3f}\n",
                (long long)T, us[0], us[1], us[2], us[3], us[4], us[5], st);
    std::fflush(stdout);
  }
  // PDL with a trivial producer (only triggers its dependents): the launch-latency part.
  for (int64_t T : {int64_t{1}, int64_t{64}, int64_t{1024}}) {
    StageArgs a = mxfp8_args(T, 7168);
    auto pair = [&](bool pdl) {
      a.enable_pdl = pdl;
      return time_graph(s, [&] {
        trigger_kernel<<<1, 32, 0, s>>>();
        prepare_inputs(a, s);
      }, 20, 30);
    };
    const double off = pair(false), on = pair(true);
    std::printf("{\"kind\":\"pdl_trivial_producer\",\"T\":%lld,\"pair_us\":%.3f,\"pair_pdl_us\":%.3f}\n",
                (long long)T, off, on);
  }
  return 0;
}
