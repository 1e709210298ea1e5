// The activation formats beyond MXFP8 (SPEC.md "Activation formats", "Scale layouts",
// "Non-finite detection"): MXFP4 with both tie rules and the drop-in rule, NVFP4 with a
// static and a per-token second-level scale, the amax floors, the non-finite counter, the
// new argument checks and output_shapes(). Every staging case goes through
// megamoe::prepare_inputs on CPU tensors and is compared byte for byte (gaps included) with
// the independent reference; the hand-computed bytes written here are asserted on the
// reference result, so library, reference and these numbers must all agree.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using megamoe::Device;
using megamoe::DType;
using megamoe::ErrorCode;
using megamoe::QuantScheme;
using megamoe::Rounding;
using mt::Layout;
using mt::staged;

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = mt::u2f(0x7FC00000u);
const float kNegNaN = mt::u2f(0xFFC00000u);

/// e2m1 nibble of column h of token t (low nibble = even column).
int nib(const megamoe_ref::Result& r, int64_t H, int64_t t, int64_t h) {
  return (r.x_q[static_cast<size_t>(t * (H / 2) + h / 2)] >> (4 * (h % 2))) & 0xF;
}

/// Scale byte of group g of token t in packed scale words (UE8M0 or e4m3).
int sf_byte(const megamoe_ref::Result& r, int64_t words_per_row, int64_t t, int64_t g) {
  return (r.sf_words[static_cast<size_t>(t * words_per_row + g / 4)] >> (8 * (g % 4))) & 0xFF;
}

/// Nibbles of token t, columns [h0, h0 + n).
std::vector<int> nibs(const megamoe_ref::Result& r, int64_t H, int64_t t, int64_t h0, int64_t n) {
  std::vector<int> v;
  for (int64_t h = h0; h < h0 + n; ++h) v.push_back(nib(r, H, t, h));
  return v;
}

/// Put @p vals at columns g*G, g*G+1, ... of token t.
void fill_group(mt::Problem& p, int64_t t, int64_t g, std::initializer_list<float> vals) {
  int64_t h = g * p.format().G;
  for (float v : vals) mt::set_hidden(p, t, h++, v);
}

/// The neighbour of v one ulp of dtype @p dt away, in direction dir (+1 up, -1 down);
/// v > 0 and exactly representable in dt.
float ulp_step(DType dt, float v, int dir) {
  if (dt == DType::kFloat32) return std::nextafter(v, dir > 0 ? kInf : 0.0f);
  const uint16_t b = dt == DType::kBFloat16 ? mt::float_to_bf16(v) : mt::float_to_half(v);
  const uint16_t n = static_cast<uint16_t>(b + dir);  // positive: bits order like values
  return dt == DType::kBFloat16 ? megamoe_ref::bf16_to_float(n) : megamoe_ref::half_to_float(n);
}

// ---------------------------------------------------------------------------------------
// The reference's e2m1 pieces, against numbers written by hand.

TEST(ReferenceFp4, GridAndMidpoints) {
  const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(megamoe_ref::fp4_value(c), grid[c]) << "code " << c;
  const double mid[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
  for (int c = 0; c < 7; ++c) EXPECT_EQ(megamoe_ref::detail::fp4_table().mid[c], mid[c]);
}

/// One input of the e2m1 encoder and its nibble under each tie rule.
struct Fp4Case {
  float v;
  int ttz, rne;
};

// Every midpoint, its fp32 neighbours, both signs, zeros, tiny values, saturation, NaN.
// ttz: the code counts the midpoints |v| strictly exceeds, the sign only on a nonzero
// code; rne: nearest, ties to the even code, the sign always kept, NaN -> 0x7.
const Fp4Case kFp4Cases[] = {
    {0.25f, 0x0, 0x0}, {std::nextafter(0.25f, 0.0f), 0x0, 0x0}, {std::nextafter(0.25f, 1.0f), 0x1, 0x1},
    {0.75f, 0x1, 0x2}, {std::nextafter(0.75f, 0.0f), 0x1, 0x1}, {std::nextafter(0.75f, 1.0f), 0x2, 0x2},
    {1.25f, 0x2, 0x2}, {std::nextafter(1.25f, 0.0f), 0x2, 0x2}, {std::nextafter(1.25f, 2.0f), 0x3, 0x3},
    {1.75f, 0x3, 0x4}, {std::nextafter(1.75f, 0.0f), 0x3, 0x3}, {std::nextafter(1.75f, 2.0f), 0x4, 0x4},
    {2.5f, 0x4, 0x4},  {std::nextafter(2.5f, 0.0f), 0x4, 0x4},  {std::nextafter(2.5f, 3.0f), 0x5, 0x5},
    {3.5f, 0x5, 0x6},  {std::nextafter(3.5f, 0.0f), 0x5, 0x5},  {std::nextafter(3.5f, 4.0f), 0x6, 0x6},
    {5.0f, 0x6, 0x6},  {std::nextafter(5.0f, 0.0f), 0x6, 0x6},  {std::nextafter(5.0f, 6.0f), 0x7, 0x7},
    {-0.25f, 0x0, 0x8}, {-std::nextafter(0.25f, 1.0f), 0x9, 0x9}, {-0.75f, 0x9, 0xA},
    {-std::nextafter(0.75f, 0.0f), 0x9, 0x9}, {-1.25f, 0xA, 0xA}, {-1.75f, 0xB, 0xC},
    {-2.5f, 0xC, 0xC}, {-3.5f, 0xD, 0xE}, {-std::nextafter(3.5f, 4.0f), 0xE, 0xE},
    {-5.0f, 0xE, 0xE}, {-std::nextafter(5.0f, 6.0f), 0xF, 0xF},
    {0.0f, 0x0, 0x0}, {-0.0f, 0x0, 0x8}, {-1e-30f, 0x0, 0x8}, {mt::u2f(0x80000001u), 0x0, 0x8},
    {1e-30f, 0x0, 0x0}, {0.5f, 0x1, 0x1}, {1.0f, 0x2, 0x2}, {1.5f, 0x3, 0x3}, {2.0f, 0x4, 0x4},
    {3.0f, 0x5, 0x5}, {4.0f, 0x6, 0x6}, {6.0f, 0x7, 0x7}, {-6.0f, 0xF, 0xF}, {6.5f, 0x7, 0x7},
    {1e30f, 0x7, 0x7}, {-448.0f, 0xF, 0xF}, {kInf, 0x7, 0x7}, {-kInf, 0xF, 0xF},
    {kNaN, 0x0, 0x7}, {kNegNaN, 0x0, 0x7}, {mt::u2f(0x7F800001u), 0x0, 0x7},
};

TEST(ReferenceFp4, EncodeBothTieRules) {
  for (const Fp4Case& c : kFp4Cases) {
    EXPECT_EQ(megamoe_ref::fp4_e2m1(c.v, megamoe_ref::Fp4Ties::kTowardZero), c.ttz)
        << "v = " << c.v << " (0x" << std::hex << mt::f2u(c.v) << ")";
    EXPECT_EQ(megamoe_ref::fp4_e2m1(c.v, megamoe_ref::Fp4Ties::kNearestEven), c.rne)
        << "v = " << c.v << " (0x" << std::hex << mt::f2u(c.v) << ")";
  }
}

// SPEC: "for UE8M0 the rounded-up exponent is the same whether the division is exact or a
// multiplication by fl(1/6)". The reference forms no quotient at all; check it against
// both fp32 formulations (bits of s, + 1 when the mantissa is nonzero) on a dense sample.
TEST(ReferenceFp4, Ue8m0ByteAgreesWithBothFp32Formulas) {
  auto byte_of = [](float s) {
    const uint32_t b = mt::f2u(s);
    const int e = static_cast<int>((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0 ? 1 : 0);
    return std::min(254, std::max(1, e));
  };
  const float inv6 = 1.0f / 6.0f;
  std::mt19937 rng(12345);
  std::uniform_int_distribution<uint32_t> mant(0, 0x7FFFFF);
  std::vector<float> amaxes = {1e-10f, 1e-4f, 6.0f, FLT_MAX, std::nextafter(6.0f, 7.0f),
                               std::nextafter(6.0f, 0.0f)};
  for (int e = 94; e <= 254; ++e) {  // 2^-33 .. 2^127: every exponent of a floored amax
    for (uint32_t m : {0u, 1u, 0x400000u, 0x7FFFFFu}) amaxes.push_back(mt::u2f((uint32_t(e) << 23) | m));
    for (int i = 0; i < 200; ++i) amaxes.push_back(mt::u2f((uint32_t(e) << 23) | mant(rng)));
    const float six = std::ldexp(6.0f, e - 129);  // 6 * 2^k and its neighbours
    amaxes.push_back(six);
    amaxes.push_back(std::nextafter(six, 0.0f));
    amaxes.push_back(std::nextafter(six, kInf));
  }
  for (float a : amaxes) {
    if (!(a >= 1e-10f) || std::isinf(a)) continue;
    const int want = megamoe_ref::detail::fp4_ue8m0_byte(a);
    ASSERT_EQ(byte_of(a / 6.0f), want) << "amax " << a << " (0x" << std::hex << mt::f2u(a) << ")";
    ASSERT_EQ(byte_of(a * inv6), want) << "amax " << a << " (0x" << std::hex << mt::f2u(a) << ")";
  }
  EXPECT_EQ(megamoe_ref::detail::fp4_ue8m0_byte(6.0f), 127);
  EXPECT_EQ(megamoe_ref::detail::fp4_ue8m0_byte(std::nextafter(6.0f, 7.0f)), 128);
  EXPECT_EQ(megamoe_ref::detail::fp4_ue8m0_byte(1e-4f), 112);   // 1e-4/6 = 2^-15.87
  EXPECT_EQ(megamoe_ref::detail::fp4_ue8m0_byte(1e-10f), 92);   // 1e-10/6 = 2^-35.8
  EXPECT_EQ(megamoe_ref::detail::fp4_ue8m0_byte(FLT_MAX), 253);  // FLT_MAX/6 = 2^125.4
  EXPECT_EQ(megamoe_ref::detail::fp4_ue8m0_byte(kInf), 254);
}

// ---------------------------------------------------------------------------------------
// Midpoints through every fp4 format: the group's amax is chosen so that its scale is a
// known power of two (or exactly 1 times one), so the value after scaling is the input
// divided by 2^k exactly and lands on the midpoint itself.

/// How one fp4 format is called (scheme, drop-in, x_q dtype) and which tie rule it follows.
struct Fp4Config {
  const char* name;
  QuantScheme q;
  bool dropin;
  DType x_q_dt;
  bool rne;
};

QuantScheme with_rounding(QuantScheme q, Rounding r) {
  q.rounding = r;
  return q;
}

std::vector<Fp4Config> fp4_configs() {
  return {{"mxfp4", QuantScheme::mxfp4(), false, DType::kUInt8, false},
          {"mxfp4_rne", QuantScheme::mxfp4(Rounding::kNearestEven), false, DType::kInt8, true},
          {"dropin_uint8", QuantScheme::mxfp8(), true, DType::kUInt8, false},
          {"dropin_int8", QuantScheme::mxfp8(), true, DType::kInt8, false},
          {"nvfp4_static", QuantScheme::nvfp4_static(), false, DType::kUInt8, false},
          {"nvfp4_per_token", QuantScheme::nvfp4_per_token(), false, DType::kInt8, false},
          // Rounding::kDefault is the e2m1 codec's reference rule: ties toward zero.
          {"mxfp4_default_rounding", with_rounding(QuantScheme::mxfp4(), Rounding::kDefault), false, DType::kUInt8, false},
          {"nvfp4_static_default_rounding", with_rounding(QuantScheme::nvfp4_static(), Rounding::kDefault), false,
           DType::kUInt8, false}};
}

TEST(Fp4Golden, MidpointsAndNeighboursInEveryFormat) {
  // (below, at, above) codes of midpoint i under each rule.
  const int ttz[7][3] = {{0, 0, 1}, {1, 1, 2}, {2, 2, 3}, {3, 3, 4}, {4, 4, 5}, {5, 5, 6}, {6, 6, 7}};
  const int rne[7][3] = {{0, 0, 1}, {1, 2, 2}, {2, 2, 3}, {3, 4, 4}, {4, 4, 5}, {5, 6, 6}, {6, 6, 7}};
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  constexpr int64_t H = 128;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const std::vector<int> ks = dt == DType::kFloat16 ? std::vector<int>{-3, 0, 3}
                                                      : std::vector<int>{-12, 0, 9, 100};
    for (int k : ks) {
      const float p2 = std::ldexp(1.0f, k);
      // Values (before the 2^k factor) and their (ttz, rne) nibbles.
      std::vector<float> vals;
      std::vector<std::pair<int, int>> want;
      for (int i = 0; i < 7; ++i) {
        for (int o = 0; o < 3; ++o) {
          const float v = o == 1 ? mids[i] : ulp_step(dt, mids[i], o - 1);
          for (int neg = 0; neg < 2; ++neg) {
            vals.push_back(neg ? -v : v);
            const int t = ttz[i][o], r = rne[i][o];
            want.emplace_back(neg && t != 0 ? 0x8 | t : t, neg ? 0x8 | r : r);
          }
        }
      }
      const float denorm = dt == DType::kFloat32 ? mt::u2f(1u) : dt == DType::kBFloat16
                                                                       ? megamoe_ref::bf16_to_float(1)
                                                                       : megamoe_ref::half_to_float(1);
      for (const Fp4Case& c : {Fp4Case{-0.0f, 0x0, 0x8}, Fp4Case{0.0f, 0x0, 0x0}, Fp4Case{kNaN, 0x0, 0x7},
                               Fp4Case{kNegNaN, 0x0, 0x7}, Fp4Case{-6.0f, 0xF, 0xF},
                               Fp4Case{-denorm, 0x0, 0x8}}) {
        vals.push_back(c.v);
        want.emplace_back(c.ttz, c.rne);
      }
      for (const Fp4Config& cfg : fp4_configs()) {
        SCOPED_TRACE(std::string(cfg.name) + " hidden=" + megamoe::dtype_name(dt) + " k=" + std::to_string(k));
        const bool nvfp4 = cfg.q.scale2 != megamoe::Scale2::kNone;
        const int64_t G = nvfp4 ? 16 : 32;
        mt::Problem p = mt::make_problem(2, H, 2, cfg.q, dt);
        p.fp4_dropin = cfg.dropin;
        p.x_fp8_dt = cfg.x_q_dt;
        p.global_scale = p2;  // NVFP4 static: sf = 6*2^k / (6*gs) = 1, v = x / 2^k
        p.pad_dt = DType::kUInt8;
        p.pad = {0, 3};  // padded tokens are quantized all the same
        // Column of each value: slot 0 of every group holds the anchor 6 * 2^k; the last
        // group holds 2688 * 2^k, which makes the per-token scale 2^k.
        std::vector<int64_t> col;
        for (int64_t h = 0; col.size() < vals.size(); ++h) {
          if (h % G != 0) col.push_back(h);
        }
        ASSERT_LT(col.back(), H - G);
        for (int64_t t = 0; t < 2; ++t) {
          for (int64_t h = 0; h < H - G; h += G) mt::set_hidden(p, t, h, 6.0f * p2);
          for (size_t i = 0; i < vals.size(); ++i) mt::set_hidden(p, t, col[i], vals[i] * p2);
          mt::set_hidden(p, t, H - G, 2688.0f * p2);
        }
        const megamoe_ref::Result r = staged(p);
        const int64_t words = H / (4 * G);
        for (int64_t t = 0; t < 2; ++t) {
          for (int64_t g = 0; g < H / G - 1; ++g) {
            // MXFP4: amax 6 * 2^k -> e = 127 + k; NVFP4: sf = e4m3(1.0) = 0x38.
            EXPECT_EQ(sf_byte(r, words, t, g), nvfp4 ? 0x38 : 127 + k) << "group " << g;
          }
          if (cfg.q.scale2 == megamoe::Scale2::kPerToken) {
            EXPECT_EQ(r.x_scales[static_cast<size_t>(t)], p2);
            EXPECT_EQ(sf_byte(r, words, t, H / G - 1), 0x7E);  // 2688 * 2^k / (6 * 2^k) = 448
          }
          for (size_t i = 0; i < vals.size(); ++i) {
            EXPECT_EQ(nib(r, H, t, col[i]), cfg.rne ? want[i].second : want[i].first)
                << "t=" << t << " value " << vals[i] << " * 2^" << k;
          }
          EXPECT_EQ(nib(r, H, t, 0), 0x7);  // the anchor: 6
        }
      }
    }
  }
}

// amax just above 6 * 2^k gives e = 128 + k, so values land on the midpoints at half scale.
TEST(Fp4Golden, Mxfp4ScaleStepsAndTiesAtOtherScales) {
  for (bool rne : {false, true}) {
    SCOPED_TRACE(rne ? "rne" : "ttz");
    mt::Problem p = mt::make_problem(1, 128, 1, QuantScheme::mxfp4(rne ? Rounding::kNearestEven
                                                                      : Rounding::kTiesTowardZero));
    const float above6 = std::nextafter(6.0f, kInf), above12 = std::nextafter(12.0f, kInf);
    fill_group(p, 0, 0, {above6, 6.0f, 5.0f, 3.5f, 2.5f, 0.5f, -0.5f, 1.5f});  // r = 1/2
    fill_group(p, 0, 1, {7.0f, -7.0f, 3.0f, 1.0f});                           // 7/6 -> r = 1/2
    fill_group(p, 0, 2, {10.0f, 11.0f, -9.0f, 12.0f});                        // 12/6 = 2 exactly
    fill_group(p, 0, 3, {above12, 10.0f, 7.0f, 3.0f, 1.0f});                  // r = 1/4
    const auto r = staged(p);
    EXPECT_EQ(r.sf_words[0], 0x81808080u);
    // 3.0000002, 3, 2.5 tie, 1.75 tie, 1.25 tie, 0.25 tie, -0.25 tie, 0.75 tie
    EXPECT_EQ(nibs(r, 128, 0, 0, 8), rne ? (std::vector<int>{5, 5, 4, 4, 2, 0, 8, 2})
                                         : (std::vector<int>{5, 5, 4, 3, 2, 0, 0, 1}));
    // 3.5 tie, -3.5 tie, 1.5, 0.5
    EXPECT_EQ(nibs(r, 128, 0, 32, 4), rne ? (std::vector<int>{6, 0xE, 3, 1})
                                          : (std::vector<int>{5, 0xD, 3, 1}));
    // 5 tie, 5.5, -4.5, 6
    EXPECT_EQ(nibs(r, 128, 0, 64, 4), (std::vector<int>{6, 7, 0xE, 7}));
    // 3.0000005, 2.5 tie, 1.75 tie, 0.75 tie, 0.25 tie
    EXPECT_EQ(nibs(r, 128, 0, 96, 5), rne ? (std::vector<int>{5, 4, 4, 2, 0})
                                          : (std::vector<int>{5, 4, 3, 1, 0}));
  }
}

// +-Inf makes the group's exponent 255 -> clamped 254 (r = 2^-127); FLT_MAX gives 253;
// NaN is ignored by amax; an all-NaN group and an all -0.0 group take the floor.
TEST(Fp4Golden, Mxfp4InfinityNaNAndExtremes) {
  for (bool rne : {false, true}) {
    SCOPED_TRACE(rne ? "rne" : "ttz");
    mt::Problem p = mt::make_problem(1, 128, 1, QuantScheme::mxfp4(rne ? Rounding::kNearestEven
                                                                      : Rounding::kTiesTowardZero));
    // 1e38 * 2^-127 = 0.588, 3e38 * 2^-127 = 1.763, -6 * 2^-127 = -tiny.
    fill_group(p, 0, 0, {kInf, -kInf, 1e38f, -3e38f, -6.0f, kNaN});
    for (int64_t h = 32; h < 64; ++h) mt::set_hidden(p, 0, h, h % 2 ? kNaN : kNegNaN);
    fill_group(p, 0, 2, {FLT_MAX, -FLT_MAX / 2});  // r = 2^-126: 3.9999998 -> 4, -2
    for (int64_t h = 96; h < 128; ++h) mt::set_hidden(p, 0, h, -0.0f);
    const auto r = staged(p);
    EXPECT_EQ(r.sf_words[0], 0x70FD70FEu);
    EXPECT_EQ(nibs(r, 128, 0, 0, 7), rne ? (std::vector<int>{7, 0xF, 1, 0xC, 8, 7, 0})
                                         : (std::vector<int>{7, 0xF, 1, 0xC, 0, 0, 0}));
    EXPECT_EQ(nibs(r, 128, 0, 32, 2), rne ? (std::vector<int>{7, 7}) : (std::vector<int>{0, 0}));
    EXPECT_EQ(nibs(r, 128, 0, 64, 3), (std::vector<int>{6, 0xC, 0}));
    EXPECT_EQ(r.x_q[48], rne ? 0x88 : 0x00);  // columns 96, 97: -0.0
  }
}

// Amax floor on small groups: zero, all -0.0, 1e-6 and 5e-5 groups under 1e-4 and 1e-10.
// 1e-4: every group floors to 1e-4 -> e = 112 (r = 2^15): 1e-6 -> 0.033 -> 0, 5e-5 ->
// 1.64 -> 1.5. 1e-10: zero groups e = 92; 1e-6 -> e = 105 (r = 2^22): 4.19 -> 4;
// 5e-5 -> e = 111 (r = 2^16): 3.28 -> 3.
TEST(Fp4Golden, Mxfp4AmaxFloorOnSmallGroups) {
  for (float floor : {1e-4f, 1e-10f}) {
    for (bool rne : {false, true}) {
      SCOPED_TRACE(std::string(rne ? "rne" : "ttz") + " floor " + std::to_string(floor));
      const QuantScheme q = QuantScheme::mxfp4(rne ? Rounding::kNearestEven : Rounding::kTiesTowardZero)
                                .with_amax_floor(floor);
      mt::Problem p = mt::make_problem(1, 128, 1, q, DType::kBFloat16);
      for (int64_t h = 32; h < 64; ++h) mt::set_hidden(p, 0, h, -0.0f);
      fill_group(p, 0, 2, {1e-6f, -1e-6f});
      fill_group(p, 0, 3, {5e-5f, -5e-5f});
      const auto r = staged(p);
      const bool f4 = floor == 1e-4f;
      EXPECT_EQ(r.sf_words[0], f4 ? 0x70707070u : 0x6F695C5Cu);
      EXPECT_EQ(nibs(r, 128, 0, 0, 2), (std::vector<int>{0, 0}));
      EXPECT_EQ(nibs(r, 128, 0, 32, 2), rne ? (std::vector<int>{8, 8}) : (std::vector<int>{0, 0}));
      EXPECT_EQ(nibs(r, 128, 0, 64, 2), f4 ? (rne ? std::vector<int>{0, 8} : std::vector<int>{0, 0})
                                           : (std::vector<int>{6, 0xE}));
      EXPECT_EQ(nibs(r, 128, 0, 96, 2), f4 ? (std::vector<int>{3, 0xB}) : (std::vector<int>{5, 0xD}));
    }
  }
}

// The fp8 formats under both floors, groups zero, 1e-6, 1e-9 and 5e-5 (value at slot 0, its
// negative at slot 1), G = 32 and G = 128 (one group per 128 columns: H = 512).
// UE8M0 1e-4: all e = 105 (r = 2^22): 4.19 -> 4 (0x48), 0.0042 -> 2^-8 (0x02), 209.7 -> 208
// (0x75). UE8M0 1e-10: e = 85, 99, 89, 104: 268 -> 256 (0x78), 275 -> 288 (0x79), 419 ->
// 416 (0x7D). fp32 1e-4: s = 0x346FACAD, r = 4480000: 4.48 -> 4.5, 0.0045 -> 0x02, 224.
// fp32 1e-10: each group's own s, x * (1/s) = 448 (0x7E); the zero group s = 1e-10 * C.
TEST(Fp8Golden, AmaxFloorOnSmallGroups) {
  const float vals[4] = {0.0f, 1e-6f, 1e-9f, 5e-5f};
  for (int64_t G : {32, 128}) {
    for (bool ue8m0 : {true, false}) {
      for (float floor : {1e-4f, 1e-10f}) {
        SCOPED_TRACE(mt::scheme_tag(mt::scheme(ue8m0, G).with_amax_floor(floor)));
        mt::Problem p = mt::make_problem(2, 4 * G, 1, mt::scheme(ue8m0, G).with_amax_floor(floor));
        for (int64_t g = 0; g < 4; ++g) fill_group(p, 0, g, {vals[g], -vals[g]});
        const auto r = staged(p);
        const bool f4 = floor == 1e-4f;
        const std::vector<int> want_q = ue8m0 ? (f4 ? std::vector<int>{0x00, 0x48, 0x02, 0x75}
                                                    : std::vector<int>{0x00, 0x78, 0x79, 0x7D})
                                              : (f4 ? std::vector<int>{0x00, 0x49, 0x02, 0x76}
                                                    : std::vector<int>{0x00, 0x7E, 0x7E, 0x7E});
        for (int64_t g = 0; g < 4; ++g) {
          EXPECT_EQ(r.x_q[static_cast<size_t>(g * G)], want_q[g]) << "group " << g;
          EXPECT_EQ(r.x_q[static_cast<size_t>(g * G + 1)], want_q[g] | 0x80) << "group " << g;
        }
        if (ue8m0) {
          EXPECT_EQ(r.sf_words[0], f4 ? 0x69696969u : 0x68596355u);
          EXPECT_EQ(r.sf_words[1], f4 ? 0x69696969u : 0x55555555u);
        } else {
          const uint32_t want_s[4] = {0x2A7B5124u, 0x31196446u, 0x2C1D12B6u, 0x33EFACADu};
          for (int64_t g = 0; g < 4; ++g) {
            EXPECT_EQ(mt::f2u(r.sf_f32[static_cast<size_t>(g)]), f4 ? 0x346FACADu : want_s[g]);
            EXPECT_EQ(mt::f2u(r.sf_f32[static_cast<size_t>(4 + g)]), f4 ? 0x346FACADu : want_s[0]);
          }
        }
      }
    }
  }
}

// The drop-in rule: the default scheme with a uint8/int8 x_q of width H/2 stages MXFP4 with
// ttz ties, byte for byte what mxfp4() stages (shared_x_sf included).
TEST(Fp4Golden, DropInEqualsExplicitMxfp4) {
  mt::Problem p = mt::make_problem(70, 256, 4, QuantScheme::mxfp4(), DType::kBFloat16);
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t h = 0; h < p.H; ++h) {
      mt::set_hidden(p, t, h, std::ldexp(static_cast<float>((t * 31 + h * 7) % 29) - 14.0f, static_cast<int>(t % 9) - 4) / 4);
    }
  }
  p.bm = 32;
  staged(p);  // each call against the reference (both map to the same reference format)
  // and the library's own bytes of the two calls against each other
  mt::Call want = mt::make_call(p, mt::Layouts{});
  megamoe::prepare_inputs(want.args);
  for (DType dt : {DType::kUInt8, DType::kInt8}) {
    mt::Problem d = p;
    d.q = QuantScheme::mxfp8();
    d.fp4_dropin = true;
    d.x_fp8_dt = dt;
    staged(d);
    mt::Call got = mt::make_call(d, mt::Layouts{});
    megamoe::prepare_inputs(got.args);
    EXPECT_EQ(got.x_q.mem, want.x_q.mem);
    EXPECT_EQ(got.x_sf.mem, want.x_sf.mem);
    ASSERT_TRUE(got.shared && want.shared);
    EXPECT_EQ(got.shared->mem, want.shared->mem);
  }
}

// ---------------------------------------------------------------------------------------
// NVFP4.

// Static, gs = 1: sf = e4m3_rn(clamp(amax / 6, 2^-9, 448)), v = x / sf.
//  g0 amax 6 -> sf 1 (0x38): 6, 5 (tie -> 4), 3.5 (tie -> 3).
//  g1 amax 2688 -> sf 448 (0x7E): 6, 5 (tie), -6.
//  g2 amax 5376 -> 896 clamped to 448: 12 (above 6 after scaling -> 6), 6, 1.
//  g3 amax 6 * 2^-9 -> sf 2^-9 (0x01), the lower clamp end reached exactly: 6, 3.
//  g4 amax 1e-6 -> 1.7e-7 clamped up to 2^-9 (no 1e-4 floor): 5e-4 -> 0.
//  g5 zero group -> 0 clamped to 2^-9.
//  g6 amax 6.375 -> 1.0625, an e4m3 tie -> 1.0 (even): 6.375 -> 6, 6.
//  g7 amax 6.5 -> 1.083 -> 1.125 (0x39): 5.78 -> 6, 3.25 / 1.125 = 2.89 -> 3.
// The scheme's amax floor plays no part (SPEC: "no 1e-4 floor"): 1e-10 gives the same bytes.
TEST(Nvfp4Golden, StaticScalesAndClampEnds) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (float floor : {1e-4f, 1e-10f}) {
      SCOPED_TRACE(std::string(megamoe::dtype_name(dt)) + " floor " + std::to_string(floor));
      mt::Problem p = mt::make_problem(1, 128, 1, QuantScheme::nvfp4_static().with_amax_floor(floor), dt);
      p.global_scale = 1.0f;
      fill_group(p, 0, 0, {6.0f, 5.0f, 3.5f});
      fill_group(p, 0, 1, {2688.0f, 2240.0f, -2688.0f});
      fill_group(p, 0, 2, {5376.0f, 2688.0f, 448.0f});
      fill_group(p, 0, 3, {6.0f / 512, 3.0f / 512});
      fill_group(p, 0, 4, {1e-6f, -1e-6f});
      fill_group(p, 0, 6, {6.375f, 6.0f});
      fill_group(p, 0, 7, {6.5f, 3.25f});
      const auto r = staged(p);
      EXPECT_EQ(r.sf_words[0], 0x017E7E38u);
      EXPECT_EQ(r.sf_words[1], 0x39380101u);
      const std::vector<std::vector<int>> want = {{7, 6, 5}, {7, 6, 0xF}, {7, 7, 2}, {7, 5},
                                                  {0, 0},    {0, 0},      {7, 7},    {7, 5}};
      for (int64_t g = 0; g < 8; ++g) {
        EXPECT_EQ(nibs(r, 128, 0, g * 16, static_cast<int64_t>(want[g].size())), want[g]) << "group " << g;
      }
    }
  }
}

/// A global scale, the first values of every group (the rest zero) and what they give.
struct GsCase {
  const char* why;
  float gs;
  std::vector<float> vals;
  int sf;
  std::vector<int> codes;
};

// Extreme global scales (SPEC: sf = e4m3_rn(clamp(amax / fl(6 gs), 2^-9, 448)), v = x /
// fl(sf gs), IEEE everywhere, no flush-to-zero). Every group holds the same values so
// every group has a nonzero amax.
TEST(Nvfp4Golden, StaticExtremeGlobalScales) {
  const GsCase cases[] = {
      {"tiny gs: amax/(6gs) = 1.7e29 clamps to 448; d = 4.48e-28", 1e-30f, {1.0f, 1e-28f, -5e-28f}, 0x7E, {7, 0, 0xA}},
      {"huge gs: 5e-4 clamps to 2^-9; d = 1.95e27", 1e30f, {1.0f, 3e27f}, 0x01, {0, 3}},
      {"gs = 0: amax/0 = Inf clamps to 448; d = 0, x/0 = +-Inf, 0/0 = NaN -> 0", 0.0f,
       {1.0f, -2.0f, 0.0f, -0.0f}, 0x7E, {7, 0xF, 0, 0}},
      {"subnormal gs 1e-40 (not flushed): d = 448 gs = 4.48e-38", 1e-40f, {1.0f, 1e-38f, 5e-38f}, 0x7E, {7, 0, 2}},
      {"gs = +Inf: 1/Inf = 0 clamps to 2^-9; d = Inf, v = 0", kInf, {1.0f, -3.0f}, 0x01, {0, 0}},
      {"gs = 2^-20: amax 6 -> sf 2^20 clamps to 448; 5 * 2^-12 / (448 * 2^-20) = 2.86", std::ldexp(1.0f, -20),
       {6.0f, std::ldexp(5.0f, -12)}, 0x7E, {7, 5}},
      {"gs = 2^-20, amax 1e-6 (no floor: 1e-4 would give sf 18): 0.1748 -> 0.171875; 6.1, -3.05", std::ldexp(1.0f, -20),
       {1e-6f, -5e-7f}, 0x23, {7, 0xD}},
  };
  for (const GsCase& c : cases) {
    SCOPED_TRACE(c.why);
    mt::Problem p = mt::make_problem(2, 128, 1, QuantScheme::nvfp4_static());
    p.global_scale = c.gs;
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t g = 0; g < 8; ++g) {
        int64_t h = g * 16;
        for (float v : c.vals) mt::set_hidden(p, t, h++, v);
      }
    }
    const auto r = staged(p);
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t g = 0; g < 8; ++g) {
        EXPECT_EQ(sf_byte(r, 2, t, g), c.sf) << "group " << g;
        EXPECT_EQ(nibs(r, 128, t, g * 16, static_cast<int64_t>(c.codes.size())), c.codes) << "group " << g;
      }
    }
  }
}

// gs = 0 on an all-zero group is 0 / 0: SPEC's clamp does not say where a NaN quotient
// goes. The reference takes the fminf/fmaxf reading (NaN -> 2^-9, byte 0x01); the values
// are 0/0 = NaN -> 0 whatever the byte. This pins the library's choice.
TEST(Nvfp4Golden, StaticZeroGlobalScaleOnZeroGroup) {
  mt::Problem p = mt::make_problem(1, 128, 1, QuantScheme::nvfp4_static());
  p.global_scale = 0.0f;
  fill_group(p, 0, 1, {-1.0f});
  const auto r = staged(p);
  EXPECT_EQ(r.sf_words[0], 0x01017E01u);
  EXPECT_EQ(nibs(r, 128, 0, 0, 2), (std::vector<int>{0, 0}));
  EXPECT_EQ(nib(r, 128, 0, 16), 0xF);  // -1 / 0 = -Inf -> -6
}

// NVFP4 online: gs = fl(max(A, floor) / 2688) over every element of hidden_states (padded
// rows included, NaN skipped, Inf counts; floor 0: 1 where A < 2^-100), written to
// global_scale; every group is NVFP4 static's under gs. H = 128, T = 3.
TEST(Nvfp4Golden, OnlineGlobalScaleEdges) {
  struct Case {
    const char* what;
    float floor;
    std::function<void(mt::Problem&)> fill;
    uint32_t gs;       // expected global scale bits
    uint32_t word0;    // expected first scale word of token 0 (0: not checked)
  };
  const Case cases[] = {
      {"zeros, floor 1e-4", 1e-4f, [](mt::Problem&) {}, 0x331FC873u /* fl(1e-4 / 2688) */, 0x01010101u},
      {"zeros, floor 0", 0.0f, [](mt::Problem&) {}, 0x3F800000u, 0x01010101u},
      // One huge value on a padded row: A = 2688 * 2^10, gs = 2^10; its group's byte 0x7E
      // (quotient 448), the others' the clamp's lower end.
      {"one huge value (padded row)", 1e-4f, [](mt::Problem& p) { mt::set_hidden(p, 2, 5, -2688.0f * 1024.0f); },
       0x44800000u, 0x01010101u},
      // gs = Inf: every quotient is 0 or NaN (clamped to 2^-9), every code 0.
      {"Inf in one element", 1e-4f, [](mt::Problem& p) { mt::set_hidden(p, 1, 77, kInf); }, 0x7F800000u, 0x01010101u},
      // A = 1344 (NaN skipped): gs = 0.5 exactly; group 0 of token 0: 1344 / 3 = 448 -> 0x7E.
      {"NaN rows", 1e-4f,
       [](mt::Problem& p) {
         for (int64_t h = 0; h < 128; ++h) mt::set_hidden(p, 1, h, h % 2 ? kNaN : kNegNaN);
         fill_group(p, 0, 0, {1344.0f, kNaN, -3.0f});
       },
       0x3F000000u, 0x0101017Eu},
      {"all NaN, floor 0", 0.0f,
       [](mt::Problem& p) {
         for (int64_t t = 0; t < 3; ++t) {
           for (int64_t h = 0; h < 128; ++h) mt::set_hidden(p, t, h, kNaN);
         }
       },
       0x3F800000u, 0x01010101u},
      // Below 2^-100 with floor 0: the unit scale; with floor 2^-100: fl(2^-100 / 2688).
      {"tiny, floor 0", 0.0f, [](mt::Problem& p) { mt::set_hidden(p, 0, 3, 0x1p-110f); }, 0x3F800000u, 0x01010101u},
      {"tiny, floor 2^-100", 0x1p-100f, [](mt::Problem& p) { mt::set_hidden(p, 0, 3, 0x1p-110f); }, 0x07C30C31u, 0},
      // fp32 subnormals, floor 0, A = 2^-140 < 2^-100: the unit scale.
      {"subnormals, floor 0", 0.0f,
       [](mt::Problem& p) {
         for (int64_t h = 0; h < 128; ++h) mt::set_hidden(p, 0, h, (h % 2 ? -1.0f : 1.0f) * 0x1p-140f * (h % 7));
       },
       0x3F800000u, 0x01010101u},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    mt::Problem p = mt::make_problem(3, 128, 2, QuantScheme::nvfp4_online().with_amax_floor(c.floor));
    p.pad_dt = DType::kUInt8;
    p.pad = {0, 0, 1};
    c.fill(p);
    const auto r = staged(p);
    EXPECT_EQ(mt::f2u(r.global_scale), c.gs);
    if (c.word0 != 0) {
      EXPECT_EQ(r.sf_words[0], c.word0);
    }
  }
  // Subnormal inputs of every dtype at the default floor and at 0 (A above 2^-100 for
  // fp16's 2^-24: an ordinary gs, then static's groups).
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (float floor : {1e-4f, 0.0f}) {
      mt::Problem p = mt::make_problem(1, 256, 1, QuantScheme::nvfp4_online().with_amax_floor(floor), dt);
      const uint32_t sign = dt == DType::kFloat32 ? 0x80000000u : 0x8000u;
      for (int64_t h = 0; h < 256; ++h) mt::set_hidden_bits(p, 0, h, static_cast<uint32_t>(h % 5) | (h % 2 ? sign : 0u));
      SCOPED_TRACE(std::to_string(static_cast<int>(dt)) + " floor " + std::to_string(floor));
      (void)staged(p);
    }
  }
}

// A single token, and T = 0 (nothing written: global_scale keeps its poison, which the
// harness checks under both poisons).
TEST(Nvfp4Golden, OnlineSingleTokenAndZeroTokens) {
  mt::Problem one = mt::make_problem(1, 128, 1, QuantScheme::nvfp4_online(), DType::kBFloat16);
  fill_group(one, 0, 3, {6.0f, -2.0f, 0.5f});
  const auto r = staged(one);
  EXPECT_EQ(mt::f2u(r.global_scale), mt::f2u(6.0f / 2688.0f));
  (void)staged(mt::make_problem(0, 128, 1, QuantScheme::nvfp4_online()));
}

/// The library's online bytes equal its static bytes under the global scale the online
/// call wrote (x_q and x_sf), for every input dtype, dense and odd layouts.
TEST(Nvfp4Golden, OnlineEqualsStaticUnderItsScale) {
  std::mt19937 rng(47);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (float floor : {1e-4f, 0.0f}) {
      for (bool odd : {false, true}) {
        SCOPED_TRACE(std::to_string(static_cast<int>(dt)) + (odd ? " odd" : " dense") + " floor " + std::to_string(floor));
        mt::Problem p = mt::make_problem(37, 512, 3, QuantScheme::nvfp4_online().with_amax_floor(floor), dt);
        for (int64_t t = 0; t < p.T; ++t) {
          for (int64_t h = 0; h < p.H; ++h) mt::set_hidden(p, t, h, nd(rng) * std::ldexp(1.0f, static_cast<int>(t % 9) - 4));
        }
        mt::set_hidden(p, 11, 100, kNaN);
        const mt::Layouts l = odd ? mt::odd_layouts() : mt::Layouts{};
        mt::Call on = mt::make_call(p, l);
        megamoe::prepare_inputs(on.args);
        float gs;
        std::memcpy(&gs, on.gs_out->ptr(0), sizeof gs);
        mt::Problem s = p;
        s.q = QuantScheme::nvfp4_static();
        s.global_scale = gs;
        mt::Call st = mt::make_call(s, l);
        megamoe::prepare_inputs(st.args);
        EXPECT_TRUE(mt::assert_bitwise_equal("x_q", on.x_q, st.x_q.mem));
        EXPECT_TRUE(mt::assert_bitwise_equal("x_sf", on.x_sf, st.x_sf.mem));
        EXPECT_TRUE(mt::stage_and_compare(p, l));
      }
    }
  }
}

// MXFP8 e5m2 (FlashInfer's mxfp8_e5m2): e = ue8m0(fl(max(amax, floor) * fl(1/57344))),
// v = x * 2^(127-e), e5m2 RNE satfinite. H = 128, one word of four UE8M0 bytes.
//  g0: amax 57344 -> s = 1.0 exactly (57344 * fl(1/57344) = 448 * fl(1/448) rounds to 1),
//      e = 127: 57344 -> 0x7B, 1.125 (tie 1.0 / 1.25) -> 0x3C, 1.375 (tie) -> 0x3E,
//      53248 (tie 49152 / 57344) -> 0x7A, 2^-16 -> 0x01, 2^-17 (tie with 0) -> 0x00.
//  g1: amax 7 -> s = 2^-13 exactly, e = 114: 7 -> 57344 (0x7B), 3.5 -> 28672 (0x77),
//      NaN -> 0x7F, 1e-9 -> 8.2e-6, above half of 2^-16 -> 0x01.
//  g2: zeros -> the floor: s = fl(1e-4 * fl(1/57344)) (0x30EFB6AD), e = 98; -0.0 -> 0x80.
//  g3: +Inf -> s = Inf, e = 254: Inf -> 0x7B (satfinite), -Inf -> 0xFB, 1 -> 0.
TEST(Fp8Golden, Mxfp8E5m2Groups) {
  mt::Problem p = mt::make_problem(1, 128, 1, QuantScheme::mxfp8_e5m2());
  fill_group(p, 0, 0, {57344.0f, -57344.0f, 1.125f, 1.375f, 53248.0f, 0x1p-16f, 0x1p-17f});
  fill_group(p, 0, 1, {7.0f, -7.0f, 3.5f, kNaN, 1e-9f});
  fill_group(p, 0, 2, {0.0f, -0.0f});
  fill_group(p, 0, 3, {kInf, -kInf, 1.0f});
  const auto r = staged(p);
  EXPECT_EQ(r.sf_words[0], 0xFE62727Fu);
  const std::vector<int> want[4] = {{0x7B, 0xFB, 0x3C, 0x3E, 0x7A, 0x01, 0x00},
                                    {0x7B, 0xFB, 0x77, 0x7F, 0x01},
                                    {0x00, 0x80},
                                    {0x7B, 0xFB, 0x00}};
  for (int g = 0; g < 4; ++g) {
    for (size_t i = 0; i < want[g].size(); ++i) {
      EXPECT_EQ(r.x_q[static_cast<size_t>(32 * g) + i], want[g][i]) << "group " << g << " element " << i;
    }
  }
}

// Zero in never comes out NaN: at each format's lowest accepted amax floor (any positive
// floor for the UE8M0 formats, 2^-100 for fp32 scales and NVFP4 per-token), rows of +0.0
// and of -0.0 encode as zero codes with finite scales (no NaN or zero fp32 scale, a finite
// nonzero per-token scale), and a row of tiny values (fp32 subnormals) gives no NaN byte. Below the
// bound such floors are rejected (Validation.AmaxFloorBounds).
TEST(FormatsGolden, ZeroGroupsAtTheLowestFloors) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const QuantScheme schemes[] = {
      QuantScheme::mxfp8().with_amax_floor(tiny),          QuantScheme::fp8_ue8m0_g128().with_amax_floor(tiny),
      QuantScheme::mxfp4().with_amax_floor(tiny),          QuantScheme::mxfp4(Rounding::kNearestEven).with_amax_floor(tiny),
      QuantScheme::fp8_fp32_g128().with_amax_floor(0x1p-100f), QuantScheme::fp8_fp32_g32().with_amax_floor(0x1p-100f),
      QuantScheme::nvfp4_per_token().with_amax_floor(0x1p-100f), QuantScheme::mxfp8_e5m2().with_amax_floor(tiny)};
  for (const QuantScheme& q : schemes) {
    SCOPED_TRACE(megamoe::to_string(q));
    const bool fp4 = q.elem == megamoe::QuantElem::kFloat4E2M1;
    mt::Problem p = mt::make_problem(3, 512, 1, q);  // four groups of 128 fill a packed scale word
    for (int64_t h = 0; h < 512; ++h) {
      mt::set_hidden(p, 1, h, -0.0f);
      mt::set_hidden(p, 2, h, h % 3 == 0 ? 0.0f : (h % 2 ? 0x1p-140f : -0x1p-149f));
    }
    const auto r = staged(p);  // equal to the independent reference, dense and odd layouts
    const size_t row_bytes = r.x_q.size() / 3;
    for (size_t i = 0; i < r.x_q.size(); ++i) {
      if (i < 2 * row_bytes) {
        // Rows of zeros: every code's magnitude zero (fp8 bytes 0x00 / 0x80, e2m1 nibbles 0 / 8).
        EXPECT_EQ(r.x_q[i] & (fp4 ? 0x77 : 0x7F), 0) << "x_q byte " << i;
      } else if (!fp4) {
        // Tiny values: no NaN byte (e4m3 0x7F; e5m2 0x7D-0x7F).
        EXPECT_LT(r.x_q[i] & 0x7F, q.elem == megamoe::QuantElem::kFloat8E5M2 ? 0x7C : 0x7F) << "x_q byte " << i;
      }
    }
    if (q.scale == megamoe::ScaleType::kFloat32) {
      for (float s : r.sf_f32) EXPECT_TRUE(std::isfinite(s) && s > 0.0f) << s;
    } else {
      for (uint32_t w : r.sf_words) {
        for (int b = 0; b < 4; ++b) EXPECT_NE((w >> (8 * b)) & 0x7Fu, 0x7Fu) << std::hex << w;  // no NaN byte
      }
    }
    for (float s : r.x_scales) EXPECT_TRUE(std::isfinite(s) && s > 0.0f) << s;
  }
}

// Amax floor 0 (FlashInfer's `amax > 0 ? amax / 448 : 1`; CONTRACT.md "Amax floor 0"), every
// format that reads a floor, fp32 and bf16 input, H = 512:
//  row 0 +0.0, row 1 -0.0, row 2 NaN of both signs: the unit scale everywhere (UE8M0 byte
//    127, fp32 scale 1.0, pts 1.0 with scale bytes 0); codes: zeros (fp8 0x00 / 0x80,
//    e2m1 by its tie rule), NaN -> the codec's NaN (fp8 0x7F, e2m1 rne 0x7, ttz 0x0).
//  row 3, mixed groups: g0 zero -> unit; g1 {1.0, -0.5} as under any floor <= 1 (UE8M0
//    e4m3 119, e5m2 112, MXFP4 125; fp32 fl(1/448) = 0x3B124925); g2 the input's smallest
//    subnormal (2^-149 fp32: s == 0 exactly; 2^-133 bf16): UE8M0 byte 1 by the clamp (the
//    unit scale is for amax 0 alone), fp32 scale 1.0 (s <= 2^-128 has no finite reciprocal),
//    zero codes (but bf16's under UE8M0 fp8); g3 {2^-119}: UE8M0 byte 1 (MXFP4: 2^-119 / 6
//    is normal, byte 6); fp32 s = 0x00249249 (subnormal, above 2^-128: reciprocal finite),
//    the value 448.00003 -> 0x7E.
//  row 4 (NVFP4 per-token): max 2^-101, below 2^-100 -> pts 1.0, all zero; row 5 max
//    exactly 2^-100 -> pts = fl(2^-100 / 2688) (0x07C30C31), as floor 2^-100 gives.
TEST(FormatsGolden, AmaxFloorZeroGivesTheUnitScale) {
  const QuantScheme schemes[] = {
      QuantScheme::mxfp8(),         QuantScheme::fp8_ue8m0_g128(), QuantScheme::fp8_fp32_g128(),
      QuantScheme::fp8_fp32_g32(),  QuantScheme::mxfp8_e5m2(),     QuantScheme::mxfp4(),
      QuantScheme::mxfp4(Rounding::kNearestEven), QuantScheme::nvfp4_per_token()};
  for (const DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (const QuantScheme& q0 : schemes) {
      const QuantScheme q = q0.with_amax_floor(0.0f);
      SCOPED_TRACE(megamoe::to_string(q) + " " + megamoe::dtype_name(dt));
      EXPECT_NO_THROW(megamoe::check_scheme(q));
      EXPECT_EQ(megamoe::scheme_name(q), megamoe::scheme_name(q0) + "+floor=0");
      const bool fp4 = q.elem == megamoe::QuantElem::kFloat4E2M1;
      const bool fp32 = q.scale == megamoe::ScaleType::kFloat32;
      const bool e5m2 = q.elem == megamoe::QuantElem::kFloat8E5M2;
      const bool rne = q.rounding == Rounding::kNearestEven;
      const bool per_token = q.scale2 == megamoe::Scale2::kPerToken;
      const int64_t H = 512, T = 6;
      mt::Problem p = mt::make_problem(T, H, 1, q, dt);
      const int64_t G = p.format().G;
      const float sub = dt == DType::kFloat32 ? 0x1p-149f : 0x1p-133f;
      for (int64_t h = 0; h < H; ++h) {
        mt::set_hidden(p, 1, h, -0.0f);
        mt::set_hidden(p, 2, h, h % 2 ? kNaN : kNegNaN);
        mt::set_hidden(p, 4, h, h % 3 ? 0x1p-101f : -0x1p-102f);
        mt::set_hidden(p, 5, h, h == 7 ? -0x1p-100f : 0x1p-103f);
      }
      fill_group(p, 3, 1, {1.0f, -0.5f});
      fill_group(p, 3, 2, {sub, -sub});
      fill_group(p, 3, 3, {0x1p-119f});
      const auto r = staged(p);  // bitwise against the reference, dense and odd layouts
      const int64_t wpr = p.sf_cols();
      auto scale_bits = [&](int64_t t, int64_t g) -> uint32_t {
        return fp32 ? mt::f2u(r.sf_f32[static_cast<size_t>(t * (H / G) + g)])
                    : static_cast<uint32_t>(sf_byte(r, wpr, t, g));
      };
      auto code = [&](int64_t t, int64_t h) -> int {
        return fp4 ? nib(r, H, t, h) : r.x_q[static_cast<size_t>(t * H + h)];
      };
      const uint32_t unit = fp32 ? 0x3F800000u : per_token ? 0u : 127u;
      for (int64_t t = 0; t < 3; ++t) {
        for (int64_t g = 0; g < H / G; ++g) EXPECT_EQ(scale_bits(t, g), unit) << "row " << t << " group " << g;
        for (int64_t h = 0; h < H; ++h) {
          const int want = t == 0   ? 0
                           : t == 1 ? (fp4 ? (rne ? 0x8 : 0x0) : 0x80)
                                    : (fp4 ? (rne ? 0x7 : 0x0) : 0x7F);
          ASSERT_EQ(code(t, h), want) << "row " << t << " column " << h;
        }
      }
      if (per_token) {
        for (int64_t t : {0, 1, 2, 4}) EXPECT_EQ(mt::f2u(r.x_scales[static_cast<size_t>(t)]), 0x3F800000u) << t;
        EXPECT_EQ(mt::f2u(r.x_scales[3]), 0x39C30C31u);  // fl(1 / 2688)
        EXPECT_EQ(mt::f2u(r.x_scales[5]), 0x07C30C31u);  // fl(2^-100 / 2688)
        for (int64_t h = 0; h < H; ++h) ASSERT_EQ(nib(r, H, 4, h), 0) << h;
        for (int64_t g = 0; g < H / G; ++g) EXPECT_EQ(sf_byte(r, wpr, 4, g), 0) << g;
        EXPECT_EQ(sf_byte(r, wpr, 5, 0), 0x7E);  // 2^-100 / fl(6 pts) -> 448
        continue;
      }
      EXPECT_EQ(scale_bits(3, 0), unit);
      EXPECT_EQ(scale_bits(3, 1), fp32 ? 0x3B124925u : e5m2 ? 112u : fp4 ? 125u : 119u);
      EXPECT_EQ(scale_bits(3, 2), fp32 ? 0x3F800000u : 1u);
      EXPECT_EQ(scale_bits(3, 3), fp32 ? 0x00249249u : fp4 ? 6u : 1u);
      if (fp32 || fp4 || dt == DType::kFloat32) {  // (bf16's 2^-133 times 2^126 is an fp8 subnormal)
        EXPECT_EQ(code(3, 2 * G), 0);
        EXPECT_EQ(code(3, 2 * G + 1), fp4 ? (rne ? 0x8 : 0x0) : 0x80);
      }
      if (fp32) {
        EXPECT_EQ(code(3, 3 * G), 0x7E);
      }
    }
  }
  // A negative zero floor is the same scheme (QuantScheme's ==) and gives the same bytes.
  mt::Problem p = mt::make_problem(2, 256, 1, QuantScheme::fp8_fp32_g128().with_amax_floor(-0.0f));
  fill_group(p, 1, 0, {0x1p-130f});
  const auto r = staged(p);
  for (float s : r.sf_f32) EXPECT_EQ(mt::f2u(s), 0x3F800000u);
}

// Per-token: pts = max(row_amax, floor) / 2688 -> x_scales; sf = e4m3(amax / fl(6 pts))
// (satfinite, NaN -> 0x7F); inv = sf > 0 ? 1 / fl(sf pts) : 0; v = x * inv.
//  row 0: amax 2688 -> pts 1: g0 sf 448, 2688 * fl(1/448) = 6.0000002 -> 6, -3 -> -3;
//         g1 sf 1: 6, 2.5 tie -> 2, 3.5 tie -> 3; g2 zero -> sf 0, inv 0; g3 NaN ignored,
//         amax 1 -> 1/6 -> 0.171875 (0x23): 1 * 5.8 -> 6, NaN -> 0; g4 1e-6 / 6 -> sf 0.
//  row 1: all zero -> pts = 1e-4 / 2688 (0x331FC873), every sf 0.
//  row 2: amax 1e-6 floored: g0 4.48 -> 4.5 (0x49): +-5.97 -> +-6; g1 5e-7: 2.24 -> 2.25.
//         With the 1e-10 floor pts = 1e-6 / 2688: g0 sf 448 (0x7E), g1 sf 224 (0x76).
//  row 3: +-Inf -> pts = Inf: finite groups 0 / Inf = 0 -> sf 0; Inf groups Inf / Inf =
//         NaN -> 0x7F and "sf > 0" fails: every value 0.
//  row 4: all NaN -> amax 0 -> the floor; every sf 0, every value 0.
//  row 5: row 0 again, padded (padded tokens are still quantized).
TEST(Nvfp4Golden, PerTokenRows) {
  for (float floor : {1e-4f, 1e-10f}) {
    SCOPED_TRACE("floor " + std::to_string(floor));
    mt::Problem p = mt::make_problem(6, 128, 2, QuantScheme::nvfp4_per_token().with_amax_floor(floor));
    for (int64_t t : {0, 5}) {
      fill_group(p, t, 0, {2688.0f, -1344.0f});
      fill_group(p, t, 1, {6.0f, 2.5f, 3.5f});
      fill_group(p, t, 3, {kNaN, 1.0f});
      fill_group(p, t, 4, {1e-6f});
    }
    fill_group(p, 2, 0, {1e-6f, -1e-6f});
    fill_group(p, 2, 1, {5e-7f});
    fill_group(p, 3, 0, {kInf, 1.0f});
    fill_group(p, 3, 1, {1.0f});
    fill_group(p, 3, 2, {-kInf});
    for (int64_t h = 0; h < 32; ++h) mt::set_hidden(p, 4, h, h % 2 ? kNaN : kNegNaN);
    p.pad_dt = DType::kBool;
    p.pad = {0, 0, 0, 0, 0, 1};
    const auto r = staged(p);
    const bool f4 = floor == 1e-4f;
    const uint32_t floor_pts = f4 ? 0x331FC873u : 0x29278B6Du;  // fl(floor / 2688)
    const uint32_t want_pts[6] = {0x3F800000u, floor_pts, f4 ? 0x331FC873u : 0x2FCC85B2u,
                                  0x7F800000u, floor_pts, 0x3F800000u};
    for (int64_t t = 0; t < 6; ++t) EXPECT_EQ(mt::f2u(r.x_scales[static_cast<size_t>(t)]), want_pts[t]) << t;
    for (int64_t t : {0, 5}) {
      EXPECT_EQ(r.sf_words[static_cast<size_t>(t * 2)], 0x2300387Eu);  // g3 g2 g1 g0
      EXPECT_EQ(r.sf_words[static_cast<size_t>(t * 2 + 1)], 0u);
      EXPECT_EQ(nibs(r, 128, t, 0, 2), (std::vector<int>{7, 0xD}));
      EXPECT_EQ(nibs(r, 128, t, 16, 3), (std::vector<int>{7, 4, 5}));
      EXPECT_EQ(nibs(r, 128, t, 48, 2), (std::vector<int>{0, 7}));
      EXPECT_EQ(nib(r, 128, t, 64), 0);
    }
    for (int64_t t : {1, 4}) {
      EXPECT_EQ(r.sf_words[static_cast<size_t>(t * 2)], 0u);
      EXPECT_EQ(r.sf_words[static_cast<size_t>(t * 2 + 1)], 0u);
    }
    EXPECT_EQ(r.sf_words[4], f4 ? 0x00004149u : 0x0000767Eu);
    EXPECT_EQ(nibs(r, 128, 2, 0, 2), (std::vector<int>{7, 0xF}));
    EXPECT_EQ(nib(r, 128, 2, 16), 7);
    EXPECT_EQ(r.sf_words[6], 0x007F007Fu);
    for (int64_t t : {3, 4}) {
      for (int64_t h = 0; h < 128; ++h) ASSERT_EQ(nib(r, 128, t, h), 0) << "t=" << t << " h=" << h;
    }
  }
}

// ---------------------------------------------------------------------------------------
// The non-finite counter (SPEC "Non-finite detection": NaN and +-Inf of hidden_states are
// added to a caller's int64).

/// Per dtype: 6 non-finite bit patterns (NaNs of both signs and payloads, +-Inf) and 6
/// finite extremes that must not count.
std::vector<uint32_t> nonfinite_bits(DType dt) {
  switch (dt) {
    case DType::kBFloat16: return {0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7F80, 0xFF80};
    case DType::kFloat16: return {0x7E00, 0xFE00, 0x7C01, 0xFFFF, 0x7C00, 0xFC00};
    default: return {0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7F800000, 0xFF800000};
  }
}
std::vector<uint32_t> finite_extreme_bits(DType dt) {
  switch (dt) {
    case DType::kBFloat16: return {0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x8000, 0x0000};
    case DType::kFloat16: return {0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x8000, 0x03FF};
    default: return {0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001, 0x80000000, 0x007FFFFF};
  }
}

/// T tokens of H = 256, token t holding (t % 3) + 1 copies of the 6 non-finite patterns
/// and the 6 finite extremes once, the rest ordinary values; returns the expected count.
int64_t fill_nonfinite(mt::Problem& p) {
  const std::vector<uint32_t> bad = nonfinite_bits(p.hidden_dt), good = finite_extreme_bits(p.hidden_dt);
  int64_t count = 0;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t h = 0; h < p.H; ++h) mt::set_hidden(p, t, h, static_cast<float>((t + h) % 13) - 6.0f);
    int64_t h = (t * 5) % 40;
    for (int64_t rep = 0; rep <= t % 3; ++rep) {
      for (uint32_t b : bad) {
        mt::set_hidden_bits(p, t, h, b);
        h += 3;
        ++count;
      }
    }
    for (uint32_t b : good) {
      mt::set_hidden_bits(p, t, h, b);
      h += 5;
    }
  }
  return count;
}

/// Every format, once each (with the shapes they need).
std::vector<QuantScheme> every_format() {
  return {QuantScheme::mxfp8(),          QuantScheme::fp8_ue8m0_g128(), QuantScheme::fp8_fp32_g128(),
          QuantScheme::fp8_fp32_g32(),   QuantScheme::mxfp4(),          QuantScheme::mxfp4(Rounding::kNearestEven),
          QuantScheme::nvfp4_static(),   QuantScheme::nvfp4_per_token(), QuantScheme::nvfp4_online()};
}

// Exact counts for every hidden dtype and format, padded tokens included, with the hidden
// rows strided so that the gaps between them hold 0x7F7F (an fp16 NaN) that must not
// count; the counter's 8 bytes are added to, not replaced.
TEST(NonFinite, CountsNaNAndInfOfEveryDtypeAndFormat) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const QuantScheme& q : every_format()) {
      SCOPED_TRACE(std::string(megamoe::dtype_name(dt)) + " " + mt::scheme_tag(q));
      mt::Problem p = mt::make_problem(5, 512, 2, q, dt);
      const int64_t n = fill_nonfinite(p);
      ASSERT_EQ(n, 6 * (1 + 2 + 3 + 1 + 2));
      p.pad_dt = DType::kUInt8;
      p.pad = {0, 9, 0, 1, 0};
      p.global_scale = 0.75f;
      p.nonfinite_init = int64_t{0x0123456789ABCDEF};
      const auto r = staged(p);
      EXPECT_EQ(r.nonfinite, n);
      for (Layout l : {Layout::kPadded, Layout::kStride2, Layout::kTransposed, Layout::kNegRows}) {
        mt::Layouts ls;
        ls.hidden = l;
        EXPECT_TRUE(mt::stage_and_compare(p, ls)) << mt::layout_name(l);
      }
    }
  }
}

// The counter accumulates across calls (graph replays), and negative starting values work.
TEST(NonFinite, AccumulatesAcrossCalls) {
  mt::Problem p = mt::make_problem(4, 256, 1, QuantScheme::mxfp4(), DType::kBFloat16);
  const int64_t n = fill_nonfinite(p);
  for (int64_t init : {int64_t{0}, int64_t{-1000}}) {
    p.nonfinite_init = init;
    mt::Call c = mt::make_call(p, mt::Layouts{});
    for (int call = 1; call <= 3; ++call) {
      ASSERT_NO_THROW(megamoe::prepare_inputs(c.args));
      EXPECT_EQ(c.nfc->get<int64_t>(0), init + call * n) << "call " << call;
    }
    // Everything else is what one call writes.
    mt::Problem once = p;
    once.nonfinite_init = init + 2 * n;
    mt::Call fresh = mt::make_call(once, mt::Layouts{});
    EXPECT_TRUE(mt::outputs_match(c, mt::expected_images(once, fresh, mt::reference(once))));
  }
}

// Many tokens (the CPU backend's worker threads) still count exactly once each.
TEST(NonFinite, ManyTokensCountExactly) {
  mt::Problem p = mt::make_problem(3001, 128, 1, QuantScheme::nvfp4_per_token(), DType::kFloat16);
  int64_t n = 0;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t i = t * p.H + h;
      if (i % 7 == 3) {
        mt::set_hidden_bits(p, t, h, i % 2 ? 0x7C00 : 0xFE00);
        ++n;
      } else {
        mt::set_hidden(p, t, h, static_cast<float>(i % 11));
      }
    }
  }
  p.nonfinite_init = 7;
  megamoe_ref::Result r;
  EXPECT_TRUE(mt::stage_and_compare(p, mt::Layouts{}, &r));
  EXPECT_EQ(r.nonfinite, n);
  mt::Layouts zero_d;
  zero_d.scalars_0d = true;
  zero_d.misalign_out = true;
  EXPECT_TRUE(mt::stage_and_compare(p, zero_d));
}

// Absent counter: nothing but the ordinary outputs is written (every gap byte checked);
// T == 0: the call returns at once and the counter keeps its value.
TEST(NonFinite, AbsentCounterAndZeroTokens) {
  mt::Problem p = mt::make_problem(3, 256, 2, QuantScheme::mxfp8(), DType::kBFloat16);
  fill_nonfinite(p);
  EXPECT_TRUE(mt::stage_and_compare(p, mt::odd_layouts()));
  mt::Problem z = mt::make_problem(0, 256, 2, QuantScheme::nvfp4_per_token());
  z.nonfinite_init = 42;
  mt::Call c = mt::make_call(z, mt::Layouts{});
  const std::vector<uint8_t> before = c.nfc->mem;
  EXPECT_NO_THROW(megamoe::prepare_inputs(c.args));
  EXPECT_TRUE(mt::assert_bitwise_equal("nonfinite_count", *c.nfc, before));
}

// ---------------------------------------------------------------------------------------
// Argument checks of the new tensors (SPEC "Argument checking": a rejected call writes
// nothing; the message names the tensor, what was expected and what was got).

constexpr const char* kSeedSharedUe8m0 =
    "DeepSeek V4 MegaMoE shared input staging currently requires UE8M0-packed hidden scales.";

/// A valid call (T = 5, H = 256, K = 3) in one format, with a counter, global_scale /
/// x_scales where the format has them, and shared_x_sf (bm = 8) for UE8M0 formats; tests
/// break one thing and expect a rejection that writes nothing.
class FormatChecks : public ::testing::Test {
 protected:
  static constexpr int64_t T = 5, H = 256, K = 3;

  void SetUp() override { build(QuantScheme::mxfp4()); }

  void build(const QuantScheme& q, bool dropin = false) {
    p_ = mt::make_problem(T, H, K, q, DType::kBFloat16);
    p_.fp4_dropin = dropin;
    if (dropin) p_.x_fp8_dt = DType::kUInt8;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) mt::set_hidden(p_, t, h, static_cast<float>(t - h) * 0.25f);
    }
    p_.global_scale = 0.5f;
    p_.nonfinite_init = 5;
    p_.bm = q.ue8m0() ? 8 : 0;
    call_ = mt::make_call(p_, mt::Layouts{});
    extras_.clear();
  }

  /// A poisoned [rows, cols] buffer (cols < 0: 1-D; cols == -2: 0-D) kept alive and
  /// watched by reject().
  megamoe::TensorRef extra(DType dt, int64_t rows, int64_t cols) {
    if (cols == -2) {
      extras_.push_back(mt::make_scalar(dt, true, false, mt::kPoison, uint64_t{0}));
    } else {
      extras_.push_back(mt::make_buf(dt, rows, cols, Layout::kContig, false, mt::kPoison));
    }
    return extras_.back().ref();
  }

  /// The baseline call with argument @p slot replaced by a fresh poisoned tensor, rejected
  /// with a message holding @p parts.
  template <typename Slot>
  void reject_with(Slot megamoe::StageArgs::*slot, DType dt, int64_t rows, int64_t cols,
                   std::vector<std::string> parts) {
    auto a = args();
    a.*slot = extra(dt, rows, cols);
    reject(a, std::move(parts));
  }

  /// prepare_inputs and validate both throw kInvalidArgument with every piece of @p parts
  /// (and "expected", "got") in the message; no buffer changes.
  void reject(const megamoe::StageArgs& a, std::vector<std::string> parts) {
    std::vector<std::pair<const mt::Buf*, std::vector<uint8_t>>> before;
    for (const auto& b : call_.inputs()) before.emplace_back(b.second, b.second->mem);
    for (const auto& b : call_.outputs()) before.emplace_back(b.second, b.second->mem);
    for (const mt::Buf& b : extras_) before.emplace_back(&b, b.mem);
    parts.push_back("expected");
    parts.push_back("got");
    for (bool run : {true, false}) {
      SCOPED_TRACE(run ? "prepare_inputs" : "validate");
      try {
        run ? megamoe::prepare_inputs(a) : megamoe::validate(a);
        ADD_FAILURE() << "accepted; wanted a rejection naming " << parts.front();
      } catch (const megamoe::Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
        for (const std::string& s : parts) {
          EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << "\"" << e.what() << "\" lacks \"" << s << "\"";
        }
      }
      for (const auto& b : before) EXPECT_TRUE(mt::assert_bitwise_equal("buffer", *b.first, b.second));
    }
  }

  megamoe::StageArgs args() const { return call_.args; }

  mt::Problem p_;
  mt::Call call_;
  std::deque<mt::Buf> extras_;
};

TEST_F(FormatChecks, EveryFormatBaselineIsValid) {
  for (const QuantScheme& q : every_format()) {
    if (q == QuantScheme::fp8_ue8m0_g128()) continue;  // H = 256 has 2 groups: rejected
    build(q);
    EXPECT_NO_THROW(megamoe::validate(args())) << mt::scheme_tag(q);
    EXPECT_TRUE(mt::stage_and_compare(p_, mt::Layouts{})) << mt::scheme_tag(q);
  }
  build(QuantScheme::mxfp8(), true);
  EXPECT_NO_THROW(megamoe::validate(args())) << "drop-in";
  EXPECT_TRUE(mt::stage_and_compare(p_, mt::Layouts{})) << "drop-in";
}

TEST_F(FormatChecks, GlobalScaleMissingOrExtra) {
  build(QuantScheme::nvfp4_static());
  auto a = args();
  a.global_scale.reset();
  reject(a, {"global_scale"});
  for (const QuantScheme& q : {QuantScheme::mxfp8(), QuantScheme::fp8_fp32_g128(), QuantScheme::mxfp4(),
                               QuantScheme::nvfp4_per_token()}) {
    SCOPED_TRACE(mt::scheme_tag(q));
    build(q);
    reject_with(&megamoe::StageArgs::global_scale, DType::kFloat32, 1, -1, {"global_scale"});
  }
}

// NVFP4 online writes global_scale: required (an output), x_scales rejected, and as an
// output it may not overlap an input.
TEST_F(FormatChecks, OnlineGlobalScaleIsARequiredOutput) {
  build(QuantScheme::nvfp4_online());
  auto a = args();
  a.global_scale.reset();
  reject(a, {"global_scale", "writes one"});
  reject_with(&megamoe::StageArgs::x_scales, DType::kFloat32, T, -1, {"x_scales"});
  reject_with(&megamoe::StageArgs::global_scale, DType::kFloat16, 1, -1, {"global_scale"});
  reject_with(&megamoe::StageArgs::global_scale, DType::kFloat32, 2, -1, {"global_scale"});
  a = args();
  a.global_scale->data = a.topk_weights.data;  // an input's first element
  a.global_scale->dtype = DType::kFloat32;
  reject(a, {"global_scale", "overlapping"});
}

TEST_F(FormatChecks, GlobalScaleWrongDtypeOrShape) {
  build(QuantScheme::nvfp4_static());
  for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kInt32, DType::kFloat8E4M3}) {
    SCOPED_TRACE(megamoe::dtype_name(dt));
    reject_with(&megamoe::StageArgs::global_scale, dt, 1, -1, {"global_scale", "float32", megamoe::dtype_name(dt)});
  }
  // Not one element. ([1, 1] is not here: the library accepts any one-element tensor,
  // wider than stage.h's "[1] (or 0-D)", and SPEC only says "a scalar".)
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{2, -1}, {0, -1}, {T, -1}, {1, 2}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
    reject_with(&megamoe::StageArgs::global_scale, DType::kFloat32, rows, cols, {"global_scale"});
  }
  auto a = args();
  a.global_scale = extra(DType::kFloat32, 1, -2);  // 0-D is accepted
  EXPECT_NO_THROW(megamoe::validate(a));
}

TEST_F(FormatChecks, XScalesMissingExtraOrWrong) {
  build(QuantScheme::nvfp4_per_token());
  auto a = args();
  a.x_scales.reset();
  reject(a, {"x_scales"});
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{T - 1, -1}, {T + 1, -1}, {T, 1}, {1, T}, {1, -2}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
    reject_with(&megamoe::StageArgs::x_scales, DType::kFloat32, rows, cols, {"x_scales"});
  }
  for (DType dt : {DType::kBFloat16, DType::kInt32}) {
    reject_with(&megamoe::StageArgs::x_scales, dt, T, -1, {"x_scales", "float32", megamoe::dtype_name(dt)});
  }
  a = args();
  a.x_scales->strides[0] = 0;  // every token's scale at one address
  reject(a, {"x_scales"});
  for (const QuantScheme& q : {QuantScheme::mxfp8(), QuantScheme::fp8_fp32_g32(), QuantScheme::mxfp4(),
                               QuantScheme::nvfp4_static()}) {
    SCOPED_TRACE(mt::scheme_tag(q));
    build(q);
    reject_with(&megamoe::StageArgs::x_scales, DType::kFloat32, T, -1, {"x_scales"});
  }
}

TEST_F(FormatChecks, NonfiniteCountWrongDtypeOrShape) {
  for (DType dt : {DType::kInt32, DType::kFloat32, DType::kUInt8}) {
    SCOPED_TRACE(megamoe::dtype_name(dt));
    reject_with(&megamoe::StageArgs::nonfinite_count, dt, 1, -1, {"nonfinite_count", "int64", megamoe::dtype_name(dt)});
  }
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{2, -1}, {0, -1}, {2, 1}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
    reject_with(&megamoe::StageArgs::nonfinite_count, DType::kInt64, rows, cols, {"nonfinite_count"});
  }
}

TEST_F(FormatChecks, Fp4XqWrongWidthOrDtype) {
  for (const QuantScheme& q : {QuantScheme::mxfp4(), QuantScheme::nvfp4_static(), QuantScheme::nvfp4_per_token()}) {
    SCOPED_TRACE(mt::scheme_tag(q));
    build(q);
    for (int64_t cols : {H, H / 4, H / 2 + 1}) {
      reject_with(&megamoe::StageArgs::x_q, DType::kUInt8, T, cols, {"x_q", "(5, 128)", "(5, " + std::to_string(cols) + ")"});
    }
    for (DType dt : {DType::kFloat8E4M3, DType::kBFloat16, DType::kInt32, DType::kBool}) {
      reject_with(&megamoe::StageArgs::x_q, dt, T, H / 2, {"x_q", megamoe::dtype_name(dt)});
    }
  }
  // The default scheme: fp8 or uint8 of width H, or uint8/int8 of width H/2 (drop-in);
  // anything else is rejected.
  build(QuantScheme::mxfp8());
  const std::pair<DType, int64_t> bad[] = {{DType::kFloat8E4M3, H / 2}, {DType::kUInt8, H / 4},
                                           {DType::kInt8, H / 4}, {DType::kInt8, H}};
  for (auto [dt, cols] : bad) {
    SCOPED_TRACE(std::string(megamoe::dtype_name(dt)) + " width " + std::to_string(cols));
    reject_with(&megamoe::StageArgs::x_q, dt, T, cols, {"x_q"});
  }
  // The drop-in is only for the exact default scheme's family: fp32 scales stay fp8.
  build(QuantScheme::fp8_fp32_g128());
  reject_with(&megamoe::StageArgs::x_q, DType::kUInt8, T, H / 2, {"x_q", "(5, 256)", "(5, 128)"});
}

TEST_F(FormatChecks, PackedScaleWordsWrongDtypeOrShape) {
  for (const QuantScheme& q : {QuantScheme::nvfp4_static(), QuantScheme::nvfp4_per_token()}) {
    SCOPED_TRACE(mt::scheme_tag(q));
    build(q);
    // NVFP4: [T, H/64] int32 words of four e4m3 bytes; the shape is checked first, so a
    // wrong dtype of the right shape names the dtypes.
    for (DType dt : {DType::kFloat32, DType::kInt64, DType::kUInt8, DType::kFloat8E4M3, DType::kFloat16}) {
      SCOPED_TRACE(megamoe::dtype_name(dt));
      reject_with(&megamoe::StageArgs::x_sf, dt, T, H / 64, {"x_sf", "int32", megamoe::dtype_name(dt)});
    }
    // One byte per scale ([T, H/16] bytes) or one fp32 per group is not the NVFP4 layout.
    for (auto [dt, cols] : {std::pair<DType, int64_t>{DType::kUInt8, H / 16}, {DType::kFloat8E4M3, H / 16},
                            {DType::kFloat32, H / 16}, {DType::kInt32, H / 16}, {DType::kInt32, H / 32},
                            {DType::kInt32, H / 128}}) {
      SCOPED_TRACE(std::string(megamoe::dtype_name(dt)) + " width " + std::to_string(cols));
      reject_with(&megamoe::StageArgs::x_sf, dt, T, cols, {"x_sf", "(5, 4)", "(5, " + std::to_string(cols) + ")"});
    }
  }
  build(QuantScheme::mxfp4());  // MXFP4: the MXFP8 words, [T, H/128] int32
  reject_with(&megamoe::StageArgs::x_sf, DType::kFloat32, T, H / 128, {"x_sf", "int32", "float32"});
  reject_with(&megamoe::StageArgs::x_sf, DType::kInt32, T, H / 64, {"x_sf", "(5, 2)", "(5, 4)"});
}

TEST_F(FormatChecks, SharedStagingIsUe8m0Only) {
  for (const QuantScheme& q : {QuantScheme::nvfp4_static(), QuantScheme::nvfp4_per_token()}) {
    SCOPED_TRACE(mt::scheme_tag(q));
    build(q);
    auto a = args();
    a.shared_x_sf = extra(DType::kInt32, 128, H / 64);
    a.shared_block_m = 8;
    reject(a, {kSeedSharedUe8m0});
  }
  for (bool dropin : {false, true}) {  // MXFP4 (explicit or drop-in) stages shared scales
    build(dropin ? QuantScheme::mxfp8() : QuantScheme::mxfp4(Rounding::kNearestEven), dropin);
    ASSERT_TRUE(call_.shared.has_value());
    EXPECT_TRUE(mt::stage_and_compare(p_, mt::odd_layouts()));
  }
}

TEST_F(FormatChecks, NewTensorsNullDeviceAndOverlap) {
  build(QuantScheme::nvfp4_per_token());
  using Slot = std::optional<megamoe::TensorRef> megamoe::StageArgs::*;
  for (auto [name, slot] : {std::pair<const char*, Slot>{"x_scales", &megamoe::StageArgs::x_scales},
                            {"nonfinite_count", &megamoe::StageArgs::nonfinite_count}}) {
    SCOPED_TRACE(name);
    auto a = args();
    (a.*slot)->data = nullptr;
    reject(a, {name, "nullptr"});
    a = args();
    (a.*slot)->device = Device::cuda(0);
    reject(a, {name, "cuda:0"});
  }
  auto a = args();
  a.x_scales->data = a.x_sf.data;  // 5 floats inside x_sf's 5 x 4 words
  reject(a, {"x_scales", "x_sf"});
  a = args();
  a.nonfinite_count->data = a.topk_idx_out.data;
  reject(a, {"nonfinite_count", "topk_idx_out"});
  a = args();
  a.nonfinite_count->data = a.hidden_states.data;  // an in/out counter inside an input
  reject(a, {"nonfinite_count", "hidden_states"});

  build(QuantScheme::nvfp4_static());
  a = args();
  a.global_scale->data = nullptr;
  reject(a, {"global_scale", "nullptr"});
  a = args();
  a.global_scale->device = Device::cuda(0);
  reject(a, {"global_scale", "cuda:0"});
  a = args();
  a.global_scale->data = a.x_q.data;  // an input inside an output
  reject(a, {"global_scale", "x_q"});
  a = args();
  a.global_scale->data = a.hidden_states.data;  // input over input: allowed (read only)
  EXPECT_NO_THROW(megamoe::validate(a));
}

// ---------------------------------------------------------------------------------------
// output_shapes(): the one shape rule, per format.

/// Expected spec: dtype, rank and sizes.
void expect_spec(const megamoe::TensorSpec& s, DType dt, int ndim, int64_t d0, int64_t d1, const char* what) {
  EXPECT_EQ(s.dtype, dt) << what << ": " << megamoe::dtype_name(s.dtype);
  EXPECT_EQ(s.ndim, ndim) << what;
  EXPECT_EQ(s.shape[0], d0) << what;
  if (ndim == 2) {
    EXPECT_EQ(s.shape[1], d1) << what;
  }
}

TEST(OutputShapes, EveryFormat) {
  constexpr int64_t T = 7, H = 1024, K = 6;
  struct Row {
    QuantScheme q;
    DType xq;
    int64_t xq_cols;
    DType sf;
    int64_t sf_cols;
    bool shared_ok, x_scales, global_scale;
  };
  const Row rows[] = {
      {QuantScheme::mxfp8(), DType::kFloat8E4M3, H, DType::kInt32, H / 128, true, false, false},
      {QuantScheme::fp8_ue8m0_g128(), DType::kFloat8E4M3, H, DType::kInt32, H / 512, true, false, false},
      {QuantScheme::fp8_fp32_g128(), DType::kFloat8E4M3, H, DType::kFloat32, H / 128, false, false, false},
      {QuantScheme::fp8_fp32_g32(), DType::kFloat8E4M3, H, DType::kFloat32, H / 32, false, false, false},
      {QuantScheme::fp8_fp32_g128().with_amax_floor(1e-10f), DType::kFloat8E4M3, H, DType::kFloat32, H / 128,
       false, false, false},
      {QuantScheme::mxfp4(), DType::kUInt8, H / 2, DType::kInt32, H / 128, true, false, false},
      {QuantScheme::mxfp4(Rounding::kNearestEven), DType::kUInt8, H / 2, DType::kInt32, H / 128, true, false, false},
      {QuantScheme::nvfp4_static(), DType::kUInt8, H / 2, DType::kInt32, H / 64, false, false, true},
      {QuantScheme::nvfp4_per_token(), DType::kUInt8, H / 2, DType::kInt32, H / 64, false, true, false},
      {QuantScheme::nvfp4_online(), DType::kUInt8, H / 2, DType::kInt32, H / 64, false, false, true},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(mt::scheme_tag(r.q));
    const megamoe::OutputShapes s = megamoe::output_shapes(T, H, K, r.q);
    expect_spec(s.x_q, r.xq, 2, T, r.xq_cols, "x_q");
    expect_spec(s.x_sf, r.sf, 2, T, r.sf_cols, "x_sf");
    expect_spec(s.topk_idx_out, DType::kInt64, 2, T, K, "topk_idx_out");
    expect_spec(s.topk_weights_out, DType::kFloat32, 2, T, K, "topk_weights_out");
    EXPECT_FALSE(s.shared_x_sf.has_value());
    EXPECT_EQ(s.x_scales.has_value(), r.x_scales);
    if (s.x_scales) expect_spec(*s.x_scales, DType::kFloat32, 1, T, 0, "x_scales");
    EXPECT_EQ(s.global_scale.has_value(), r.global_scale);
    if (s.global_scale) expect_spec(*s.global_scale, DType::kFloat32, 1, 1, 0, "global_scale");
    for (int64_t bm : {1, 8, 96, 128, 192}) {
      SCOPED_TRACE("bm " + std::to_string(bm));
      if (!r.shared_ok) {
        EXPECT_THROW(megamoe::output_shapes(T, H, K, r.q, bm), megamoe::Error);
        continue;
      }
      const megamoe::OutputShapes sh = megamoe::output_shapes(T, H, K, r.q, bm);
      ASSERT_TRUE(sh.shared_x_sf.has_value());
      // ceil(T / bm) blocks of bm rounded up to 128 rows: 7 tokens -> 7 blocks of 128 for
      // bm = 1, one block otherwise (256 rows for bm = 192).
      const int64_t want_rows = bm == 1 ? 7 * 128 : bm == 192 ? 256 : 128;
      expect_spec(*sh.shared_x_sf, DType::kInt32, 2, want_rows, r.sf_cols, "shared_x_sf");
    }
    // Zero tokens: empty outputs of the same widths.
    const megamoe::OutputShapes z = megamoe::output_shapes(0, H, K, r.q);
    expect_spec(z.x_q, r.xq, 2, 0, r.xq_cols, "x_q (T = 0)");
    if (z.x_scales) expect_spec(*z.x_scales, DType::kFloat32, 1, 0, 0, "x_scales (T = 0)");
  }
}

// The harness builds every buffer from its own reading of SPEC; output_shapes must agree.
TEST(OutputShapes, AgreeWithTheHarness) {
  for (const QuantScheme& q : every_format()) {
    for (int64_t H : {512, 1536}) {
      SCOPED_TRACE(mt::scheme_tag(q) + " H=" + std::to_string(H));
      mt::Problem p = mt::make_problem(9, H, 4, q);
      p.bm = q.ue8m0() ? 64 : 0;
      const mt::Call c = mt::make_call(p, mt::Layouts{});
      const megamoe::OutputShapes s =
          megamoe::output_shapes(p.T, H, p.K, q, p.bm > 0 ? std::optional<int64_t>(p.bm) : std::nullopt);
      auto same = [](const megamoe::TensorSpec& spec, const mt::Buf& b, const char* what) {
        EXPECT_EQ(spec.dtype, b.dtype) << what;
        EXPECT_EQ(spec.ndim, b.ndim) << what;
        for (int d = 0; d < b.ndim; ++d) EXPECT_EQ(spec.shape[d], b.shape[d]) << what << " dim " << d;
      };
      same(s.x_q, c.x_q, "x_q");
      same(s.x_sf, c.x_sf, "x_sf");
      same(s.topk_idx_out, c.idx, "topk_idx_out");
      same(s.topk_weights_out, c.wout, "topk_weights_out");
      ASSERT_EQ(s.shared_x_sf.has_value(), c.shared.has_value());
      if (c.shared) same(*s.shared_x_sf, *c.shared, "shared_x_sf");
      ASSERT_EQ(s.x_scales.has_value(), c.x_scales.has_value());
      if (c.x_scales) same(*s.x_scales, *c.x_scales, "x_scales");
      // NVFP4 static's global_scale input, or NVFP4 online's output.
      const std::optional<mt::Buf>& gs = s.global_scale_out ? c.gs_out : c.gs;
      ASSERT_EQ(s.global_scale.has_value(), gs.has_value());
      EXPECT_FALSE(s.global_scale_out ? c.gs.has_value() : c.gs_out.has_value());
      if (gs) same(*s.global_scale, *gs, "global_scale");
    }
  }
}

TEST(OutputShapes, Errors) {
  auto bad = [](int64_t T, int64_t H, int64_t K, const QuantScheme& q, std::optional<int64_t> bm,
                const char* why) {
    try {
      megamoe::output_shapes(T, H, K, q, bm);
      ADD_FAILURE() << why << ": accepted";
    } catch (const megamoe::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << why << ": " << e.what();
    }
  };
  QuantScheme g48 = QuantScheme::mxfp8();
  g48.group_k = 48;
  QuantScheme mx16 = QuantScheme::mxfp4();
  mx16.group_k = 16;
  bad(4, 512, 2, g48, std::nullopt, "G = 48");
  bad(4, 512, 2, mx16, std::nullopt, "MXFP4 with G = 16");
  bad(4, 200, 2, QuantScheme::mxfp4(), std::nullopt, "H = 200");
  bad(4, 64, 2, QuantScheme::nvfp4_static(), std::nullopt, "H = 64");
  bad(4, 256, 2, QuantScheme::fp8_ue8m0_g128(), std::nullopt, "UE8M0 G = 128 with H / G = 2");
  bad(-1, 512, 2, QuantScheme::mxfp8(), std::nullopt, "T < 0");
  bad(4, -512, 2, QuantScheme::mxfp8(), std::nullopt, "H < 0");
  bad(4, 512, -2, QuantScheme::nvfp4_per_token(), std::nullopt, "K < 0");
  bad(4, 512, 2, QuantScheme::mxfp4(), int64_t{0}, "bm = 0");
  bad(4, 512, 2, QuantScheme::mxfp8(), int64_t{-8}, "bm < 0");
  bad(4, 512, 2, QuantScheme::fp8_fp32_g32(), int64_t{8}, "shared with fp32 scales");
  bad(4, 512, 2, QuantScheme::nvfp4_static(), int64_t{8}, "shared with NVFP4");
  bad(4, 512, 2, QuantScheme::mxfp4(), std::numeric_limits<int64_t>::max(), "bm rounded up to 128 overflows");
}

// Library bug (reported; enable once fixed): output_shapes(2^60, 2^20, ...) returns x_q
// (2^60, 2^20), whose element count, TensorSpec::numel(), overflows int64 (undefined
// behaviour), although shapes.h promises checked arithmetic and an Error for sizes that
// overflow. prepare_inputs itself rejects such tensors (TensorRef::numel saturates).
TEST(OutputShapes, ElementCountOverflowIsRejected) {
  for (const QuantScheme& q : {QuantScheme::mxfp8(), QuantScheme::mxfp4(), QuantScheme::fp8_fp32_g32()}) {
    EXPECT_THROW(megamoe::output_shapes(int64_t{1} << 60, int64_t{1} << 20, 2, q), megamoe::Error) << mt::scheme_tag(q);
    EXPECT_THROW(megamoe::output_shapes(4, 128, int64_t{1} << 62, q), megamoe::Error) << mt::scheme_tag(q);
  }
}

}  // namespace
