// gate_route_and_stage / gate_and_route on the CPU backend: the logits bit for bit against
// the independent gate reference (tests/reference/gate_reference.h), then the router's
// outputs against the router reference run on those logits (and against route_and_stage
// run on them), the staged bytes against prepare_inputs with the reference's top-k; the
// host fused multiply-add against a double-formed one; the logits against a float64 dot
// product within the contract's bound; strides, both weight dtypes, hash layers, EPLB,
// NaN / Inf inputs, padding, the caller's floating-point environment, explain(), T == 0,
// the refusal of CUDA tensors without the CUDA backend and argument errors that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <xmmintrin.h>

#include "core/gate.h"
#include "cpu/gate_cpu.h"
#include "gate_cases.h"
#include "gate_reference.h"
#include "megamoe/megamoe.h"
#include "router_cases.h"
#include "router_expect.h"
#include "router_reference.h"

namespace {

using namespace router_cases;  // NOLINT: the shared test vocabulary
namespace gref = megamoe_ref::gate;
using megamoe::GateArgs;

// ---------------------------------------------------------------------------------------
// The host's fused multiply-add (core::fma_rn, which the CPU backend's chains use) against
// the reference's double-formed one.

bool same_bits_or_nan(float a, float b) { return (std::isnan(a) && std::isnan(b)) || u32(a) == u32(b); }

TEST(GateNumerics, HostFmaIsCorrectlyRounded) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<int> ex(-30, 30);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t checked = 0, cancelled = 0, wrong = 0;
  std::string first;
  const auto check = [&](float a, float b, float c) {
    const float got = megamoe::core::gate_step(a, b, c);
    const float want = gref::fma32(a, b, c);
    ++checked;
    if (same_bits_or_nan(got, want)) return;
    if (wrong++ == 0) {
      first = hex(u32(a)) + " * " + hex(u32(b)) + " + " + hex(u32(c)) + ": " + hex(u32(got)) + " want " +
              hex(u32(want));
    }
  };
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns (every class), then values of nearby magnitudes, then sums that
    // cancel the product to its last bits (the hardest roundings).
    check(f32(any(rng)), f32(any(rng)), f32(any(rng)));
    const float a = std::ldexp(nd(rng), ex(rng)), b = std::ldexp(nd(rng), ex(rng));
    check(a, b, std::ldexp(nd(rng), ex(rng)));
    const float pr = a * b;
    check(a, b, -pr);
    check(a, b, std::nextafter(-pr, 0.0f));
    if (gref::fma32(a, b, -pr) != 0.0f) ++cancelled;  // the product's rounding error, seen
  }
  // Subnormal results, zeros of both signs, infinities.
  for (float a : {0x1p-70f, -0x1p-75f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 0x1.fffffep127f, 3.0f}) {
    for (float b : {0x1p-70f, 0x1.8p-60f, -0.0f, 0.0f, INFINITY, 0x1p127f, -1.5f}) {
      for (float c : {0.0f, -0.0f, 0x1p-149f, -0x1p-140f, INFINITY, -INFINITY, 0x1.fffffep127f, 1.0f}) check(a, b, c);
    }
  }
  ASSERT_EQ(wrong, 0) << "first: " << first;
  EXPECT_GT(cancelled, 1000000);  // the reference keeps the unrounded product
  EXPECT_GT(checked, 8000000);
}

// ---------------------------------------------------------------------------------------
// A gate problem (gate_cases.h), its checks.

/// Every logit's bits equal to the reference's (NaN: 0x7FC00000), every byte of the
/// storage of @p logits outside the view still the poison.
void expect_logits(const GateCase& c, const Tensor& logits, const std::vector<float>& want, uint8_t poison) {
  std::vector<bool> in_view(logits.mem.size(), false);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t e = 0; e < c.E; ++e) {
      const float got = logits.at<float>(t, e);
      const float w = want[static_cast<size_t>(t * c.E + e)];
      ASSERT_EQ(hex(u32(got)), hex(u32(w))) << "logits[" << t << ", " << e << "]";
      const int64_t off = (t * logits.ref.strides[0] + e * logits.ref.strides[1]) * 4;
      for (int i = 0; i < 4; ++i) in_view[static_cast<size_t>(off + i)] = true;
    }
  }
  for (size_t i = 0; i < in_view.size(); ++i) {
    if (!in_view[i]) {
      ASSERT_EQ(logits.mem[i], poison) << "logits_out storage byte " << i << " outside the view";
    }
  }
}

/// Every output a staging call may write (poisoned gaps included) equal.
void expect_same_staging(const StageBufs& got, const StageBufs& want) {
  const std::vector<const Tensor*> a = got.outputs(), b = want.outputs();
  const char* names[] = {"x_q", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "x_scales",
                         "nonfinite_count (staging)"};
  ASSERT_EQ(a.size(), std::size(names));
  for (size_t i = 0; i < a.size(); ++i) expect_same_bytes(*a[i], *b[i], names[i]);
}

/// One full check: gate_route_and_stage (or gate_and_route, @p stage_case absent) against
/// the gate reference, the router reference on its logits, route_and_stage on its logits
/// and prepare_inputs with the reference's top-k; under two output poisons.
void check_gate(const GateCase& c, Spec s, const std::optional<StageCase>& stage_case, GateBufs* given = nullptr) {
  SCOPED_TRACE(::testing::Message() << "T=" << c.T << " E=" << c.E << " H=" << c.H << " K=" << c.K
                                    << " w=" << (c.w_f32 ? "fp32" : "bf16") << " layouts y" << c.y_layout << " w"
                                    << c.w_layout << " l" << c.l_layout << " seed " << c.seed);
  std::unique_ptr<GateBufs> own;
  GateBufs* g0 = given;
  if (g0 == nullptr) {
    own = gate_bufs(c);
    g0 = own.get();
  }
  const std::vector<float> want_logits = gref::logits(g0->yv, g0->wv, c.T, c.E, c.H);
  s.logits = want_logits;
  s.logits_dt = DType::kFloat32;
  s.transposed_logits = false;
  const ref::Result want = ref::route(reference_problem(s));
  const std::vector<uint8_t>* pad = s.pad ? &*s.pad : nullptr;
  for (const uint8_t poison : kStagePoisons) {
    SCOPED_TRACE(::testing::Message() << "poison 0x" << std::hex << static_cast<int>(poison));
    GateArgs ga = g0->args;
    Tensor logits;
    if (c.l_layout >= 0) {
      logits = laid_out(DType::kFloat32, c.T, c.E, c.l_layout, 2, poison);
      ga.logits_out = logits.ref;
    }
    auto rb = build(s, /*with_pad_in_router=*/!stage_case.has_value());
    rb->args.router_logits = TensorRef();
    std::fill(rb->ids.mem.begin(), rb->ids.mem.end(), poison);
    std::fill(rb->weights.mem.begin(), rb->weights.mem.end(), poison);
    std::unique_ptr<StageBufs> sb;
    if (stage_case) {
      sb = stage_bufs(*stage_case, c.T, c.K, pad, poison);
      megamoe::gate_route_and_stage(ga, rb->args, sb->args);
    } else {
      megamoe::gate_and_route(ga, rb->args);
    }
    if (c.l_layout >= 0) expect_logits(c, logits, want_logits, poison);
    expect_router_outputs(s, *rb, want);
    // route_and_stage / route on the reference's logits: the same bytes everywhere.
    auto rr = build(s, !stage_case.has_value());
    std::fill(rr->ids.mem.begin(), rr->ids.mem.end(), poison);
    std::fill(rr->weights.mem.begin(), rr->weights.mem.end(), poison);
    std::unique_ptr<StageBufs> sr;
    if (stage_case) {
      sr = stage_bufs(*stage_case, c.T, c.K, pad, poison);
      megamoe::route_and_stage(rr->args, sr->args);
    } else {
      megamoe::route(rr->args);
    }
    expect_same_bytes(rb->ids, rr->ids, "topk_ids vs route");
    expect_same_bytes(rb->weights, rr->weights, "topk_weights vs route");
    if (s.l2p) expect_same_bytes(rb->load, rr->load, "expert_load_view vs route");
    if (s.count) expect_same_bytes(rb->nonfinite, rr->nonfinite, "nonfinite_count vs route");
    if (!stage_case) continue;
    expect_same_staging(*sb, *sr);
    // The reference's ids / weights staged by prepare_inputs.
    auto plain = stage_with_topk(*stage_case, c.T, c.K, pad, poison, want.ids, want.weights);
    expect_same_staging(*sb, *plain);
  }
}

// ---------------------------------------------------------------------------------------
// Randomized DeepSeek shapes.

TEST(GateRouteAndStage, RandomDecodeShapes) {
  std::mt19937 rng(2026);
  const int64_t Es[] = {64, 144, 256, 384, 512};
  const int64_t Hs[] = {2048, 4096, 7168};
  const int64_t Ks[] = {1, 6, 8, 16};
  const int64_t Ts[] = {1, 2, 4, 7, 16, 33, 64};
  int cases = 0;
  for (int i = 0; i < 20; ++i) {
    GateCase c;
    c.T = Ts[rng() % 7];
    c.E = Es[i % 5];
    c.H = Hs[rng() % 3];
    c.K = Ks[rng() % 4];
    c.w_f32 = rng() % 2 == 1;
    c.y_layout = static_cast<int>(rng() % 3);
    c.w_layout = static_cast<int>(rng() % 3);
    c.l_layout = static_cast<int>(rng() % 4) - 1;
    c.seed = 100 + static_cast<uint32_t>(i);
    Spec s = router_spec(c, {}, 500 + static_cast<uint32_t>(i));
    s.alpha = i % 3 ? std::optional<float>(1.5f) : std::nullopt;
    s.count = i % 2 == 0;
    s.ids_dt = i % 4 < 2 ? DType::kInt32 : DType::kInt64;
    if (i % 5 == 1) add_hash(s, 700 + static_cast<uint32_t>(i));
    if (i % 4 == 3) add_eplb(s, 800 + static_cast<uint32_t>(i), 1 + i % 4);
    s.pad = std::vector<uint8_t>(static_cast<size_t>(c.T), 0);
    for (int64_t t = 1; t < c.T; t += 3) (*s.pad)[static_cast<size_t>(t)] = 1;
    StageCase sc;
    sc.count = i % 2 == 1;
    sc.scheme = i % 3 == 0 ? QuantScheme::mxfp8() : (i % 3 == 1 ? QuantScheme::fp8_ue8m0_g128() : QuantScheme::mxfp4());
    if (i % 6 == 2) sc.M = c.T + 9;
    check_gate(c, s, i % 7 == 6 ? std::nullopt : std::optional<StageCase>(sc));
    ++cases;
  }
  EXPECT_EQ(cases, 20);
}

TEST(GateRouteAndStage, PortableChainsGiveTheSameBits) {
  // The portable chains (core::gate_step one lane at a time), where this CPU would take the
  // vector path: the same logits, bit for bit, as the reference (partial token groups,
  // partial expert tiles, a partial last chunk).
  megamoe::cpu::gate_portable_only(true);
  for (auto [T, E, H] : {std::array<int64_t, 3>{7, 144, 2048}, {1, 64, 4096}, {5, 23, 333}}) {
    GateCase c;
    c.T = T;
    c.E = E;
    c.H = H;
    c.w_f32 = H % 2 == 1;
    c.seed = static_cast<uint32_t>(T * E);
    check_gate(c, router_spec(c, {}, 12), StageCase{});
  }
  megamoe::cpu::gate_portable_only(false);
}

TEST(GateRouteAndStage, EveryExpertCountAndTopK) {
  // Small H keeps the reference fast; each E and K of the issue once at least.
  uint32_t seed = 40;
  for (int64_t E : {64, 144, 256, 384, 512}) {
    for (int64_t K : {1, 6, 8, 16}) {
      GateCase c;
      c.T = 5;
      c.E = E;
      c.K = K;
      c.H = 160 + 16 * (K % 3) + K;  // odd widths: a partial last chunk
      c.w_f32 = K % 2 == 0;
      c.seed = seed++;
      check_gate(c, router_spec(c, {}, seed), StageCase{});
    }
  }
}

TEST(GateRouteAndStage, LargerBatches) {
  GateCase c;
  c.T = 200;
  c.E = 256;
  c.H = 512;
  c.K = 8;
  c.y_layout = 2;
  c.w_layout = 1;
  c.l_layout = 1;
  Spec s = router_spec(c, {}, 3);
  s.count = true;
  add_eplb(s, 4, 3);
  StageCase sc;
  sc.shared_bm = 64;
  check_gate(c, s, sc);
  c.T = 130;
  c.E = 384;
  c.H = 1000;
  c.w_f32 = true;
  c.l_layout = -1;
  check_gate(c, router_spec(c, {}, 5), std::nullopt);
}

TEST(GateRouteAndStage, SmallAndOddWidths) {
  // H from one column to a few chunks, around the chunk and tree boundaries (n = 1, 2, 3,
  // 4, 5, 8, 9, 17 chunks): every partial chunk and tree padding.
  uint32_t seed = 60;
  for (int64_t H : {1, 2, 15, 16, 17, 31, 33, 48, 63, 64, 65, 129, 130, 257, 271}) {
    GateCase c;
    c.T = 3;
    c.E = 20 + H % 7;
    c.K = 4;
    c.H = H;
    c.w_f32 = H % 2 == 1;
    c.y_layout = static_cast<int>(H % 3);
    c.seed = seed++;
    check_gate(c, router_spec(c, {}, seed), std::nullopt);
  }
}

TEST(GateRouteAndStage, YIsTheHiddenStates) {
  // The usual call: the gate reads the very rows the staging quantizes.
  GateCase c;
  c.T = 9;
  c.E = 256;
  c.H = 512;
  c.K = 6;
  StageCase sc;
  sc.H = 512;
  sc.pad = false;
  auto g = gate_bufs(c);
  Spec s = router_spec(c, {}, 9);
  const std::vector<float> want_logits = gref::logits(g->yv, g->wv, c.T, c.E, c.H);
  s.logits = want_logits;
  const ref::Result want = ref::route(reference_problem(s));
  auto rb = build(s, false);
  rb->args.router_logits = TensorRef();
  auto sb = stage_bufs(sc, c.T, c.K, nullptr);
  sb->args.hidden_states = g->y.ref;
  megamoe::gate_route_and_stage(g->args, rb->args, sb->args);
  expect_logits(c, g->logits, want_logits, 0xCD);
  expect_router_outputs(s, *rb, want);
  expect_same_staging(*sb,
                      *stage_with_topk(sc, c.T, c.K, nullptr, kStagePoisons[0], want.ids, want.weights, &g->y.ref));
}

TEST(GateRouteAndStage, NanAndInfInputs) {
  // NaN in y, Inf in the weight, a product that overflows, an Inf - Inf in a chain: the
  // logits are NaN / Inf as the order makes them, counted by the router's counter; padded
  // tokens are never routed whatever their logits.
  for (bool w_f32 : {false, true}) {
    GateCase c;
    c.T = 6;
    c.E = 64;
    c.H = 100;
    c.K = 6;
    c.w_f32 = w_f32;
    auto g = gate_bufs(c);
    g->yv[static_cast<size_t>(0 * c.H + 5)] = NAN;                      // row 0: every logit NaN
    g->wv[static_cast<size_t>(3 * c.H + 17)] = INFINITY;                // expert 3: +-Inf or NaN
    g->wv[static_cast<size_t>(7 * c.H + 2)] = -INFINITY;
    g->wv[static_cast<size_t>(7 * c.H + 3)] = INFINITY;                 // expert 7: Inf - Inf in chunk 0
    g->yv[static_cast<size_t>(2 * c.H + 40)] = 0.0f;
    g->yv[static_cast<size_t>(4 * c.H + 99)] = 3e38f;                   // huge, its products finite
    g->wv[static_cast<size_t>(9 * c.H + 50)] = w_f32 ? 3e38f : 1e38f;  // row 5 x expert 9: overflow
    g->yv[static_cast<size_t>(5 * c.H + 50)] = 1e10f;
    rewrite(*g, c);
    Spec s = router_spec(c, {}, 77);
    s.count = true;
    s.pad = std::vector<uint8_t>{0, 0, 1, 0, 1, 0};
    StageCase sc;
    sc.count = true;
    check_gate(c, s, sc, g.get());
    // The reference logits do hold the planted values.
    const std::vector<float> l = gref::logits(g->yv, g->wv, c.T, c.E, c.H);
    int64_t nonfinite = 0;
    for (float v : l) nonfinite += std::isfinite(v) ? 0 : 1;
    EXPECT_GE(nonfinite, c.E + 2 * (c.T - 1)) << "row 0 and experts 3, 7";
    EXPECT_TRUE(std::isinf(l[static_cast<size_t>(5 * c.E + 9)]));
  }
}

TEST(GateRouteAndStage, CallerFloatingPointEnvironmentIgnored) {
  // Round-up and flush-to-zero on the calling thread change no bit: ordinary inputs, and
  // inputs with subnormal products, whose chains FTZ would flush.
  for (float scale : {1.0f, 1e-20f}) {
    GateCase c;
    c.T = 3;
    c.E = 64;
    c.H = 300;
    c.K = 6;
    c.y_scale = scale;
    c.w_scale = 0.05f * scale;
    auto g = gate_bufs(c);
    const std::vector<float> want = gref::logits(g->yv, g->wv, c.T, c.E, c.H);
    int subnormal = 0;
    for (float v : want) subnormal += std::fpclassify(v) == FP_SUBNORMAL ? 1 : 0;
    EXPECT_EQ(subnormal > 0, scale < 1.0f);
    Spec s = router_spec(c, want, 8);
    auto rb = build(s);
    rb->args.router_logits = TensorRef();
    const int round = std::fegetround();
    const unsigned csr = _mm_getcsr();
    std::fesetround(FE_UPWARD);
    _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ
    megamoe::gate_and_route(g->args, rb->args);
    _mm_setcsr(csr);
    std::fesetround(round);
    expect_logits(c, g->logits, want, 0xCD);
  }
}

TEST(GateRouteAndStage, LogitsWithinTheStatedBoundOfTheExactDotProduct) {
  // |logit - dot| <= (16 + log2 N) * 2^-24 * (1 + 2^-18) * sum |y_i w_i| (each product passes
  // through at most 16 fused roundings in its chain and log2 N sums in the fold; no
  // underflow at these magnitudes), dot the float64 sum of the exact products.
  double worst = 0.0, worst_rel = 0.0;
  int64_t logits = 0;
  for (auto [T, E, H] : {std::array<int64_t, 3>{16, 256, 7168}, {8, 384, 4096}, {32, 64, 2048}, {64, 144, 100}}) {
    GateCase c;
    c.T = T;
    c.E = E;
    c.H = H;
    c.seed = static_cast<uint32_t>(T + E + H);
    auto g = gate_bufs(c);
    Spec s = router_spec(c, {}, 1);
    s.K = 6;
    auto rb = build(s);
    rb->args.router_logits = TensorRef();
    megamoe::gate_and_route(g->args, rb->args);
    const int64_t n = (H + 15) / 16;
    int64_t lg = 0;
    while ((int64_t{1} << lg) < n) ++lg;
    const double gamma = static_cast<double>(16 + lg) * 0x1p-24 * (1.0 + 0x1p-18);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e < E; ++e) {
        long double dot = 0.0L;
        double abs_sum = 0.0;
        for (int64_t h = 0; h < H; ++h) {
          const double p = static_cast<double>(g->yv[static_cast<size_t>(t * H + h)]) *
                           static_cast<double>(g->wv[static_cast<size_t>(e * H + h)]);
          dot += p;
          abs_sum += std::fabs(p);
        }
        const double err = std::fabs(static_cast<double>(g->logits.at<float>(t, e)) - static_cast<double>(dot));
        ASSERT_LE(err, gamma * abs_sum) << "logit [" << t << ", " << e << "]";
        worst = std::max(worst, err / (gamma * abs_sum));
        if (std::fabs(static_cast<double>(dot)) > 1e-3 * abs_sum) {
          worst_rel = std::max(worst_rel, err / std::fabs(static_cast<double>(dot)));
        }
        ++logits;
      }
    }
  }
  std::printf("gate logits vs float64: %lld logits, worst error %.3g of the bound, worst relative error %.3g\n",
              static_cast<long long>(logits), worst, worst_rel);
  EXPECT_GT(worst, 0.0);  // the fp32 order does round: the comparison sees real errors
}

TEST(GateRouteAndStage, ZeroTokens) {
  GateCase c;
  c.T = 0;
  c.E = 256;
  c.H = 512;
  auto g = gate_bufs(c);
  Spec s = random_spec(0, 256, 6, 3);
  auto rb = build(s, false);
  rb->args.router_logits = TensorRef();
  megamoe::gate_and_route(g->args, rb->args);  // returns at once
  // Full-buffer mode: the tail of the staged top-k is filled as route_and_stage fills it.
  StageCase sc;
  sc.M = 12;
  sc.pad = false;
  auto sb = stage_bufs(sc, 0, 6, nullptr);
  megamoe::gate_route_and_stage(g->args, rb->args, sb->args);
  auto rr = build(s, false);
  auto sr = stage_bufs(sc, 0, 6, nullptr);
  megamoe::route_and_stage(rr->args, sr->args);
  expect_same_bytes(sb->idx, sr->idx, "topk_idx_out");
  expect_same_bytes(sb->w, sr->w, "topk_weights_out");
  EXPECT_EQ(sb->idx.at<int64_t>(11, 5), -1);
}

TEST(GateRouteAndStage, ExplainSaysTheLogitsAreComputedInTheCall) {
  GateCase c;
  auto g = gate_bufs(c);
  Spec s = random_spec(c.T, c.E, c.K, 2);
  auto rb = build(s, false);
  rb->args.router_logits = TensorRef();
  StageCase sc;
  sc.pad = false;
  auto sb = stage_bufs(sc, c.T, c.K, nullptr);
  const std::string text = megamoe::explain(g->args, rb->args, &sb->args);
  EXPECT_NE(text.find("logits are computed in the call"), std::string::npos) << text;
  EXPECT_NE(text.find("gate_route_and_stage"), std::string::npos) << text;
  EXPECT_NE(text.find("route_and_stage T=4 E=64 K=6"), std::string::npos) << text;
  const std::string routed = megamoe::explain(g->args, rb->args);
  EXPECT_NE(routed.find("gate_and_route"), std::string::npos) << routed;
  EXPECT_EQ(sb->xq.mem, stage_bufs(sc, c.T, c.K, nullptr)->xq.mem);  // explain ran nothing
}

// ---------------------------------------------------------------------------------------
// Refusals: CUDA tensors without the CUDA backend and invalid arguments, nothing written.

struct Call {
  std::unique_ptr<GateBufs> g;
  std::unique_ptr<Built> rb;
  std::unique_ptr<StageBufs> sb;
  std::vector<const Tensor*> watched() const {
    std::vector<const Tensor*> w = sb->outputs();
    for (const Tensor* t : {&g->logits, &rb->ids, &rb->weights, &rb->load, &rb->nonfinite}) w.push_back(t);
    return w;
  }
};

Call make_call() {
  Call c;
  GateCase gc;
  gc.T = 6;
  gc.E = 256;
  gc.H = 256;
  gc.K = 6;
  c.g = gate_bufs(gc);
  Spec s = random_spec(6, 256, 6, 40);
  s.count = true;
  add_eplb(s, 41, 2);
  c.rb = build(s, false);
  c.rb->args.router_logits = TensorRef();
  StageCase sc;
  sc.pad = false;
  c.sb = stage_bufs(sc, 6, 6, nullptr);
  return c;
}

void expect_refused(const char* name, const std::function<void(Call&)>& mutate, const char* needle,
                    megamoe::ErrorCode code = megamoe::ErrorCode::kInvalidArgument, bool fused_only = false) {
  SCOPED_TRACE(name);
  for (bool fused : {true, false}) {
    if (fused_only && !fused) continue;
    Call c = make_call();
    mutate(c);
    const std::vector<const Tensor*> watched = c.watched();
    std::vector<std::vector<uint8_t>> before;
    for (const Tensor* t : watched) before.push_back(t->mem);
    try {
      if (fused) megamoe::gate_route_and_stage(c.g->args, c.rb->args, c.sb->args);
      else megamoe::gate_and_route(c.g->args, c.rb->args);
      ADD_FAILURE() << "no error";
    } catch (const megamoe::Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    const megamoe::Status st = fused ? megamoe::try_gate_route_and_stage(c.g->args, c.rb->args, c.sb->args)
                                     : megamoe::try_gate_and_route(c.g->args, c.rb->args);
    EXPECT_FALSE(st.ok);
    EXPECT_EQ(st.code, code);
    if (code == megamoe::ErrorCode::kInvalidArgument) {
      EXPECT_THROW(megamoe::validate_gate(c.g->args, c.rb->args, fused ? &c.sb->args : nullptr), megamoe::Error);
    }
    for (size_t i = 0; i < watched.size(); ++i) EXPECT_EQ(watched[i]->mem, before[i]) << "output " << i << " written";
  }
}

TEST(GateErrors, ValidCallPasses) {
  Call c = make_call();
  EXPECT_NO_THROW(megamoe::validate_gate(c.g->args, c.rb->args, &c.sb->args));
  EXPECT_TRUE(megamoe::try_gate_route_and_stage(c.g->args, c.rb->args, c.sb->args).ok);
}

TEST(GateErrors, EveryCheck) {
  static Tensor other(DType::kFloat32, {6, 256}, 0);
  expect_refused("router_logits given", [](Call& c) { c.rb->args.router_logits = other.ref; }, "router_logits");
  expect_refused("y fp32", [](Call& c) { c.g->args.y.dtype = DType::kFloat32; }, "y: expected dtype bfloat16");
  expect_refused("y 1-D", [](Call& c) { c.g->args.y.ndim = 1; }, "y: expected 2-D");
  expect_refused("weight fp16", [](Call& c) { c.g->args.weight.dtype = DType::kFloat16; }, "weight: expected dtype");
  expect_refused("weight width", [](Call& c) { c.g->args.weight.shape[1] = 255; }, "weight");
  expect_refused("weight 513 experts", [](Call& c) { c.g->args.weight.shape[0] = 513; }, "1 to 512 experts");
  expect_refused("weight H = 0", [](Call& c) {
    c.g->args.weight.shape[1] = 0;
    c.g->args.y.shape[1] = 0;
  }, "H = y.shape[1] >= 1");
  expect_refused("logits_out shape", [](Call& c) { c.g->args.logits_out->shape[1] = 255; }, "logits_out");
  expect_refused("logits_out bf16", [](Call& c) { c.g->args.logits_out->dtype = DType::kBFloat16; }, "logits_out");
  expect_refused("logits_out on y", [](Call& c) {
    c.g->args.logits_out->data = c.g->args.y.data;
  }, "logits_out: expected memory disjoint from y");
  expect_refused("topk_ids over weight", [](Call& c) {
    c.rb->args.topk_ids.data = c.g->args.weight.data;
  }, "memory disjoint from weight");
  expect_refused("logits_out self-overlap", [](Call& c) { c.g->args.logits_out->strides[0] = 0; },
                 "every element its own address");
  expect_refused("top_k", [](Call& c) { c.rb->args.top_k = 0; }, "top_k");
  expect_refused("weight on cuda", [](Call& c) { c.g->args.weight.device = megamoe::Device::cuda(0); }, "device");
  expect_refused("is_padding in the router", [](Call& c) {
    static Tensor pad(DType::kBool, {6}, 0);
    c.rb->args.is_padding = pad.ref;
  }, "is_padding (router)", megamoe::ErrorCode::kInvalidArgument, /*fused_only=*/true);
}

TEST(GateErrors, HiddenRowsMustBeTheTokens) {
  Call c = make_call();
  c.sb->args.hidden_states.shape[0] = 5;
  try {
    megamoe::gate_route_and_stage(c.g->args, c.rb->args, c.sb->args);
    ADD_FAILURE() << "no error";
  } catch (const megamoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the rows of y"), std::string::npos) << e.what();
  }
  // A batch of zero rows in y still checks the hidden states' rows.
  Call z = make_call();
  z.g->args.y.shape[0] = 0;
  EXPECT_THROW(megamoe::gate_route_and_stage(z.g->args, z.rb->args, z.sb->args), megamoe::Error);
}

TEST(GateErrors, CudaTensorsWithoutTheCudaBackend) {
  // A build with the CUDA backend runs CUDA tensors (tests/cuda/test_gate_cuda.cu); these
  // are host memory labelled as device 0, which only the refusal may see.
  if (megamoe::has_cuda_backend()) GTEST_SKIP() << "a build with the CUDA backend runs CUDA tensors";
  const auto to_cuda = [](Call& c) {
    for (TensorRef* t : {&c.g->args.y, &c.g->args.weight, &*c.g->args.logits_out, &c.rb->args.topk_ids,
                         &c.rb->args.topk_weights, &c.rb->args.logical_to_physical_map.value(),
                         &c.rb->args.logical_replica_count.value(), &c.rb->args.expert_load_view.value(),
                         &c.rb->args.record_enabled.value(), &c.rb->args.nonfinite_count.value(),
                         &c.rb->args.e_score_correction_bias.value(), &c.sb->args.hidden_states, &c.sb->args.x_q,
                         &c.sb->args.x_sf, &c.sb->args.topk_idx_out, &c.sb->args.topk_weights_out}) {
      t->device = megamoe::Device::cuda(0);
    }
  };
  expect_refused("cuda", to_cuda, "expected a CPU tensor (this build has no CUDA backend)",
                 megamoe::ErrorCode::kUnsupported);
  Call c = make_call();
  to_cuda(c);
  const std::string text = megamoe::explain(c.g->args, c.rb->args, &c.sb->args);
  EXPECT_NE(text.find("this build has no CUDA backend"), std::string::npos) << text;
}

}  // namespace
