// test_router_cuda.cu: the fused router on the GPU equals the CPU backend byte for byte
// (the CPU backend is checked against the independent reference by tests/cpp/
// test_router.cpp): every buffer of the call, elements and poisoned gaps, after an eager
// call and after CUDA-graph replays. Cases: the router catalog (tests/cpp/router_cases.h:
// planted ties, NaN / Inf, all-equal logits, a reversing bias, odd E, E = 512 / K = 16,
// hash layers, EPLB with 1..5 and 7 replica slots, recording on and off, out-of-range
// device data, padding) through route() and route_and_stage(), and route_and_stage over every format
// and kernel shape: one launch for fast plans (split, loop, tile), two for the generic and
// row kernels; full buffer, T = 0, shared_x_sf, PDL. And the device's fast score path
// against its exact chain on a sweep of the fp32 bit patterns. Every test SKIPs without a
// GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/router.h"
#include "device_mirror.h"
#include "megamoe/megamoe.h"
#include "router_cases.h"

namespace {

using namespace router_cases;  // NOLINT: the shared test vocabulary

/// The call on @p m's device buffers (device_mirror.h: eager, then graph replays).
void run_and_compare(const Mirror& m, const RouterArgs& r, const StageArgs* s) {
  const RouterArgs dr = m.map(r);
  const StageArgs ds = s != nullptr ? m.map(*s) : StageArgs{};
  router_cases::run_and_compare(m, [&](cudaStream_t stream) {
    if (s != nullptr) megamoe::route_and_stage(dr, ds, stream);
    else megamoe::route(dr, stream);
  });
}

/// route() on the GPU == on the CPU (@p skew: see Mirror).
void check_route(const Spec& spec, size_t skew = 0) {
  auto b = build(spec);
  const Mirror m(tensors_of(*b), skew);  // initial (poisoned) bytes
  megamoe::route(b->args);          // the CPU result, into the host tensors
  run_and_compare(m, b->args, nullptr);
}

/// route_and_stage() on the GPU == on the CPU.
void check_fused(Spec spec, const StageCase& c, size_t skew = 0) {
  if (c.pad && !spec.pad) {
    spec.pad = std::vector<uint8_t>(static_cast<size_t>(spec.T), 0);
    for (int64_t t = 2; t < spec.T; t += 5) (*spec.pad)[static_cast<size_t>(t)] = 1;
  }
  auto b = build(spec, /*with_pad_in_router=*/false);
  auto sb = stage_bufs(c, spec.T, spec.K, spec.pad ? &*spec.pad : nullptr);
  std::vector<Tensor*> all = tensors_of(*b);
  for (Tensor* t : tensors_of(*sb)) all.push_back(t);
  const Mirror m(all, skew);
  megamoe::route_and_stage(b->args, sb->args);
  run_and_compare(m, b->args, &sb->args);
}

/// Scores of the bit patterns i * stride (3 a thread, side by side as in the router
/// kernels: core::router_scores<3> with the IEEE forms and the exact fallback inline, as
/// router_block runs them, and branch-free with the fallback as a call, as the inlined
/// router blocks do) against
/// router_score_exact on the device; counts the differences and keeps the first, and writes
/// the scores of @p sample.
__global__ void score_sweep(uint64_t n, uint32_t stride, unsigned long long* differ, uint32_t* first,
                            const uint32_t* sample, uint32_t n_sample, float* sample_out) {
  const uint64_t i = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 3;
  if (i < n) {
    float x[3], s[3], sc[3];
    for (int c = 0; c < 3; ++c) {
      x[c] = megamoe::core::bits_float(static_cast<uint32_t>((i + c) * stride));
    }
    megamoe::core::router_scores<3, false>(x, s);  // as router_block runs it
    megamoe::core::router_scores<3, true, true>(x, sc);  // as the inlined router blocks run it
    for (int c = 0; c < 3; ++c) {
      const uint32_t e = megamoe::core::float_bits(megamoe::core::router_score_exact(x[c]));
      if (megamoe::core::float_bits(s[c]) != e || megamoe::core::float_bits(sc[c]) != e) {
        atomicAdd(differ, 1ull);
        atomicMin(first, megamoe::core::float_bits(x[c]));
      }
    }
  }
  const uint64_t j = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < n_sample) sample_out[j] = megamoe::core::router_score(megamoe::core::bits_float(sample[j]));
}

/// The device's fast score path (fused multiply-adds, the refined reciprocal, the exact
/// chain where it cannot decide) gives the exact chain's bits on a sweep of every 7th fp32
/// bit pattern, and the host's bits on the fallback inputs and the thresholds.
TEST(RouterCuda, ScoresOnTheDevice) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<uint32_t> sample;
  for (float x : {20.0f, -87.0f, -20.1f, 0.0f, 1.0f, -1.0f, 8.0f}) {
    for (int d = -256; d <= 256; ++d) sample.push_back(megamoe::core::float_bits(x) + static_cast<uint32_t>(d));
  }
  for (uint32_t b : kScoreFallbackLogits) sample.push_back(b);
  for (uint32_t b : {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x00000001u, 0x80000000u}) sample.push_back(b);
  const uint32_t stride = 7;
  const uint64_t n = (uint64_t{1} << 32) / stride;
  unsigned long long* differ = nullptr;
  uint32_t *first = nullptr, *dsample = nullptr;
  float* dout = nullptr;
  ASSERT_EQ(cudaMalloc(&differ, 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&first, 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dsample, sample.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, sample.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(differ, 0, 8), cudaSuccess);
  ASSERT_EQ(cudaMemset(first, 0xFF, 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dout, 0xA5, sample.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dsample, sample.data(), sample.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const uint64_t threads = (n + 2) / 3;
  score_sweep<<<static_cast<unsigned>((threads + 255) / 256), 256>>>(n, stride, differ, first, dsample,
                                                                    static_cast<uint32_t>(sample.size()), dout);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  unsigned long long nd = 0;
  uint32_t f = 0;
  std::vector<float> out(sample.size());
  ASSERT_EQ(cudaMemcpy(&nd, differ, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&f, first, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (void* p : {static_cast<void*>(differ), static_cast<void*>(first), static_cast<void*>(dsample),
                  static_cast<void*>(dout)}) {
    cudaFree(p);
  }
  EXPECT_EQ(nd, 0ull) << "first differing logit bits 0x" << std::hex << f;
  for (size_t i = 0; i < sample.size(); ++i) {
    const float want = megamoe::core::router_score_exact(megamoe::core::bits_float(sample[i]));
    ASSERT_EQ(megamoe::core::float_bits(out[i]), megamoe::core::float_bits(want)) << "logit 0x" << std::hex << sample[i];
  }
}

TEST(RouterCuda, RouteCatalog) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [name, s] : catalog(megamoe::core::router_score)) {
    SCOPED_TRACE(name);
    check_route(s);
  }
}

TEST(RouterCuda, RouteAndStageCatalog) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  StageCase c;
  c.count = true;
  for (const auto& [name, s] : catalog(megamoe::core::router_score)) {
    SCOPED_TRACE(name);
    check_fused(s, c);
  }
}

// Every tensor one byte past its allocation's start (wider elements off their size): the
// calls run on aligned copies (cuda/aligned.cuh), eagerly and under graph capture, with
// the same bytes in every buffer as the CPU backend's.
TEST(RouterCuda, ElementMisalignedTensors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  StageCase c;
  c.count = true;
  int n = 0;
  for (const auto& [name, s] : catalog(megamoe::core::router_score)) {
    if (n++ % 4 != 0) continue;  // a quarter of the catalog: EPLB, hash, padding, ties among them
    SCOPED_TRACE(name);
    check_route(s, 1);
    check_fused(s, c, 1);
    if (HasFailure()) return;
  }
}

TEST(RouterCuda, EveryFormat) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (QuantScheme q : {QuantScheme::mxfp8(), QuantScheme::fp8_ue8m0_g128(), QuantScheme::fp8_fp32_g128(),
                        QuantScheme::fp8_fp32_g32(), QuantScheme::mxfp4(),
                        QuantScheme::mxfp4(megamoe::Rounding::kNearestEven), QuantScheme::nvfp4_static(),
                        QuantScheme::nvfp4_per_token()}) {
    for (DType hdt : {DType::kBFloat16, DType::kFloat32}) {
      StageCase c;
      c.scheme = q;
      c.hidden_dt = hdt;
      c.count = true;
      SCOPED_TRACE(megamoe::to_string(q) + " " + megamoe::dtype_name(hdt));
      check_fused(random_spec(37, 384, 6, 41), c);
    }
  }
}

TEST(RouterCuda, KernelShapesAndLayouts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  StageCase generic;  // unaligned hidden rows: the generic kernel, two launches
  generic.strided_hidden = true;
  check_fused(random_spec(33, 256, 8, 42), generic);
  StageCase tile;  // MN-major x_sf from 2^18 chunks: the tile shape
  tile.H = 7168;
  tile.mn_major_sf = true;
  tile.scheme = QuantScheme::fp8_fp32_g128();
  check_fused(random_spec(600, 384, 6, 43), tile);
  StageCase split;  // a split-topk grid larger than the decode variant's one wave
  split.H = 4096;
  check_fused(random_spec(700, 256, 6, 49), split);
  // The decode variant over two waves: its 500 router blocks fit one (fused_decode_variant),
  // the 500 quantizing blocks after them do not.
  check_fused(random_spec(500, 256, 6, 50), split);
  StageCase loop;  // beyond one pass of the capped grid: the loop shape
  loop.H = 7168;
  check_fused(random_spec(12000, 256, 8, 44), loop);
  StageCase shared;  // shared-expert scales, a long full-buffer tail, PDL
  shared.H = 4096;
  shared.shared_bm = 64;
  shared.M = 9000;
  shared.pdl = true;
  check_fused(random_spec(5, 256, 6, 45), shared);
  check_fused(hash_spec(46), shared);
  Spec e = eplb_spec(47, 3);
  e.ids_dt = DType::kInt64;
  check_fused(e, shared);
}

TEST(RouterCuda, ZeroTokensFillTheTail) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  StageCase c;
  c.M = 3000;
  c.pad = false;
  check_fused(random_spec(0, 256, 6, 48), c);
}

// H == 0: the router alone stages the top-k (route_and_stage), the routing-only kernel
// (prepare_inputs), where the quantizing kernels' top-k repack would run zero times.
TEST(RouterCuda, EmptyHiddenRows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [s, c] : empty_hidden_cases()) check_fused(s, c);
  for (int64_t M : {0, 20}) {
    StageCase p;
    p.H = 0;
    p.M = M;
    const std::vector<uint8_t> pad = {0, 1, 0, 0, 1, 0, 0, 0, 1};
    auto sb = stage_bufs(p, 9, 6, &pad);
    Tensor ids(DType::kInt32, {9, 6}), ws(DType::kFloat32, {9, 6});
    for (int64_t i = 0; i < 54; ++i) {
      ids.as<int32_t>()[i] = static_cast<int32_t>(i * 7 % 256);
      ws.as<float>()[i] = 0.25f + static_cast<float>(i);
    }
    sb->args.topk_ids = ids.ref;
    sb->args.topk_weights = ws.ref;
    sb->args.routed_scaling_factor = 1.5f;
    std::vector<Tensor*> all = tensors_of(*sb);
    all.push_back(&ids);
    all.push_back(&ws);
    const Mirror m(all);
    megamoe::prepare_inputs(sb->args);  // the CPU result, into the host tensors
    StageArgs d = m.map(sb->args);
    d.topk_ids = m.map(sb->args.topk_ids);
    d.topk_weights = m.map(sb->args.topk_weights);
    m.reset();
    megamoe::prepare_inputs(d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    m.expect_equal_to_host("prepare_inputs, M = " + std::to_string(M));
  }
}

TEST(RouterCuda, PdlRoute) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Spec s = random_spec(3, 384, 6, 49);
  auto b = build(s);
  b->args.enable_pdl = true;
  const Mirror m(tensors_of(*b));
  megamoe::route(b->args);
  run_and_compare(m, b->args, nullptr);
}

}  // namespace
