// test_router.cpp: the fused DeepSeek-V4 router on the CPU backend against the
// independent reference (tests/reference/router_reference.h):
//  - the shared exp / log1p / sqrt / score (src/core/router.h) bit for bit against the
//    reference's correctly rounded ones (docs/ROUTER.md: 0 ulp for every fp32 input), and
//    the scores side by side (router_scores) against the score one at a time, and the
//    fast score path against the exact chain (and declining where it must);
//  - route(): ids, weights, EPLB load and the logit counter for planted ties, NaN / Inf
//    logits, all-equal logits, a reversing bias, E not a power of two, E = 512 / K = 16,
//    hash layers, EPLB with 1..5 and 7 replica slots (and out-of-range device data), padding;
//  - route_and_stage(): every staged byte equal to (reference router, then
//    prepare_inputs with its outputs) for several formats, shared_x_sf, full buffer;
//  - every argument error, with nothing written.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <xmmintrin.h>

#include "core/router.h"
#include "megamoe/megamoe.h"
#include "router_cases.h"
#include "router_expect.h"
#include "router_reference.h"
#include "contract/validate.h"

namespace {

using namespace router_cases;  // NOLINT: the shared test vocabulary

/// The library's tensors of @p s after route() on the CPU.
std::unique_ptr<Built> routed(const Spec& s) {
  auto b = build(s);
  megamoe::route(b->args);
  return b;
}

/// route() on the CPU against the reference.
void check_route(const Spec& s) { expect_router_outputs(s, *routed(s), ref::route(reference_problem(s))); }

// ---------------------------------------------------------------------------------------
// Shared numerics against the reference.

/// Inputs for the function tests: every 4099th bit pattern (all binades, both signs, NaNs),
/// the neighbours of every power of two and of the thresholds and clamps. (Every fp32
/// input: bench/router_accuracy.cpp.)
std::vector<uint32_t> sample_inputs() {
  std::vector<uint32_t> v;
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4099) v.push_back(static_cast<uint32_t>(b));
  for (uint32_t e = 0; e < 256; ++e) {
    for (int d = -3; d <= 3; ++d) {
      v.push_back((e << 23) + static_cast<uint32_t>(d));
      v.push_back(0x80000000u | ((e << 23) + static_cast<uint32_t>(d)));
    }
  }
  for (float x : {20.0f, 88.7f, 89.0f, -87.33f, -103.97f, -104.0f, -1.0f, 0x1p-29f, 0x1p-25f, -0x1p-25f}) {
    for (int d = -64; d <= 64; ++d) v.push_back(u32(x) + static_cast<uint32_t>(d));
  }
  return v;
}

bool same_bits_or_nan(float a, float b) { return (std::isnan(a) && std::isnan(b)) || u32(a) == u32(b); }

TEST(RouterNumerics, ExpIsCorrectlyRounded) {
  for (uint32_t b : sample_inputs()) {
    const float x = f32(b);
    ASSERT_TRUE(same_bits_or_nan(megamoe::core::exp_f32(x), ref::exp32(x))) << "exp(" << hex(b) << ")";
  }
}

TEST(RouterNumerics, Log1pIsCorrectlyRounded) {
  for (uint32_t b : sample_inputs()) {
    const float x = f32(b);
    ASSERT_TRUE(same_bits_or_nan(megamoe::core::log1p_f32(x), ref::log1p32(x))) << "log1p(" << hex(b) << ")";
  }
}

TEST(RouterNumerics, SqrtAndScore) {
  for (uint32_t b : sample_inputs()) {
    const float x = f32(b);
    if (x >= 0.0f) {
      ASSERT_EQ(u32(megamoe::core::sqrt_rn(x)), u32(ref::sqrt32(x))) << "sqrt(" << hex(b) << ")";
    }
    // The score is a number or the one quiet NaN, never another NaN.
    const float s = megamoe::core::router_score(x);
    ASSERT_EQ(hex(u32(s)), hex(u32(ref::score(x)))) << "score(" << hex(b) << ")";
  }
}

/// The fast score path == the exact chain, on the sample and every 1021st bit pattern; it
/// reports "cannot decide" on the known fallback logits and below kExpFastMin, and then the
/// exact chain's result is the one returned. (Every fp32 logit: bench/router_accuracy.cpp
/// --only scores.)
TEST(RouterNumerics, FastScoresEqualTheExactChain) {
  std::vector<uint32_t> in = sample_inputs();
  for (uint64_t b = 5; b <= 0xFFFFFFFFull; b += 1021) in.push_back(static_cast<uint32_t>(b));
  for (uint32_t b : in) {
    const float x = f32(b);
    const float e = megamoe::core::router_score_exact(x);
    ASSERT_EQ(hex(u32(megamoe::core::router_score(x))), hex(u32(e))) << "score(" << hex(b) << ")";
    float fast, branch_free;
    const bool decided = megamoe::core::router_score_fast(x, fast);
    // The branch-free form (sqrt_nearest, recip_nearest: the CUDA router's inlined blocks)
    // decides the same inputs with the same bits.
    ASSERT_EQ(megamoe::core::router_score_fast<true>(x, branch_free), decided) << "branch-free(" << hex(b) << ")";
    if (decided) {
      ASSERT_EQ(hex(u32(fast)), hex(u32(e))) << "fast(" << hex(b) << ")";
      ASSERT_EQ(hex(u32(branch_free)), hex(u32(e))) << "branch-free(" << hex(b) << ")";
    }
  }
  ASSERT_GT(std::size(kScoreFallbackLogits), 0u);
  for (uint32_t b : kScoreFallbackLogits) {
    float fast;
    EXPECT_FALSE(megamoe::core::router_score_fast(f32(b), fast)) << hex(b);
    EXPECT_EQ(hex(u32(megamoe::core::router_score(f32(b)))), hex(u32(ref::score(f32(b))))) << hex(b);
  }
  for (float x : {-87.5f, -100.0f, -1e30f, -INFINITY}) {
    float fast;
    EXPECT_FALSE(megamoe::core::router_score_fast(x, fast)) << x;
    EXPECT_EQ(hex(u32(megamoe::core::router_score(x))), hex(u32(ref::score(x)))) << x;
  }
}

/// router_scores<N> (the CUDA router's scores side by side) == the independent reference's
/// score, N = 2..4, on the sample in every position of the N, and on the inputs whose fast
/// path cannot decide next to ones whose can (one such chain sends all N to the exact path).
template <int N>
void expect_scores_side_by_side(const std::vector<uint32_t>& in) {
  for (size_t i = 0; i + N <= in.size(); ++i) {
    float x[N], s[N], sb[N];
    for (int c = 0; c < N; ++c) x[c] = f32(in[i + c]);
    megamoe::core::router_scores(x, s);
    megamoe::core::router_scores<N, true, true>(x, sb);  // as the inlined CUDA router blocks
    for (int c = 0; c < N; ++c) {
      ASSERT_EQ(hex(u32(s[c])), hex(u32(ref::score(x[c])))) << "score(" << hex(in[i + c]) << ")";
      ASSERT_EQ(hex(u32(sb[c])), hex(u32(ref::score(x[c])))) << "branch-free score(" << hex(in[i + c]) << ")";
    }
  }
}

TEST(RouterNumerics, ScoresSideBySide) {
  std::vector<uint32_t> in = sample_inputs();
  for (uint32_t b : kScoreFallbackLogits) in.insert(in.end(), {b, 0x3F800000u, b});
  expect_scores_side_by_side<2>(in);
  expect_scores_side_by_side<3>(in);
  expect_scores_side_by_side<4>(in);
}

TEST(RouterNumerics, NanResultsAreTheQuietNaN) {
  for (uint32_t nan : {0x7F800001u, 0x7FC00001u, 0xFFC12345u, 0xFFFFFFFFu}) {
    EXPECT_EQ(u32(megamoe::core::exp_f32(f32(nan))), 0x7FC00000u);
    EXPECT_EQ(u32(megamoe::core::log1p_f32(f32(nan))), 0x7FC00000u);
    EXPECT_EQ(u32(megamoe::core::router_score(f32(nan))), 0x7FC00000u);
  }
  EXPECT_EQ(u32(megamoe::core::log1p_f32(-2.0f)), 0x7FC00000u);
  EXPECT_EQ(u32(megamoe::core::log1p_f32(-1.0f)), 0xFF800000u);
  EXPECT_EQ(u32(megamoe::core::exp_f32(-INFINITY)), 0u);
  EXPECT_EQ(u32(megamoe::core::router_score(-INFINITY)), 0u);
  EXPECT_EQ(u32(megamoe::core::router_score(INFINITY)), 0x7F800000u);
}

TEST(RouterNumerics, SelectionKeyOrder) {
  using megamoe::core::selection_key;
  const float order[] = {INFINITY, 3.0f, 1.0f, 0x1p-149f, 0.0f, -0x1p-149f, -1.0f, -3.4e38f, -INFINITY};
  for (size_t i = 0; i + 1 < sizeof order / sizeof order[0]; ++i) {
    EXPECT_GT(selection_key(order[i]), selection_key(order[i + 1])) << order[i];
  }
  EXPECT_EQ(selection_key(0.0f), selection_key(-0.0f));
  EXPECT_EQ(selection_key(f32(0x7FC00000u)), 0u);
  EXPECT_EQ(selection_key(f32(0xFFFFFFFFu)), 0u);
  EXPECT_GT(selection_key(-INFINITY), 0u);
}

// ---------------------------------------------------------------------------------------
// route() against the reference.

// The EPLB slot's 32-bit shortcut against the plain 64-bit remainder, across 2^32.
TEST(RouterNumerics, ReplicaSlotEqualsTheRemainder) {
  std::mt19937_64 rng(77);
  std::vector<int64_t> ps = {0, 1, 5, 0xFFFFFFFEll, 0xFFFFFFFFll, 0x100000000ll, 0x100000001ll, 0x7FFFFFFFFFFFFFFFll};
  for (int i = 0; i < 2000; ++i) ps.push_back(static_cast<int64_t>(rng() >> (1 + i % 40)));
  for (int64_t p = 0; p < 4096; ++p) ps.push_back(p);  // every residue pattern of small counts
  for (int64_t p = 0xFFFFF000ll; p <= 0xFFFFFFFFll; ++p) ps.push_back(p);  // the top of the 32-bit range
  for (int64_t p : ps) {
    for (int32_t count : {-3, 0, 1, 2, 3, 4, 5, 7, 1000, 0x7FFFFFFF}) {
      for (int64_t R : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{7}, int64_t{1} << 40}) {
        const int64_t c = std::min<int64_t>(std::max<int64_t>(count, 1), R);
        ASSERT_EQ(megamoe::core::replica_slot(p, count, R), p % c) << p << " " << count << " " << R;
      }
    }
  }
}

// The expert load and the non-finite counter at odd addresses (no alignment is required of
// a tensor): the same counts as aligned ones, on one thread and on several.
TEST(Route, MisalignedLoadAndCounter) {
  for (int threads : {1, 0}) {
    megamoe::set_cpu_threads(threads);
    for (DType load_dt : {DType::kInt32, DType::kInt64}) {
      Spec s = eplb_spec(91, 2, 2000, 256, 8);
      s.load_dt = load_dt;
      s.count = true;
      for (size_t i = 0; i < s.logits.size(); i += 97) s.logits[i] = NAN;
      auto a = build(s);
      megamoe::route(a->args);  // aligned
      auto b = build(s);
      const size_t es = static_cast<size_t>(megamoe::dtype_size(load_dt));
      std::vector<uint8_t> load(b->load.mem.size() + 1, 0), count(9, 0);
      const int64_t start = 1000;
      std::memcpy(count.data() + 1, &start, 8);
      b->args.expert_load_view->data = load.data() + 1;
      b->args.nonfinite_count->data = count.data() + 1;
      megamoe::route(b->args);
      EXPECT_EQ(0, std::memcmp(load.data() + 1, a->load.mem.data(), a->load.mem.size())) << "load, " << es << "-byte";
      EXPECT_EQ(0, std::memcmp(count.data() + 1, a->nonfinite.mem.data(), 8)) << "counter";
      EXPECT_EQ(load[0], 0) << "a byte before the load";
      int64_t got = 0;
      std::memcpy(&got, count.data() + 1, 8);
      EXPECT_GT(got, start) << "no non-finite logit counted";
    }
  }
  megamoe::set_cpu_threads(0);
}

TEST(Route, RandomDeepSeekShapes) {
  uint32_t seed = 1;
  for (auto [E, K] : {std::pair<int64_t, int64_t>{256, 6}, {256, 8}, {384, 6}, {384, 8}}) {
    for (DType ldt : {DType::kFloat32, DType::kBFloat16}) {
      for (DType bdt : {DType::kFloat32, DType::kBFloat16}) {
        Spec s = random_spec(37, E, K, seed++);
        s.logits_dt = ldt;
        s.bias_dt = bdt;
        s.alpha = 1.5f;
        s.ids_dt = seed % 2 ? DType::kInt32 : DType::kInt64;
        SCOPED_TRACE("E=" + std::to_string(E) + " K=" + std::to_string(K));
        check_route(s);
      }
    }
  }
}

/// A routed scaling factor left out is no scaling: the weights are the quotients fl(s / d)
/// themselves (the reference forms no product then), which are the bytes of a factor of 1,
/// subnormal quotients included.
TEST(Route, AbsentScalingFactorIsNoScaling) {
  std::vector<std::pair<std::string, Spec>> cases = catalog(megamoe::core::router_score);
  // Scores of about 1.9e-22 (logit -100) beside 1.7e19 (logit 3e38): quotients near 1e-41.
  Spec tiny = random_spec(2, 4, 2, 9);
  tiny.bias.reset();
  tiny.logits = {3e38f, -100.0f, -1000.0f, -1000.0f, -1000.0f, -99.0f, -1000.0f, 3e38f};
  cases.emplace_back("subnormal quotients", tiny);
  int subnormal = 0;
  for (auto& [name, s] : cases) {
    SCOPED_TRACE(name);
    s.alpha.reset();
    auto absent = routed(s);
    expect_router_outputs(s, *absent, ref::route(reference_problem(s)));
    s.alpha = 1.0f;
    auto one = routed(s);
    ASSERT_EQ(absent->weights.mem, one->weights.mem);
    ASSERT_EQ(absent->ids.mem, one->ids.mem);
    for (int64_t t = 0; t < s.T; ++t) {
      for (int64_t k = 0; k < s.K; ++k) {
        const float w = absent->weights.at<float>(t, k);
        subnormal += w != 0.0f && std::fabs(w) < std::numeric_limits<float>::min() ? 1 : 0;
      }
    }
  }
  EXPECT_GE(subnormal, 2);
}

TEST(Route, NoBiasAndTransposedLogits) {
  Spec s = random_spec(19, 384, 8, 7);
  s.bias.reset();
  check_route(s);
  s.transposed_logits = true;
  check_route(s);
}

TEST(Route, PlantedTiesGoToTheLowestId) {
  const Spec s = planted_ties_spec();
  check_route(s);
  auto b = routed(s);
  const int64_t want[] = {3, 17, 90, 200, 250, 64};
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(b->ids.at<int32_t>(0, k), want[k]);
  const Spec u = bias_tie_spec(megamoe::core::router_score);
  check_route(u);
  auto c = routed(u);
  EXPECT_EQ(c->ids.at<int32_t>(0, 0), 5);
}

TEST(Route, AllEqualLogitsPickTheFirstK) {
  const Spec s = all_equal_spec();
  check_route(s);
  auto b = routed(s);
  for (int64_t k = 0; k < 8; ++k) EXPECT_EQ(b->ids.at<int32_t>(2, k), k);
}

TEST(Route, BiasReversesTheOrder) {
  const Spec s = reversed_bias_spec();
  check_route(s);
  auto b = routed(s);
  for (int64_t k = 0; k < 5; ++k) EXPECT_EQ(b->ids.at<int32_t>(1, k), k);  // lowest logits win
}

TEST(Route, NanAndInfLogits) {
  const Spec s = nan_inf_spec();
  check_route(s);
  auto b = routed(s);
  for (int64_t k = 0; k < 6; ++k) {
    EXPECT_EQ(b->ids.at<int32_t>(1, k), k);
    EXPECT_EQ(u32(b->weights.at<float>(1, k)), 0x7FC00000u);
  }
  // Expert 21's bias is NaN (row 4's case), so its biased score is NaN in every row.
  const int64_t row2[] = {61, 41, 1, 0, 2, 3};
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(b->ids.at<int32_t>(2, k), row2[k]);
  EXPECT_EQ(b->nonfinite.at<int64_t>(0), 1000 + 4 + 64 + 60 + 2);
}

TEST(Route, OddExpertCountsAndExtremes) {
  for (auto [E, K] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {33, 16}, {200, 6}, {257, 9}, {511, 16}, {512, 16},
                      {512, 1}}) {
    SCOPED_TRACE("E=" + std::to_string(E) + " K=" + std::to_string(K));
    check_route(random_spec(5, E, K, static_cast<uint32_t>(E * 31 + K)));
  }
}

TEST(Route, LargeAndTinyLogits) { check_route(extremes_spec()); }

TEST(Route, Padding) {
  const Spec s = padding_spec();
  check_route(s);
  auto b = routed(s);
  for (int64_t k = 0; k < 6; ++k) {
    EXPECT_EQ(b->ids.at<int32_t>(1, k), -1);
    EXPECT_EQ(u32(b->weights.at<float>(9, k)), 0u);
  }
}

TEST(Route, HashLayers) {
  for (DType idt : {DType::kInt32, DType::kInt64}) {
    Spec s = hash_spec(18);
    s.input_ids_dt = idt;
    s.alpha = 1.5f;
    s.count = true;
    check_route(s);
    auto b = routed(s);
    EXPECT_EQ(b->ids.at<int32_t>(0, 1), -1);
    EXPECT_EQ(b->ids.at<int32_t>(0, 2), -1);
    EXPECT_EQ(u32(b->weights.at<float>(0, 2)), 0u);
    EXPECT_EQ(b->ids.at<int32_t>(3, 0), -1);
    EXPECT_EQ(b->ids.at<int32_t>(5, 0), (*s.tid2eid)[static_cast<size_t>(s.input_ids[5] * 6)]);
  }
}

TEST(Route, EplbReplicasAndRecording) {
  for (int64_t R : {1, 2, 3, 4}) {
    for (bool record : {true, false}) {
      for (DType ldt : {DType::kInt32, DType::kInt64}) {
        Spec s = eplb_spec(static_cast<uint32_t>(19 + R), R);
        s.record = record;
        s.load_dt = ldt;
        SCOPED_TRACE("R=" + std::to_string(R) + " record=" + std::to_string(record));
        check_route(s);
        auto b = routed(s);
        int64_t total = 0;
        for (int64_t i = 0; i < s.P; ++i) total += ldt == DType::kInt32 ? b->load.at<int32_t>(i) : b->load.at<int64_t>(i);
        // 17 kept tokens (every 4th of 23 padded) x K entries, or nothing.
        EXPECT_EQ(total, record ? 17 * 8 : 0);
      }
    }
  }
}

TEST(Route, EplbDeviceDataOutOfRange) { check_route(eplb_out_of_range_spec()); }

TEST(Route, HashWithEplb) { check_route(hash_eplb_spec()); }

TEST(Route, Catalog) {
  for (const auto& [name, s] : catalog(megamoe::core::router_score)) {
    SCOPED_TRACE(name);
    check_route(s);
  }
}

TEST(Route, CallerFloatingPointEnvironmentIgnored) {
  // A caller's thread with flush-to-zero, denormals-are-zero and upward rounding (as some
  // libraries leave it): the bytes stay those of the default environment.
  Spec s = extremes_spec();
  s.logits[3] = 0x1p-140f;  // subnormal logits and biases
  (*s.bias)[5] = -0x1p-135f;
  const ref::Result want = ref::route(reference_problem(s));
  auto b = build(s);
  const unsigned csr = _mm_getcsr();
  const int round = std::fegetround();
  _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ
  std::fesetround(FE_UPWARD);
  const unsigned set = _mm_getcsr();
  megamoe::route(b->args);
  const unsigned after = _mm_getcsr();
  const int round_after = std::fegetround();
  _mm_setcsr(csr);
  std::fesetround(round);
  EXPECT_EQ(after, set);  // the caller's environment is restored
  EXPECT_EQ(round_after, FE_UPWARD);
  expect_router_outputs(s, *b, want);
}

TEST(Route, ZeroTokens) {
  Spec s = random_spec(0, 256, 6, 28);
  auto b = routed(s);
  // T == 0 returns before any other check: even a bad top_k is fine.
  b->args.top_k = 99;
  megamoe::route(b->args);
}

// ---------------------------------------------------------------------------------------
// route_and_stage() == reference router, then prepare_inputs.

/// route_and_stage against (reference router, then prepare_inputs with its outputs).
void check_fused(Spec s, const StageCase& c) {
  if (c.pad && !s.pad) {
    s.pad = std::vector<uint8_t>(static_cast<size_t>(s.T), 0);
    for (int64_t t = 2; t < s.T; t += 5) (*s.pad)[static_cast<size_t>(t)] = 1;
  }
  const std::vector<uint8_t>* pad = s.pad ? &*s.pad : nullptr;
  const ref::Result want = ref::route(reference_problem(s));
  // Under each poison: a fused output byte left unwritten equals the staging call's under
  // at most one of them.
  for (const uint8_t poison : kStagePoisons) {
    SCOPED_TRACE(::testing::Message() << "outputs poisoned with 0x" << std::hex << static_cast<int>(poison));
    auto rb = build(s, /*with_pad_in_router=*/false);
    auto fused = stage_bufs(c, s.T, s.K, pad, poison);
    megamoe::route_and_stage(rb->args, fused->args);
    expect_router_outputs(s, *rb, want);
    // The reference's ids / weights as the top-k inputs of an ordinary staging call.
    auto plain = stage_with_topk(c, s.T, s.K, pad, poison, want.ids, want.weights);
    expect_same_bytes(fused->xq, plain->xq, "x_q");
    expect_same_bytes(fused->xsf, plain->xsf, "x_sf");
    expect_same_bytes(fused->idx, plain->idx, "topk_idx_out");
    expect_same_bytes(fused->w, plain->w, "topk_weights_out");
    if (c.shared_bm) expect_same_bytes(fused->shared, plain->shared, "shared_x_sf");
    if (plain->args.x_scales) expect_same_bytes(fused->xscales, plain->xscales, "x_scales");
    if (c.count) expect_same_bytes(fused->nonfinite, plain->nonfinite, "nonfinite_count");
  }
}

TEST(RouteAndStage, EqualsReferenceThenPrepareInputs) {
  StageCase c;
  c.count = true;
  for (auto [E, K] : {std::pair<int64_t, int64_t>{256, 6}, {384, 6}, {384, 8}}) {
    Spec s = random_spec(21, E, K, static_cast<uint32_t>(E + K));
    s.alpha = 1.5f;
    s.count = true;
    check_fused(s, c);
  }
}

TEST(RouteAndStage, Formats) {
  for (QuantScheme q : {QuantScheme::mxfp8(), QuantScheme::fp8_fp32_g128(), QuantScheme::fp8_ue8m0_g128(),
                        QuantScheme::mxfp4(), QuantScheme::nvfp4_static(), QuantScheme::nvfp4_per_token()}) {
    StageCase c;
    c.scheme = q;
    SCOPED_TRACE(megamoe::to_string(q));
    check_fused(random_spec(9, 256, 6, 31), c);
  }
}

TEST(RouteAndStage, SharedFullBufferHashEplb) {
  StageCase c;
  c.shared_bm = 64;
  c.M = 40;
  check_fused(random_spec(13, 384, 6, 32), c);
  check_fused(hash_spec(33), c);
  Spec e = eplb_spec(34, 3);
  e.ids_dt = DType::kInt64;
  check_fused(e, c);
  c.pad = false;
  Spec n = random_spec(13, 384, 6, 35);
  n.pad.reset();
  check_fused(n, c);
}

// NVFP4 online needs the whole tensor's amax before any group: route_and_stage has no
// launch for it and rejects it (kUnsupported) before writing anything.
TEST(RouteAndStage, RejectsNvfp4Online) {
  StageCase c;
  c.scheme = QuantScheme::nvfp4_online();
  Spec s = random_spec(5, 256, 6, 36);
  auto rb = build(s);
  auto b = stage_bufs(c, 5, 6, nullptr);
  const std::vector<uint8_t> xq = b->xq.mem, gs = b->gs.mem, ids = rb->ids.mem;
  try {
    megamoe::route_and_stage(rb->args, b->args);
    ADD_FAILURE() << "accepted";
  } catch (const megamoe::Error& e) {
    EXPECT_EQ(e.code(), megamoe::ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("nvfp4_online"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b->xq.mem, xq);
  EXPECT_EQ(b->gs.mem, gs);
  EXPECT_EQ(rb->ids.mem, ids);
}

TEST(RouteAndStage, EmptyHiddenRows) {
  for (const auto& [s, c] : empty_hidden_cases()) check_fused(s, c);
}

TEST(RouteAndStage, ZeroTokensFillTheTail) {
  StageCase c;
  c.M = 7;
  c.pad = false;
  Spec s = random_spec(0, 256, 6, 36);
  auto rb = build(s);
  auto b = stage_bufs(c, 0, 6, nullptr);
  megamoe::route_and_stage(rb->args, b->args);
  for (int64_t t = 0; t < 7; ++t) {
    for (int64_t k = 0; k < 6; ++k) {
      EXPECT_EQ(b->idx.at<int64_t>(t, k), -1);
      EXPECT_EQ(u32(b->w.at<float>(t, k)), 0u);
    }
  }
  // No token: the activations and their scales untouched.
  EXPECT_EQ(b->xq.mem, std::vector<uint8_t>(b->xq.mem.size(), kStagePoisons[0]));
  EXPECT_EQ(b->xsf.mem, std::vector<uint8_t>(b->xsf.mem.size(), kStagePoisons[0]));
}

TEST(RouteAndStage, ZeroLogitRowsWithTokensRejected) {
  // [0, E] logits beside [4, H] hidden states: the T == 0 return must not hide the
  // disagreement (with 5 logit rows the same call is rejected), and nothing is written.
  for (const bool full_buffer : {false, true}) {
    SCOPED_TRACE(full_buffer ? "full buffer" : "staging");
    StageCase c;
    c.pad = false;
    if (full_buffer) c.M = 9;
    Spec s = random_spec(0, 256, 6, 37);
    auto rb = build(s, false);
    auto sb = stage_bufs(c, 4, 6, nullptr);
    std::vector<std::vector<uint8_t>> before;
    for (const Tensor* t : sb->outputs()) before.push_back(t->mem);
    try {
      megamoe::route_and_stage(rb->args, sb->args);
      ADD_FAILURE() << "no error";
    } catch (const megamoe::Error& err) {
      EXPECT_EQ(err.code(), megamoe::ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(err.what()).find("hidden_states"), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("0 tokens"), std::string::npos) << err.what();
    }
    const std::vector<const Tensor*> outs = sb->outputs();
    for (size_t i = 0; i < outs.size(); ++i) EXPECT_EQ(outs[i]->mem, before[i]) << "output " << i << " written";
    EXPECT_FALSE(megamoe::try_route_and_stage(rb->args, sb->args).ok);
  }
}

// ---------------------------------------------------------------------------------------
// Argument errors: a clear message naming the argument, nothing written.

struct ErrorCase {
  const char* name;
  std::function<void(Built&, StageBufs&)> mutate;
  const char* needle;
  bool fused = true;
};

void expect_rejected(const ErrorCase& e, const std::vector<const Tensor*>& extra_outputs = {}) {
  SCOPED_TRACE(e.name);
  Spec s = random_spec(6, 256, 6, 40);
  s.count = true;
  auto rb = build(s, false);
  StageCase c;
  c.pad = false;
  auto sb = stage_bufs(c, s.T, s.K, nullptr);
  e.mutate(*rb, *sb);
  // Every tensor either call may write, the static EPLB ones (load) included.
  std::vector<const Tensor*> watched = sb->outputs();
  for (const Tensor* t : {&rb->ids, &rb->weights, &rb->load, &rb->nonfinite}) watched.push_back(t);
  for (const Tensor* t : extra_outputs) watched.push_back(t);
  std::vector<std::vector<uint8_t>> before;
  for (const Tensor* t : watched) before.push_back(t->mem);
  const auto untouched = [&](const char* after) {
    for (size_t i = 0; i < watched.size(); ++i) {
      EXPECT_EQ(watched[i]->mem, before[i]) << "tensor " << i << " of the watched outputs written by " << after;
    }
  };
  try {
    if (e.fused) megamoe::route_and_stage(rb->args, sb->args);
    else megamoe::route(rb->args);
    ADD_FAILURE() << "no error";
  } catch (const megamoe::Error& err) {
    EXPECT_EQ(err.code(), megamoe::ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find(e.needle), std::string::npos) << err.what();
  }
  untouched("the throwing call");
  const megamoe::Status st = e.fused ? megamoe::try_route_and_stage(rb->args, sb->args) : megamoe::try_route(rb->args);
  EXPECT_FALSE(st.ok);
  untouched("the try_ call");
}

TEST(RouterErrors, EveryCheck) {
  static Tensor tab(DType::kInt32, {10, 6}, 0), iid(DType::kInt32, {6}, 0), l2p(DType::kInt32, {256, 2}, 0),
      rc(DType::kInt32, {256}, 0), load(DType::kInt64, {300}, 0), rec(DType::kInt32, {1}, 0), pad(DType::kBool, {6}, 0),
      es(DType::kFloat32, {256}, 0);
  auto eplb = [](Built& b) {
    b.args.logical_to_physical_map = l2p.ref;
    b.args.logical_replica_count = rc.ref;
    b.args.expert_load_view = load.ref;
    b.args.record_enabled = rec.ref;
  };
  const std::vector<ErrorCase> cases = {
      {"logits rank", [](Built& b, StageBufs&) { b.args.router_logits.ndim = 1; }, "router_logits: expected 2-D"},
      {"logits dtype", [](Built& b, StageBufs&) { b.args.router_logits.dtype = DType::kFloat16; }, "router_logits: expected dtype float32 or bfloat16"},
      {"E > 512", [](Built& b, StageBufs&) { b.args.router_logits.shape[1] = 513; }, "1 to 512 experts"},
      {"K = 0", [](Built& b, StageBufs&) { b.args.top_k = 0; }, "top_k"},
      {"K = 17", [](Built& b, StageBufs&) { b.args.top_k = 17; }, "top_k"},
      {"K > E", [](Built& b, StageBufs&) { b.args.router_logits.shape[1] = 4; }, "top_k"},
      {"alpha", [](Built& b, StageBufs&) { b.args.routed_scaling_factor = INFINITY; }, "routed_scaling_factor"},
      {"ids shape", [](Built& b, StageBufs&) { b.args.topk_ids.shape[1] = 5; }, "topk_ids: expected shape (6, 6)"},
      {"ids dtype", [](Built& b, StageBufs&) { b.args.topk_ids.dtype = DType::kFloat32; }, "topk_ids: expected dtype"},
      {"weights dtype", [](Built& b, StageBufs&) { b.args.topk_weights.dtype = DType::kBFloat16; }, "topk_weights: expected dtype float32"},
      {"bias shape", [](Built& b, StageBufs&) { b.args.e_score_correction_bias->shape[0] = 255; }, "e_score_correction_bias: expected shape (256,)"},
      {"bias dtype", [](Built& b, StageBufs&) { b.args.e_score_correction_bias->dtype = DType::kInt32; }, "e_score_correction_bias: expected dtype"},
      {"tid2eid alone", [](Built& b, StageBufs&) { b.args.e_score_correction_bias.reset(); b.args.tid2eid = tab.ref; }, "input_ids: expected a tensor"},
      {"input_ids alone", [](Built& b, StageBufs&) { b.args.e_score_correction_bias.reset(); b.args.input_ids = iid.ref; }, "tid2eid: expected a tensor"},
      {"hash with bias", [](Built& b, StageBufs&) { b.args.tid2eid = tab.ref; b.args.input_ids = iid.ref; }, "e_score_correction_bias: expected none"},
      {"tid2eid width", [](Built& b, StageBufs&) {
         b.args.e_score_correction_bias.reset(); b.args.tid2eid = tab.ref; b.args.tid2eid->shape[1] = 5; b.args.input_ids = iid.ref; }, "tid2eid: expected shape"},
      {"tid2eid dtype", [](Built& b, StageBufs&) {
         b.args.e_score_correction_bias.reset(); b.args.tid2eid = tab.ref; b.args.tid2eid->dtype = DType::kInt64; b.args.input_ids = iid.ref; }, "tid2eid: expected dtype int32"},
      {"input_ids shape", [](Built& b, StageBufs&) {
         b.args.e_score_correction_bias.reset(); b.args.tid2eid = tab.ref; b.args.input_ids = iid.ref; b.args.input_ids->shape[0] = 5; }, "input_ids: expected shape (6,)"},
      {"eplb partial", [](Built& b, StageBufs&) { b.args.logical_to_physical_map = l2p.ref; }, "logical_replica_count: expected a tensor"},
      {"eplb no record", [eplb](Built& b, StageBufs&) { eplb(b); b.args.record_enabled.reset(); }, "record_enabled: expected a tensor"},
      {"map rows", [eplb](Built& b, StageBufs&) { eplb(b); b.args.logical_to_physical_map->shape[0] = 255; }, "logical_to_physical_map: expected shape"},
      {"map dtype", [eplb](Built& b, StageBufs&) { eplb(b); b.args.logical_to_physical_map->dtype = DType::kInt64; }, "logical_to_physical_map: expected dtype int32"},
      {"replicas shape", [eplb](Built& b, StageBufs&) { eplb(b); b.args.logical_replica_count->shape[0] = 3; }, "logical_replica_count: expected shape (256,)"},
      {"load dtype", [eplb](Built& b, StageBufs&) { eplb(b); b.args.expert_load_view->dtype = DType::kFloat32; }, "expert_load_view: expected dtype"},
      {"record shape", [eplb](Built& b, StageBufs&) { eplb(b); b.args.record_enabled->shape[0] = 2; }, "record_enabled: expected a one-element"},
      {"record dtype", [eplb](Built& b, StageBufs&) { eplb(b); b.args.record_enabled->dtype = DType::kBool; }, "record_enabled: expected dtype int32"},
      {"counter dtype", [](Built& b, StageBufs&) { b.args.nonfinite_count->dtype = DType::kInt32; }, "nonfinite_count (router): expected dtype int64"},
      {"router pad in fused", [](Built& b, StageBufs&) { b.args.is_padding = pad.ref; }, "is_padding (router): expected none"},
      {"route pad shape", [](Built& b, StageBufs&) { b.args.is_padding = pad.ref; b.args.is_padding->shape[0] = 5; }, "is_padding: expected shape (6,)", false},
      {"stage alpha", [](Built&, StageBufs& s) { s.args.routed_scaling_factor = 1.5f; }, "routed_scaling_factor (staging): expected none"},
      {"stage expert scales", [](Built&, StageBufs& s) { s.args.expert_scales = es.ref; }, "expert_scales (staging): expected none"},
      {"stage T", [](Built&, StageBufs& s) { s.args.hidden_states.shape[0] = 5; }, "hidden_states"},
      {"stage H", [](Built&, StageBufs& s) { s.args.hidden_states.shape[1] = 500; }, "multiple of 128"},
      {"stage x_sf", [](Built&, StageBufs& s) { s.args.x_sf.dtype = DType::kFloat32; }, "x_sf: expected dtype int32"},
      {"device", [](Built& b, StageBufs&) { b.args.topk_weights.device = megamoe::Device::cuda(0); }, "topk_weights: expected device cpu"},
      {"ids overlap weights", [](Built& b, StageBufs&) { b.args.topk_ids.data = b.args.topk_weights.data; }, "overlapping memory"},
      {"weights overlap logits", [](Built& b, StageBufs&) { b.args.topk_weights.data = b.args.router_logits.data; }, "topk_weights: expected memory disjoint from router_logits"},
      {"x_q overlaps logits", [](Built& b, StageBufs& s) { s.args.x_q.data = b.args.router_logits.data; }, "x_q: expected memory disjoint from router_logits"},
      {"idx_out overlaps ids", [](Built& b, StageBufs& s) { s.args.topk_idx_out.data = b.args.topk_ids.data; }, "overlapping memory"},
      {"same counter", [](Built& b, StageBufs& s) { s.args.nonfinite_count = b.args.nonfinite_count; }, "nonfinite_count"},
      {"ids aliasing strides", [](Built& b, StageBufs&) { b.args.topk_ids.strides[1] = 0; }, "topk_ids: expected strides that give every element its own address"},
      {"load overlaps ids", [eplb](Built& b, StageBufs&) { eplb(b); b.args.expert_load_view->data = b.args.topk_ids.data; }, "overlapping memory", false},
      {"null logits", [](Built& b, StageBufs&) { b.args.router_logits.data = nullptr; }, "router_logits: expected a non-null data pointer"},
  };
  for (const ErrorCase& e : cases) expect_rejected(e, {&load});
}

// The validator's flag for a tensor whose data pointer is off its element size (valid; the
// CUDA backend then runs on aligned copies, the CPU ignores it): raised by exactly such a
// tensor, in the router's, the staging's and the routing-only call's slots.
TEST(RouterValidation, FlagsTensorsOffTheirElementSize) {
  const Spec s = random_spec(6, 256, 6, 11);
  auto b = build(s);
  auto sb = stage_bufs(StageCase{}, s.T, s.K, nullptr);
  std::vector<uint8_t> spare(1 << 16);
  uint8_t* const odd = spare.data() + (16 - reinterpret_cast<uintptr_t>(spare.data()) % 16) + 1;
  auto flagged = [&](TensorRef& t, const std::function<bool()>& validate) {
    const TensorRef keep = t;
    t.data = odd;
    const bool f = validate();
    t = keep;
    return f;
  };
  const auto route = [&] { return megamoe::detail::validate_router(b->args, nullptr).misaligned; };
  const auto fused = [&] { return megamoe::detail::validate_router(b->args, &sb->args).misaligned; };
  EXPECT_FALSE(route());
  EXPECT_FALSE(fused());
  for (TensorRef* t : {&b->args.router_logits, &b->args.topk_ids, &b->args.topk_weights}) {
    EXPECT_TRUE(flagged(*t, route)) << megamoe::dtype_name(t->dtype);
    EXPECT_TRUE(flagged(*t, fused)) << megamoe::dtype_name(t->dtype);
  }
  EXPECT_TRUE(flagged(sb->args.x_sf, fused));
  EXPECT_TRUE(flagged(sb->args.topk_weights_out, fused));
  EXPECT_FALSE(flagged(sb->args.x_q, fused)) << "a byte tensor is never off its size";

  StageArgs a = megamoe::detail::staged_args(b->args, sb->args);
  const auto stage = [&] { return megamoe::detail::validate_args(a).misaligned; };
  EXPECT_FALSE(stage());
  EXPECT_TRUE(flagged(a.hidden_states, stage));
  EXPECT_TRUE(flagged(a.topk_ids, stage));

  megamoe::RoutingArgs r;
  r.topk_ids = a.topk_ids;
  r.topk_weights = a.topk_weights;
  r.topk_idx_out = a.topk_idx_out;
  r.topk_weights_out = a.topk_weights_out;
  const auto routing = [&] { return megamoe::detail::validate_routing(r).misaligned; };
  EXPECT_FALSE(routing());
  EXPECT_TRUE(flagged(r.topk_idx_out, routing));
  EXPECT_TRUE(flagged(r.topk_weights, routing));
}

}  // namespace
