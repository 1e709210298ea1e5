// Hand-computed golden staging cases (SPEC.md "Scale and value", "Top-k repack",
// "Scale layouts"). Each case is staged through the library in two layout sets (dense, and
// strided/transposed/misaligned) with every byte compared against the reference, and the
// hand-computed bytes are asserted on the reference result, so both must agree with the
// numbers written here.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace {

using megamoe::DType;
using mt::Layout;

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = mt::u2f(0x7FC00000u);
const float kNegNaN = mt::u2f(0xFFC00000u);

using mt::staged;

/// Bytes of x_q row t, columns [h0, h0 + n).
std::vector<int> bytes(const megamoe_ref::Result& r, int64_t H, int64_t t, int64_t h0, int64_t n) {
  std::vector<int> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(r.x_q[static_cast<size_t>(t * H + h0 + i)]);
  return v;
}

void fill_group(mt::Problem& p, int64_t t, int64_t g, std::initializer_list<float> vals) {
  int64_t h = g * p.q.group_k;
  for (float v : vals) mt::set_hidden(p, t, h++, v);
}

// amax floor: a zero group has amax 1e-4 -> s = 1e-4f * (1/448) ~ 2.232e-7; 2^-23 < s <=
// 2^-22, so e = 127 - 22 = 105 (0x69), r = 2^22.
TEST(Golden, AmaxFloorZeroAndTinyGroupsUe8m0) {
  mt::Problem p = mt::make_problem(1, 128, 1, megamoe::QuantScheme::mxfp8());
  for (int64_t h = 0; h < 32; ++h) mt::set_hidden(p, 0, h, 0.0f);        // group 0: +0
  for (int64_t h = 32; h < 64; ++h) mt::set_hidden(p, 0, h, -0.0f);      // group 1: -0
  for (int64_t h = 64; h < 96; ++h) mt::set_hidden(p, 0, h, 1e-6f);      // group 2: 1e-6
  for (int64_t h = 96; h < 128; ++h) mt::set_hidden(p, 0, h, h == 96 ? 448.0f : 0.0f);
  const auto r = staged(p);
  EXPECT_EQ(r.sf_words[0], 0x7F696969u);  // groups 0..2: 105; group 3: amax 448 -> s = 1 -> 127
  EXPECT_EQ(r.x_q[0], 0x00);
  EXPECT_EQ(r.x_q[32], 0x80);  // -0 * 2^22 = -0
  EXPECT_EQ(r.x_q[64], 0x48);  // 1e-6 * 2^22 = 4.194 -> 4.0
  EXPECT_EQ(r.x_q[96], 0x7E);  // 448
}

// fp32 scales at the floor: s = 0x346FACAD, r = 1/s = 4480000 exactly; 1e-6 * r = 4.48 -> 4.5.
TEST(Golden, AmaxFloorFp32Scale) {
  mt::Problem p = mt::make_problem(1, 128, 1, megamoe::QuantScheme::fp8_fp32_g32());
  for (int64_t h = 0; h < 32; ++h) mt::set_hidden(p, 0, h, 1e-6f);
  const auto r = staged(p);
  EXPECT_EQ(mt::f2u(r.sf_f32[0]), 0x346FACADu);
  EXPECT_EQ(mt::f2u(r.sf_f32[1]), 0x346FACADu);  // zero group
  EXPECT_EQ(r.x_q[0], 0x49);
  EXPECT_EQ(r.x_q[32], 0x00);
}

// amax = 448 gives scale 1 (448 * C = 1 + 3*2^-26 rounds to 1.0f), so values go through
// the fp8 conversion unscaled: the ties of rule 5.
TEST(Golden, RoundingTiesAtScaleOne) {
  mt::Problem p = mt::make_problem(1, 128, 1, megamoe::QuantScheme::mxfp8());
  const float t10 = std::ldexp(1.0f, -10);
  fill_group(p, 0, 0,
             {448.0f, 1.0625f, 1.1875f, -1.0625f, t10, 3 * t10, 5 * t10, 7 * t10, 15 * t10,
              232.0f, 240.0f, 248.0f, 0.5f, kNaN, kNegNaN, mt::u2f(0x00000001u),
              mt::u2f(0x80000001u), -448.0f, 2 * t10});
  const auto r = staged(p);
  EXPECT_EQ(r.sf_words[0] & 0xFFu, 127u);
  const std::vector<int> want = {0x7E, 0x38, 0x3A, 0xB8, 0x00, 0x02, 0x02, 0x04, 0x08, 0x76,
                                 0x77, 0x78, 0x30, 0x7F, 0x7F, 0x00, 0x80, 0xFE, 0x01};
  EXPECT_EQ(bytes(r, p.H, 0, 0, static_cast<int64_t>(want.size())), want);
}

// amax exactly 448 * 2^k: s = 2^k exactly, so e = 127 + k (no +1); the next float above
// 448 gives s = 1 + 2^-23 and e = 128.
TEST(Golden, AmaxExactPowerOfTwoMultipleOf448) {
  mt::Problem p = mt::make_problem(1, 128, 1, megamoe::QuantScheme::mxfp8());
  fill_group(p, 0, 0, {56.0f, 7.0f});                                 // 448 * 2^-3
  fill_group(p, 0, 1, {-448.0f, 1.0f});                               // 448 * 2^0
  fill_group(p, 0, 2, {14336.0f, -32.0f});                            // 448 * 2^5
  fill_group(p, 0, 3, {std::nextafter(448.0f, kInf), 448.0f});
  const auto r = staged(p);
  EXPECT_EQ(r.sf_words[0], 0x80847F7Cu);
  EXPECT_EQ(bytes(r, p.H, 0, 0, 2), (std::vector<int>{0x7E, 0x66}));   // 56*8 = 448, 7*8 = 56
  EXPECT_EQ(bytes(r, p.H, 0, 32, 2), (std::vector<int>{0xFE, 0x38}));  // -448, 1
  EXPECT_EQ(bytes(r, p.H, 0, 64, 2), (std::vector<int>{0x7E, 0xB8}));  // 448, -1
  EXPECT_EQ(bytes(r, p.H, 0, 96, 2), (std::vector<int>{0x76, 0x76}));  // 224.00002, 224

  mt::Problem f = p;
  f.q = megamoe::QuantScheme::fp8_fp32_g32();
  const auto rf = staged(f);
  EXPECT_EQ(rf.sf_f32[0], 0.125f);
  EXPECT_EQ(rf.sf_f32[1], 1.0f);
  EXPECT_EQ(rf.sf_f32[2], 32.0f);
  EXPECT_EQ(mt::f2u(rf.sf_f32[3]), 0x3F800001u);
}

// s = amax * C, not amax / 448: for amax = 100 they differ by one ulp (0x3E64924A vs
// 0x3E649249), and so do the multipliers (0x408F5C28 vs 0x408F5C29); x = 0x1.0f6db6p-1
// then lands on fp8 0x41 with C and would land on 0x42 with the division.
TEST(Golden, Fp32ScaleIsProductWithInverse448) {
  const float amax = 100.0f;
  ASSERT_NE(mt::f2u(amax * (1.0f / 448.0f)), mt::f2u(amax / 448.0f)) << "formulas must differ";
  mt::Problem p = mt::make_problem(1, 128, 1, megamoe::QuantScheme::fp8_fp32_g128());
  fill_group(p, 0, 0, {amax, 0x1.0f6db6p-1f, 0x1.2c0002p-1f, 1.0f});
  const auto r = staged(p);
  EXPECT_EQ(mt::f2u(r.sf_f32[0]), 0x3E64924Au);
  // 100 * r = 447.99995 -> 448; x*r = 0x1.2ffffep+1 -> 2.25; 0x1.5p+1 = 2.625 tie -> 2.5;
  // 1 * r = 4.4799995 -> 4.5.
  EXPECT_EQ(bytes(r, p.H, 0, 0, 4), (std::vector<int>{0x7E, 0x41, 0x42, 0x49}));

  // amax = 1: s = C itself, r = 1/C = 0x43DFFFFF = 447.99997.
  mt::Problem q = mt::make_problem(1, 128, 1, megamoe::QuantScheme::fp8_fp32_g128());
  fill_group(q, 0, 0, {1.0f, 0.5f, -1.0f});
  const auto rq = staged(q);
  EXPECT_EQ(mt::f2u(rq.sf_f32[0]), 0x3B124925u);
  EXPECT_EQ(bytes(rq, q.H, 0, 0, 3), (std::vector<int>{0x7E, 0x76, 0xFE}));
}

// NaN of either sign is ignored by amax and quantizes to 0x7F; an all-NaN group has amax
// 0 -> floor -> e = 105. amax = 2: s = 2C (0x3B924925, exponent 119, mantissa != 0) ->
// e = 120, r = 128.
TEST(Golden, NaNIgnoredByAmax) {
  mt::Problem p = mt::make_problem(1, 128, 1, megamoe::QuantScheme::mxfp8(), DType::kBFloat16);
  fill_group(p, 0, 0, {kNaN, 1.0f, kNegNaN, 2.0f, -2.0f});
  for (int64_t h = 32; h < 64; ++h) mt::set_hidden(p, 0, h, h % 2 ? kNaN : kNegNaN);
  const auto r = staged(p);
  EXPECT_EQ(r.sf_words[0], 0x69696978u);
  EXPECT_EQ(bytes(r, p.H, 0, 0, 5), (std::vector<int>{0x7F, 0x70, 0x7F, 0x78, 0xF8}));
  EXPECT_EQ(bytes(r, p.H, 0, 32, 2), (std::vector<int>{0x7F, 0x7F}));
}

// +-Inf in a group: amax = Inf -> s = Inf. UE8M0: e = 255 clamped to 254 (0xFE), r = 2^-127,
// Inf -> 0x7E, -Inf -> 0xFE, finite values underflow to +-0. fp32: the scale is Inf,
// r = 1/Inf = 0, finite x * 0 = +-0, Inf * 0 = NaN -> 0x7F.
TEST(Golden, InfinityInGroup) {
  mt::Problem p = mt::make_problem(1, 128, 1, megamoe::QuantScheme::mxfp8());
  fill_group(p, 0, 0, {kInf, -kInf, 448.0f, kNaN, kNegNaN, 1e30f, -1e30f, -5.0f});
  const auto r = staged(p);
  EXPECT_EQ(r.sf_words[0], 0x696969FEu);
  EXPECT_EQ(bytes(r, p.H, 0, 0, 8),
            (std::vector<int>{0x7E, 0xFE, 0x00, 0x7F, 0x7F, 0x00, 0x80, 0x80}));

  mt::Problem f = p;
  f.q = megamoe::QuantScheme::fp8_fp32_g32();
  const auto rf = staged(f);
  EXPECT_EQ(mt::f2u(rf.sf_f32[0]), 0x7F800000u);
  EXPECT_EQ(bytes(rf, f.H, 0, 0, 8),
            (std::vector<int>{0x7F, 0x7F, 0x00, 0x7F, 0x7F, 0x00, 0x80, 0x80}));
}

// Values beyond 448 are the group's amax, so they scale down: 464 -> s = 1.0357 -> e = 128,
// r = 0.5: 232 is a tie -> 224 (0x76); 480 -> 240 (0x77), 470 -> 235 -> 240; 1e9 ->
// s = 2.232e6 (log2 21.09) -> e = 149, 1e9 * 2^-22 = 238.4 -> 240.
TEST(Golden, LargeValuesScaleDown) {
  mt::Problem p = mt::make_problem(1, 128, 1, megamoe::QuantScheme::mxfp8());
  fill_group(p, 0, 0, {464.0f, 448.0f, -464.0f});
  fill_group(p, 0, 1, {480.0f, 470.0f});
  fill_group(p, 0, 2, {1e9f, -1e9f});
  const auto r = staged(p);
  EXPECT_EQ(r.sf_words[0], 0x69958080u);
  EXPECT_EQ(bytes(r, p.H, 0, 0, 3), (std::vector<int>{0x76, 0x76, 0xF6}));
  EXPECT_EQ(bytes(r, p.H, 0, 32, 2), (std::vector<int>{0x77, 0x77}));
  EXPECT_EQ(bytes(r, p.H, 0, 64, 2), (std::vector<int>{0x77, 0xF7}));
}

/// Stage one token of H = 128 whose first elements have the raw bits @p bits.
megamoe_ref::Result staged_bits(DType dt, const megamoe::QuantScheme& q,
                                std::initializer_list<uint32_t> bits) {
  mt::Problem p = mt::make_problem(1, 128, 1, q, dt);
  int64_t h = 0;
  for (uint32_t b : bits) mt::set_hidden_bits(p, 0, h++, b);
  return staged(p);
}

// No flush-to-zero. fp16 subnormals: amax = 1023 * 2^-24 < 1e-4 -> e = 105, r = 2^22:
// 2^-24 -> 0.25 (0x28), 1023 * 2^-24 -> 255.75 -> 256 (0x78), 512 * 2^-24 -> 128 (0x70).
TEST(Golden, SubnormalInputsFp16) {
  const auto mx = megamoe::QuantScheme::mxfp8(), f32 = megamoe::QuantScheme::fp8_fp32_g32();
  const auto r = staged_bits(DType::kFloat16, mx, {0x0001, 0x8001, 0x03FF, 0x0200});
  EXPECT_EQ(r.sf_words[0], 0x69696969u);
  EXPECT_EQ(bytes(r, 128, 0, 0, 4), (std::vector<int>{0x28, 0xA8, 0x78, 0x70}));

  // fp32 scales: r = 4480000 -> 2^-24 * r = 0.26703 -> 0.28125 (midpoint 0.265625);
  // 1023 * 2^-24 * r = 273.17 -> 288 (midpoint 272); 2^-15 * r = 136.72 -> 144 (midpoint 136).
  const auto rf = staged_bits(DType::kFloat16, f32, {0x0001, 0x8001, 0x03FF, 0x0200});
  EXPECT_EQ(bytes(rf, 128, 0, 0, 4), (std::vector<int>{0x29, 0xA9, 0x79, 0x71}));
}

// bf16 and fp32 subnormals are far below 2^-32, so they quantize to signed zero, but they
// are read (not flushed) and the group scale is the floor.
TEST(Golden, SubnormalInputsBf16AndFp32) {
  const auto mx = megamoe::QuantScheme::mxfp8();
  for (const auto& r : {staged_bits(DType::kBFloat16, mx, {0x0001, 0x8001, 0x007F, 0x807F}),
                        staged_bits(DType::kFloat32, mx,
                                    {0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF})}) {
    EXPECT_EQ(r.sf_words[0], 0x69696969u);
    EXPECT_EQ(bytes(r, 128, 0, 0, 4), (std::vector<int>{0x00, 0x80, 0x00, 0x80}));
  }
}

// Group sizes: G = 1 gives one scale per element (e = ceil(log2(|x|/448)) + 127);
// with UE8M0 and G = 1, H = 128 has 32 scale words.
TEST(Golden, GroupSizeOne) {
  mt::Problem p = mt::make_problem(1, 128, 1, mt::scheme(true, 1));
  fill_group(p, 0, 0, {448.0f, 1.0f, 0.0f, -896.0f});
  const auto r = staged(p);
  // 448 -> 127; 1 -> s = C -> 119; 0 -> 105; 896 -> s = 2 -> 128.
  EXPECT_EQ(r.sf_words[0], 0x8069777Fu);
  EXPECT_EQ(bytes(r, p.H, 0, 0, 4), (std::vector<int>{0x7E, 0x78, 0x00, 0xFE}));
  ASSERT_EQ(r.sf_words.size(), 32u);
}

// Top-k repack: ids widened with sign, weights copied bit-exactly (fp32 NaN payloads
// included) or widened exactly (bf16/fp16); padded tokens get -1 and +0.0f even when the
// input weight is NaN, and any nonzero mask byte means padded.
TEST(Golden, TopkRepackAndPadding) {
  mt::Problem p = mt::make_problem(4, 128, 3, megamoe::QuantScheme::mxfp8());
  p.ids_dt = DType::kInt32;
  const int32_t ids[12] = {5, -1, 2147483647, 7, 8, 9, -2147483647 - 1, 10, 11, 12, 13, 14};
  p.ids.assign(reinterpret_cast<const uint8_t*>(ids), reinterpret_cast<const uint8_t*>(ids) + 48);
  const uint32_t w[12] = {0x3F000000u, 0x7FC00001u, 0x80000000u,  // 0.5, NaN payload, -0
                          0x7FC00000u, 0xFF800000u, 0x00000001u,  // padded row: NaN, -Inf, denorm
                          0xBF800000u, 0x7F800000u, 0x3E800000u,
                          0xFFC00000u, 0x3F800000u, 0x40000000u};  // padded row (mask 0x80)
  p.w.assign(reinterpret_cast<const uint8_t*>(w), reinterpret_cast<const uint8_t*>(w) + 48);
  p.pad_dt = DType::kUInt8;
  p.pad = {0, 1, 0, 0x80};
  for (int64_t t = 0; t < 4; ++t) mt::set_hidden(p, t, 0, 1.0f + t);
  const auto r = staged(p);
  const std::vector<int64_t> want_ids = {5,  -1, 2147483647, -1, -1, -1,
                                         -2147483648LL, 10, 11, -1, -1, -1};
  EXPECT_EQ(r.idx, want_ids);
  const uint32_t want_w[12] = {0x3F000000u, 0x7FC00001u, 0x80000000u, 0, 0, 0,
                               0xBF800000u, 0x7F800000u, 0x3E800000u, 0, 0, 0};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(mt::f2u(r.w[i]), want_w[i]) << "weight " << i;

  // bf16 and fp16 weights widen exactly.
  mt::Problem b = p;
  b.w_dt = DType::kBFloat16;
  const uint16_t wb[12] = {0x3F00, 0xC0A0, 0x0001, 0x7FC0, 0, 0, 0x8000, 0x7F80, 0x4049, 0, 0, 0};
  b.w.assign(reinterpret_cast<const uint8_t*>(wb), reinterpret_cast<const uint8_t*>(wb) + 24);
  const auto rb = staged(b);
  EXPECT_EQ(mt::f2u(rb.w[1]), 0xC0A00000u);
  EXPECT_EQ(mt::f2u(rb.w[2]), 0x00010000u);
  EXPECT_EQ(mt::f2u(rb.w[3]), 0u);  // padded NaN -> +0
  EXPECT_EQ(mt::f2u(rb.w[8]), 0x40490000u);

  mt::Problem h = p;
  h.w_dt = DType::kFloat16;
  const uint16_t wh[12] = {0x3800, 0x0001, 0xFBFF, 0x7E00, 0, 0, 0x8000, 0x7C00, 0x03FF, 0, 0, 0};
  h.w.assign(reinterpret_cast<const uint8_t*>(wh), reinterpret_cast<const uint8_t*>(wh) + 24);
  const auto rh = staged(h);
  EXPECT_EQ(rh.w[0], 0.5f);
  EXPECT_EQ(rh.w[1], std::ldexp(1.0f, -24));
  EXPECT_EQ(rh.w[2], -65504.0f);
  EXPECT_EQ(mt::f2u(rh.w[6]), 0x80000000u);
  EXPECT_EQ(rh.w[7], kInf);
  EXPECT_EQ(rh.w[8], 1023 * std::ldexp(1.0f, -24));

  // Padded tokens' activations are still quantized: row 1 holds 2.0 at h = 0.
  EXPECT_EQ(r.x_q[1 * 128], 0x78);  // amax 2 -> e = 120, r = 128: 2 -> 256
}

// shared_x_sf row map: m = t % bm goes to (t/bm)*abm + (m/128)*128 + (m%32)*4 + (m%128)/32.
TEST(Golden, SharedRowMap) {
  EXPECT_EQ(megamoe_ref::shared_row(0, 8), 0);
  EXPECT_EQ(megamoe_ref::shared_row(1, 8), 4);
  EXPECT_EQ(megamoe_ref::shared_row(7, 8), 28);
  EXPECT_EQ(megamoe_ref::shared_row(8, 8), 128);
  EXPECT_EQ(megamoe_ref::shared_row(9, 8), 132);
  EXPECT_EQ(megamoe_ref::shared_row(31, 128), 124);
  EXPECT_EQ(megamoe_ref::shared_row(32, 128), 1);
  EXPECT_EQ(megamoe_ref::shared_row(33, 128), 5);
  EXPECT_EQ(megamoe_ref::shared_row(127, 128), 127);
  EXPECT_EQ(megamoe_ref::shared_row(128, 128), 128);
  EXPECT_EQ(megamoe_ref::shared_row(128, 192), 128);
  EXPECT_EQ(megamoe_ref::shared_row(191, 192), 253);
  EXPECT_EQ(megamoe_ref::shared_row(192, 192), 256);
  EXPECT_EQ(megamoe_ref::shared_row(100, 96), 128 + 16);
  for (int64_t bm : {1, 8, 32, 96, 128, 192, 256, 300}) {
    std::vector<int> hit(static_cast<size_t>(4 * ((bm + 127) / 128 * 128)), 0);
    for (int64_t t = 0; t < 4 * bm; ++t) {
      const int64_t row = megamoe_ref::shared_row(t, bm);
      ASSERT_LT(row, static_cast<int64_t>(hit.size())) << "bm=" << bm << " t=" << t;
      EXPECT_EQ(hit[static_cast<size_t>(row)]++, 0) << "bm=" << bm << " t=" << t;
    }
  }
}

// Shared staging end to end: rows receive copies of x_sf, unmapped rows stay poison.
TEST(Golden, SharedStagingCopiesScaleRows) {
  for (int64_t bm : {8, 32, 96, 128, 192}) {
    SCOPED_TRACE("bm=" + std::to_string(bm));
    mt::Problem p = mt::make_problem(200, 256, 2, megamoe::QuantScheme::mxfp8());
    for (int64_t t = 0; t < p.T; ++t) {
      for (int64_t h = 0; h < p.H; ++h) mt::set_hidden(p, t, h, static_cast<float>((t * 7 + h) % 97) - 48.0f);
      mt::set_hidden(p, t, t % p.H, std::ldexp(1.0f, static_cast<int>(t % 40) - 20));
    }
    p.bm = bm;
    megamoe_ref::Result r;
    EXPECT_TRUE(mt::stage_and_compare(p, mt::Layouts{}, &r));
    mt::Layouts mn;
    mn.shared = Layout::kMnMajor4;
    mn.shared_extra_rows = 1;
    EXPECT_TRUE(mt::stage_and_compare(p, mn));
    EXPECT_TRUE(mt::stage_and_compare(p, mt::odd_layouts()));
  }
}

// The bitwise comparison itself: it must see a changed element and a changed gap byte.
TEST(Harness, DetectsElementAndGapCorruption) {
  mt::Buf b = mt::make_buf(DType::kInt32, 3, 2, Layout::kPadded, true, mt::kPoison);
  std::vector<uint8_t> img = b.mem;
  EXPECT_TRUE(mt::assert_bitwise_equal("b", b, img));
  b.set<int32_t>(2, 1, 7);
  auto res = mt::assert_bitwise_equal("b", b, img);
  EXPECT_FALSE(res);
  EXPECT_NE(std::string(res.message()).find("element (2, 1)"), std::string::npos) << res.message();
  b.mem = img;
  b.mem[b.offset(0, 1) + 4] = 0;  // first gap byte of row 0
  res = mt::assert_bitwise_equal("b", b, img);
  EXPECT_FALSE(res);
  EXPECT_NE(std::string(res.message()).find("gap"), std::string::npos) << res.message();
  b.mem = img;
  b.mem.front() = 0;  // before the first element
  EXPECT_FALSE(mt::assert_bitwise_equal("b", b, img));
}

// Layout helper sanity: every element of every layout has its own bytes, inside the buffer.
TEST(Harness, LayoutsAreDisjointAndInBounds) {
  for (Layout l : {Layout::kContig, Layout::kPadded, Layout::kTransposed, Layout::kNegRows,
                   Layout::kNegCols, Layout::kStride2, Layout::kMnMajor4}) {
    for (bool mis : {false, true}) {
      for (int64_t cols : {-1, 1, 5}) {
        mt::Buf b = mt::make_buf(DType::kFloat16, 7, cols, l, mis, 0);
        std::vector<int> owner(b.mem.size(), 0);
        for (int64_t i = 0; i < b.rows(); ++i) {
          for (int64_t j = 0; j < b.cols(); ++j) {
            const int64_t o = b.offset(i, j);
            ASSERT_GE(o, mt::kMargin);
            ASSERT_LE(o + b.es + mt::kMargin, static_cast<int64_t>(b.mem.size()));
            for (int64_t k = 0; k < b.es; ++k) ASSERT_EQ(owner[static_cast<size_t>(o + k)]++, 0);
          }
        }
      }
    }
  }
}

}  // namespace
