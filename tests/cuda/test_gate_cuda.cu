// test_gate_cuda.cu: gate_route_and_stage / gate_and_route on the GPU equal the CPU backend
// byte for byte (the CPU backend is checked against the independent gate and router
// references by tests/cpp/test_gate.cpp): every buffer of the call (logits_out, the
// router's ids and weights, the EPLB load, the non-finite counters, every staged buffer;
// elements and poisoned gaps), after an eager call and after CUDA-graph replays (each from
// the poisoned bytes; PDL on in most cases). Cases: T in {1, 4, 16, 64, 100} (100: two gate
// launches) x E in {64, 144, 256, 384, 512}, H in {2048, 4096, 7168, 200} and odd widths
// (short last chunks, trees of 1 to 64 chunks, one to 16 shares), K in {1, 6, 8, 16}, bf16
// and fp32 weights, strided and column-major y / weight / logits_out, no logits_out, hash
// layers, EPLB, padding, full buffer, NaN / Inf in y and in the weight, y as the hidden
// states, tensors off their element size, T == 0, explain(). Every test SKIPs without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device_mirror.h"
#include "gate_cases.h"
#include "megamoe/megamoe.h"
#include "router_cases.h"

namespace {

using namespace router_cases;  // NOLINT: the shared test vocabulary
using megamoe::GateArgs;

/// One call: the gate's problem, the router's options (its logits unused), the staging
/// (absent: gate_and_route), PDL, and the skew of every device copy (1: every tensor of
/// wider elements off its element size: the call runs on aligned copies).
struct GpuCase {
  GateCase g;
  Spec s;
  std::optional<StageCase> stage;
  bool pdl = true;
  size_t skew = 0;
};

std::string tag(const GpuCase& k) {
  const GateCase& c = k.g;
  return "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " H=" + std::to_string(c.H) + " K=" +
         std::to_string(c.K) + (c.w_f32 ? " w=fp32" : " w=bf16") + " layouts y" + std::to_string(c.y_layout) + " w" +
         std::to_string(c.w_layout) + " l" + std::to_string(c.l_layout) +
         (k.stage ? " fused " + megamoe::to_string(k.stage->scheme) : " gate_and_route") +
         (k.s.tid2eid ? " hash" : "") + (k.s.l2p ? " eplb" : "") + (k.s.pad ? " pad" : "") +
         (k.pdl ? " pdl" : "") + " skew=" + std::to_string(k.skew);
}

/// The call on the host tensors (the CPU backend), then on their device copies: every
/// byte equal. @p given: y and the weight when the test planted values in them.
void check(GpuCase k, GateBufs* given = nullptr) {
  SCOPED_TRACE(tag(k));
  const GateCase& c = k.g;
  std::unique_ptr<GateBufs> own;
  GateBufs* g = given;
  if (g == nullptr) {
    own = gate_bufs(c);
    g = own.get();
  }
  const bool fused = k.stage.has_value();
  if (fused && k.stage->pad && !k.s.pad) {
    k.s.pad = std::vector<uint8_t>(static_cast<size_t>(c.T), 0);
    for (int64_t t = 2; t < c.T; t += 5) (*k.s.pad)[static_cast<size_t>(t)] = 1;
  }
  k.s.T = c.T;
  k.s.E = c.E;
  k.s.K = c.K;
  if (static_cast<int64_t>(k.s.logits.size()) != c.T * c.E) k.s.logits.assign(static_cast<size_t>(c.T * c.E), 0.0f);
  auto rb = build(k.s, /*with_pad_in_router=*/!fused);
  rb->args.router_logits = TensorRef();
  std::unique_ptr<StageBufs> sb;
  if (fused) sb = stage_bufs(*k.stage, c.T, c.K, k.s.pad ? &*k.s.pad : nullptr);
  std::vector<Tensor*> all = tensors_of(*rb);
  for (Tensor* t : {&g->y, &g->w, &g->logits}) all.push_back(t);
  if (fused) {
    for (Tensor* t : tensors_of(*sb)) all.push_back(t);
  }
  const Mirror m(all, k.skew);  // the initial (poisoned) bytes
  if (fused) megamoe::gate_route_and_stage(g->args, rb->args, sb->args);
  else megamoe::gate_and_route(g->args, rb->args);
  const GateArgs dg = m.map(g->args);
  RouterArgs dr = m.map(rb->args);
  StageArgs ds = fused ? m.map(sb->args) : StageArgs{};
  dr.enable_pdl = k.pdl;
  ds.enable_pdl = k.pdl;
  router_cases::run_and_compare(m, [&](cudaStream_t stream) {
    if (fused) megamoe::gate_route_and_stage(dg, dr, ds, stream);
    else megamoe::gate_and_route(dg, dr, stream);
  });
}

const QuantScheme kSchemes[] = {QuantScheme::mxfp8(), QuantScheme::fp8_ue8m0_g128(), QuantScheme::mxfp4(),
                                QuantScheme::nvfp4_per_token()};

TEST(CudaGate, EveryShapeEqualsTheCpuBackend) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t Ts[] = {1, 4, 16, 64, 100};
  const int64_t Es[] = {64, 144, 256, 384, 512};
  const int64_t Hs[] = {2048, 4096, 7168, 200};
  const int64_t Ks[] = {1, 6, 8};
  int i = 0;
  for (int64_t T : Ts) {
    for (int64_t E : Es) {
      GpuCase k;
      k.g.T = T;
      k.g.E = E;
      k.g.H = Hs[(i + i / 5) % 4];
      k.g.K = Ks[i % 3];
      k.g.w_f32 = (i / 2) % 2 == 1;
      k.g.y_layout = i % 7 == 3 ? 1 : 0;
      k.g.w_layout = i % 9 == 4 ? 1 : 0;
      k.g.l_layout = i % 4 == 2 ? -1 : (i % 5 == 1 ? 1 : 0);
      k.g.seed = 300 + static_cast<uint32_t>(i);
      k.s = random_spec(T, E, k.g.K, 900 + static_cast<uint32_t>(i));
      k.s.alpha = i % 3 ? std::optional<float>(2.5f) : std::nullopt;
      k.s.count = i % 2 == 0;
      k.s.ids_dt = i % 4 < 2 ? DType::kInt32 : DType::kInt64;
      if (i % 6 != 5) {
        StageCase sc;
        sc.scheme = kSchemes[i % 4];
        sc.count = i % 2 == 1;
        sc.H = i % 3 == 0 ? 512 : 1024;
        k.stage = sc;
      }
      k.pdl = i % 3 != 1;
      check(k);
      if (HasFailure()) return;
      ++i;
    }
  }
}

TEST(CudaGate, LayoutsAndWeightDtypes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Row-major (16-byte loads), rows padded (H + 5 / H + 3 elements apart: strided loads), and
  // column-major views of y and the weight, both weight dtypes, every logits_out layout;
  // H = 200: a short last chunk (12 chunks and 8 columns), a tree of 16.
  int i = 0;
  for (int yl = 0; yl < 3; ++yl) {
    for (int wl = 0; wl < 3; ++wl) {
      for (bool f32 : {false, true}) {
        GpuCase k;
        k.g.T = 5;
        k.g.E = 144;
        k.g.H = i % 2 ? 200 : 4096;
        k.g.K = 6;
        k.g.w_f32 = f32;
        k.g.y_layout = yl;
        k.g.w_layout = wl;
        k.g.l_layout = i % 4 - 1;
        k.g.seed = 40 + static_cast<uint32_t>(i);
        k.s = random_spec(5, 144, 6, 70 + static_cast<uint32_t>(i));
        if (i % 3 != 2) k.stage = StageCase{};
        check(k);
        if (HasFailure()) return;
        ++i;
      }
    }
  }
}

TEST(CudaGate, SmallAndOddWidths) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Trees of 1 to 64 chunks around the share boundary (512 columns: one share of 32 chunks;
  // 513: two shares), partial chunks, K = 16.
  uint32_t seed = 60;
  for (int64_t H : {1, 2, 15, 16, 17, 31, 33, 100, 257, 511, 512, 513, 1000, 1025}) {
    GpuCase k;
    k.g.T = 3;
    k.g.E = 20 + H % 7;
    k.g.K = H % 2 ? 4 : 16;
    k.g.H = H;
    k.g.w_f32 = H % 2 == 1;
    k.g.y_layout = static_cast<int>(H % 3);
    k.g.seed = seed++;
    k.s = random_spec(3, k.g.E, k.g.K, seed);
    if (H % 4 == 1) k.stage = StageCase{};
    check(k);
    if (HasFailure()) return;
  }
}

TEST(CudaGate, HashEplbPaddingFullBuffer) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int i = 0; i < 8; ++i) {
    GpuCase k;
    k.g.T = i % 2 ? 23 : 64;
    k.g.E = i < 4 ? 256 : 384;
    k.g.H = i % 3 ? 4096 : 7168;
    k.g.K = i % 2 ? 8 : 6;
    k.g.w_f32 = i % 4 == 1;
    k.g.seed = 500 + static_cast<uint32_t>(i);
    k.s = random_spec(k.g.T, k.g.E, k.g.K, 600 + static_cast<uint32_t>(i));
    k.s.count = true;
    k.s.ids_dt = i % 2 ? DType::kInt64 : DType::kInt32;
    if (i % 4 == 0) add_hash(k.s, 700 + static_cast<uint32_t>(i));
    if (i % 4 != 1) add_eplb(k.s, 800 + static_cast<uint32_t>(i), 1 + i % 4);
    k.s.pad = std::vector<uint8_t>(static_cast<size_t>(k.g.T), 0);
    for (int64_t t = 1; t < k.g.T; t += 3) (*k.s.pad)[static_cast<size_t>(t)] = 1;
    if (i != 3) {
      StageCase sc;
      sc.scheme = kSchemes[i % 4];
      sc.count = true;
      sc.M = i % 2 ? k.g.T + 9 : 0;  // full buffer: the tail filled by the router
      if (i == 6) sc.shared_bm = 64;
      k.stage = sc;
    }
    check(k);
    if (HasFailure()) return;
  }
}

TEST(CudaGate, NanAndInfInputs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // NaN in y (a whole row of NaN logits), +-Inf in the weight, Inf - Inf inside a chain, a
  // product that overflows: NaN logits as 0x7FC00000 on both backends, counted by the
  // router's counter; padded tokens never routed.
  for (bool w_f32 : {false, true}) {
    for (int64_t H : {100, 7168}) {
      GpuCase k;
      GateCase& c = k.g;
      c.T = 6;
      c.E = 64;
      c.H = H;
      c.K = 6;
      c.w_f32 = w_f32;
      // Fresh buffers for each call: the CPU run writes logits_out into the host tensors.
      const auto planted = [&c, w_f32] {
        auto g = gate_bufs(c);
        g->yv[static_cast<size_t>(0 * c.H + 5)] = NAN;                       // row 0: every logit NaN
        g->wv[static_cast<size_t>(3 * c.H + 17)] = INFINITY;                 // expert 3: +-Inf or NaN
        g->wv[static_cast<size_t>(7 * c.H + 2)] = -INFINITY;
        g->wv[static_cast<size_t>(7 * c.H + 3)] = INFINITY;                  // expert 7: Inf - Inf in chunk 0
        g->yv[static_cast<size_t>(4 * c.H + 99)] = 3e38f;                    // huge, its products finite
        g->wv[static_cast<size_t>(9 * c.H + 50)] = w_f32 ? 3e38f : 1e38f;   // row 5 x expert 9: overflow
        g->yv[static_cast<size_t>(5 * c.H + 50)] = 1e10f;
        rewrite(*g, c);
        return g;
      };
      k.s = random_spec(6, 64, 6, 77);
      k.s.count = true;
      k.s.pad = std::vector<uint8_t>{0, 0, 1, 0, 1, 0};
      StageCase sc;
      sc.count = true;
      k.stage = sc;
      check(k, planted().get());
      k.stage.reset();
      check(k, planted().get());
      if (HasFailure()) return;
    }
  }
}

TEST(CudaGate, YIsTheHiddenStates) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // The usual call: the gate reads the very rows the staging quantizes (one device buffer).
  GateCase c;
  c.T = 9;
  c.E = 256;
  c.H = 4096;
  c.K = 6;
  auto g = gate_bufs(c);
  Spec s = random_spec(c.T, c.E, c.K, 9);
  auto rb = build(s, false);
  rb->args.router_logits = TensorRef();
  StageCase sc;
  sc.H = c.H;
  sc.pad = false;
  auto sb = stage_bufs(sc, c.T, c.K, nullptr);
  sb->args.hidden_states = g->y.ref;
  std::vector<Tensor*> all = tensors_of(*rb);
  for (Tensor* t : {&g->y, &g->w, &g->logits}) all.push_back(t);
  for (Tensor* t : tensors_of(*sb)) {
    if (t != &sb->hs) all.push_back(t);
  }
  const Mirror m(all);
  megamoe::gate_route_and_stage(g->args, rb->args, sb->args);
  const GateArgs dg = m.map(g->args);
  const RouterArgs dr = m.map(rb->args);
  StageArgs ds = m.map(sb->args);
  ds.enable_pdl = true;
  router_cases::run_and_compare(m, [&](cudaStream_t stream) { megamoe::gate_route_and_stage(dg, dr, ds, stream); });
}

// Every tensor one byte past its allocation's start (wider elements off their size): the
// calls run on aligned copies (cuda/launch/aligned.cuh), eagerly and under graph capture.
TEST(CudaGate, ElementMisalignedTensors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int i = 0; i < 4; ++i) {
    GpuCase k;
    k.g.T = i % 2 ? 4 : 17;
    k.g.E = i < 2 ? 256 : 144;
    k.g.H = i % 2 ? 7168 : 300;
    k.g.K = 8;
    k.g.w_f32 = i % 2 == 0;
    k.g.y_layout = i == 3 ? 2 : 0;
    k.g.l_layout = i == 2 ? -1 : 0;
    k.g.seed = 90 + static_cast<uint32_t>(i);
    k.s = random_spec(k.g.T, k.g.E, k.g.K, 95 + static_cast<uint32_t>(i));
    k.s.count = true;
    if (i == 1) add_eplb(k.s, 96, 2);
    if (i != 2) {
      StageCase sc;
      sc.count = true;
      k.stage = sc;
    }
    k.skew = 1;
    check(k);
    if (HasFailure()) return;
  }
}

TEST(CudaGate, ZeroTokensFillTheTail) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // T == 0 in full-buffer mode: no gate launch, the router fills the staged tail.
  GpuCase k;
  k.g.T = 0;
  k.g.E = 256;
  k.g.H = 512;
  k.s = random_spec(0, 256, 6, 3);
  StageCase sc;
  sc.M = 12;
  sc.pad = false;
  k.stage = sc;
  check(k);
}

TEST(CudaGate, ExplainNamesTheLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t T : {4, 100}) {
    GateCase c;
    c.T = T;
    c.E = 256;
    c.H = 7168;
    c.K = 6;
    auto g = gate_bufs(c);
    Spec s = random_spec(T, 256, 6, 5);
    auto rb = build(s, false);
    rb->args.router_logits = TensorRef();
    StageCase sc;
    sc.pad = false;
    auto sb = stage_bufs(sc, T, 6, nullptr);
    std::vector<Tensor*> all = tensors_of(*rb);
    for (Tensor* t : {&g->y, &g->w, &g->logits}) all.push_back(t);
    for (Tensor* t : tensors_of(*sb)) all.push_back(t);
    const Mirror m(all);
    StageArgs ds = m.map(sb->args);
    ds.enable_pdl = true;
    const std::string e = megamoe::explain(m.map(g->args), m.map(rb->args), &ds);
    EXPECT_NE(e.find("cuda backend: gate_route_and_stage: the logits are computed in the call"), std::string::npos) << e;
    EXPECT_NE(e.find("launch 1: memset of the counters + kernel=gate threads=256 tile=8 tiles=32 chunks=448 width=512 "
                     "shares=16 share_chunks=32"),
              std::string::npos) << e;
    EXPECT_NE(e.find(T == 4 ? "launches=1" : "launches=2"), std::string::npos) << e;
    EXPECT_NE(e.find("pdl=on"), std::string::npos) << e;
    EXPECT_NE(e.find("launch 2: cuda backend: kernel=router"), std::string::npos) << e;
    EXPECT_NE(e.find("(route_and_stage T=" + std::to_string(T) + " E=256 K=6)"), std::string::npos) << e;
    EXPECT_EQ(e.find("a GEMM (y @ weight.T) then route_and_stage is the faster path") != std::string::npos, T > 64) << e;
    const std::string r = megamoe::explain(m.map(g->args), m.map(rb->args));
    EXPECT_NE(r.find("cuda backend: gate_and_route"), std::string::npos) << r;
    EXPECT_NE(r.find("(route T=" + std::to_string(T) + " E=256 K=6)"), std::string::npos) << r;
  }
}

}  // namespace
