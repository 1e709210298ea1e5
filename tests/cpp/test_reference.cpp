// The independent reference against hand-computed golden values, then src/core (the
// numerics shared by the CPU backend and the CUDA kernels) against the reference:
// fp8 conversion on all 2^32 float bit patterns, bf16/fp16 widening on all 2^16 patterns,
// group scales on a dense sample of amax values, and the shared_x_sf row map.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/fastdiv.h"
#include "core/layout.h"
#include "core/numerics.h"
#include "formats/bf16/codec.h"
#include "formats/e2m1/f16.h"
#include "formats/e2m1/f16mul.h"
#include "formats/e2m1/fp32.h"
#include "formats/e2m1/pairs.h"
#include "formats/fp8/e5m2.h"
#include "formats/recipe.h"
#include "megamoe/shapes.h"
#include "megamoe_reference.h"

namespace {

namespace core = megamoe::core;

float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---------------------------------------------------------------------------------------
// Reference self-checks (hand-computed).

struct Fp8Golden {
  float in;
  uint8_t out;
  const char* why;
};

TEST(ReferenceFp8, GoldenBytes) {
  const float t9 = std::ldexp(1.0f, -9), t10 = std::ldexp(1.0f, -10);
  const Fp8Golden cases[] = {
      {0.0f, 0x00, "+0"},
      {-0.0f, 0x80, "-0"},
      {1.0f, 0x38, "1 = 2^0: exponent field 7"},
      {-1.0f, 0xB8, "-1"},
      {0.5f, 0x30, "2^-1"},
      {448.0f, 0x7E, "max finite"},
      {-448.0f, 0xFE, "-max finite"},
      {416.0f, 0x7D, "448 - one step"},
      {432.0f, 0x7E, "tie 416 (0x7D, odd) / 448 (0x7E, even)"},
      {std::nextafter(432.0f, 0.0f), 0x7D, "just below the 416/448 tie"},
      {464.0f, 0x7E, "tie 448 / 480 -> 448 (and saturation)"},
      {-464.0f, 0xFE, "-464"},
      {470.0f, 0x7E, "saturates (hardware: 0x7E)"},
      {480.0f, 0x7E, "480 is not finite in e4m3fn: saturates"},
      {1e9f, 0x7E, "saturates"},
      {-1e9f, 0xFE, "saturates negative"},
      {FLT_MAX, 0x7E, "FLT_MAX saturates"},
      {std::numeric_limits<float>::infinity(), 0x7E, "+Inf -> 0x7E"},
      {-std::numeric_limits<float>::infinity(), 0xFE, "-Inf -> 0xFE"},
      {u2f(0x7FC00000u), 0x7F, "quiet NaN"},
      {u2f(0xFFC00000u), 0x7F, "negative quiet NaN -> 0x7F too"},
      {u2f(0x7F800001u), 0x7F, "signaling NaN"},
      {u2f(0xFFFFFFFFu), 0x7F, "negative NaN, full payload"},
      {t9, 0x01, "smallest subnormal 2^-9"},
      {-t9, 0x81, "-2^-9"},
      {t10, 0x00, "2^-10: tie 0 / 2^-9 -> 0 (even)"},
      {-t10, 0x80, "-2^-10 -> -0"},
      {std::nextafter(t10, 1.0f), 0x01, "just above 2^-10"},
      {std::nextafter(t10, 0.0f), 0x00, "just below 2^-10"},
      {3 * t10, 0x02, "1.5 * 2^-9: tie 1 / 2 -> 2 (even)"},
      {5 * t10, 0x02, "2.5 * 2^-9: tie 2 / 3 -> 2"},
      {7 * t9, 0x07, "largest subnormal"},
      {15 * t10, 0x08, "7.5 * 2^-9: tie 7 / 8 -> 8 = 2^-6, smallest normal"},
      {std::ldexp(1.0f, -6), 0x08, "smallest normal"},
      {1.0625f, 0x38, "tie 1.0 / 1.125 -> 1.0"},
      {std::nextafter(1.0625f, 2.0f), 0x39, "just above the tie"},
      {1.1875f, 0x3A, "tie 1.125 / 1.25 -> 1.25"},
      {232.0f, 0x76, "tie 224 / 240 -> 224"},
      {248.0f, 0x78, "tie 240 / 256 -> 256"},
      {u2f(0x00000001u), 0x00, "fp32 denormal"},
      {u2f(0x80000001u), 0x80, "negative fp32 denormal -> -0"},
      {FLT_MIN, 0x00, "smallest fp32 normal"},
  };
  for (const Fp8Golden& c : cases) {
    EXPECT_EQ(megamoe_ref::fp8_e4m3(c.in), c.out)
        << c.why << " (input bits 0x" << std::hex << f2u(c.in) << ")";
  }
}

// Every byte decodes back to itself: the reference's table is the e4m3fn code space.
TEST(ReferenceFp8, RoundTripsEveryFiniteByte) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    const int e = (c >> 3) & 0xF, m = c & 7;
    float v = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                     : std::ldexp(1.0f + m / 8.0f, e - 7);
    if (c & 0x80) v = -v;
    EXPECT_EQ(megamoe_ref::fp8_e4m3(v), c) << "byte 0x" << std::hex << c;
  }
}

// e5m2: normals (1 + m/4) 2^(e-15) up to 57344 (0x7B), subnormals m 2^-16; RNE, satfinite.
TEST(ReferenceE5m2, GoldenBytes) {
  const float t16 = std::ldexp(1.0f, -16), t17 = std::ldexp(1.0f, -17);
  const Fp8Golden cases[] = {
      {0.0f, 0x00, "+0"},
      {-0.0f, 0x80, "-0"},
      {1.0f, 0x3C, "1 = 2^0: exponent field 15"},
      {-1.0f, 0xBC, "-1"},
      {1.25f, 0x3D, "1 + 1/4"},
      {1.125f, 0x3C, "tie 1.0 / 1.25 -> 1.0 (even)"},
      {1.375f, 0x3E, "tie 1.25 / 1.5 -> 1.5 (even)"},
      {std::nextafter(1.125f, 2.0f), 0x3D, "just above the 1.0/1.25 tie"},
      {57344.0f, 0x7B, "max finite"},
      {-57344.0f, 0xFB, "-max finite"},
      {49152.0f, 0x7A, "57344 - one step"},
      {53248.0f, 0x7A, "tie 49152 (0x7A, even) / 57344 -> 49152"},
      {61440.0f, 0x7B, "tie 57344 / 65536 -> saturates"},
      {65536.0f, 0x7B, "2^16 saturates (Inf in plain e5m2)"},
      {1e30f, 0x7B, "saturates"},
      {std::numeric_limits<float>::infinity(), 0x7B, "+Inf -> 0x7B"},
      {-std::numeric_limits<float>::infinity(), 0xFB, "-Inf -> 0xFB"},
      {u2f(0x7FC00000u), 0x7F, "quiet NaN"},
      {u2f(0xFFC00000u), 0x7F, "negative NaN -> 0x7F too"},
      {t16, 0x01, "smallest subnormal 2^-16"},
      {-t16, 0x81, "-2^-16"},
      {t17, 0x00, "2^-17: tie 0 / 2^-16 -> 0 (even)"},
      {std::nextafter(t17, 1.0f), 0x01, "just above 2^-17"},
      {3 * t17, 0x02, "1.5 * 2^-16: tie 1 / 2 -> 2"},
      {3 * t16, 0x03, "largest subnormal"},
      {7 * t17, 0x04, "3.5 * 2^-16: tie 3 / 4 -> 4 = 2^-14, smallest normal"},
      {std::ldexp(1.0f, -14), 0x04, "smallest normal"},
      {u2f(0x00000001u), 0x00, "fp32 denormal"},
  };
  for (const Fp8Golden& c : cases) {
    EXPECT_EQ(megamoe_ref::fp8_e5m2(c.in), c.out) << c.why << " (input bits 0x" << std::hex << f2u(c.in) << ")";
    EXPECT_EQ(core::fp8_e5m2_from_float_sw(c.in), c.out) << c.why;
  }
  for (int c = 0; c < 256; ++c) {  // every finite byte decodes back to itself
    if ((c & 0x7F) > 0x7B) continue;  // Inf, NaN
    EXPECT_EQ(megamoe_ref::fp8_e5m2(core::e5m2_to_float(static_cast<uint32_t>(c))), c) << std::hex << c;
  }
  EXPECT_EQ(core::bits_float(core::kInv57344Bits), static_cast<float>(1.0 / 57344.0));
}

TEST(ReferenceScalars, Ue8m0AndWidening) {
  using megamoe_ref::detail::ue8m0_byte;
  EXPECT_EQ(ue8m0_byte(1.0f), 127);
  EXPECT_EQ(ue8m0_byte(std::nextafter(1.0f, 2.0f)), 128);
  EXPECT_EQ(ue8m0_byte(0.75f), 127);
  EXPECT_EQ(ue8m0_byte(0.5f), 126);
  EXPECT_EQ(ue8m0_byte(std::ldexp(1.0f, -126)), 1);
  EXPECT_EQ(ue8m0_byte(std::ldexp(1.0f, -127)), 1);  // subnormal: clamped
  EXPECT_EQ(ue8m0_byte(u2f(1)), 1);
  EXPECT_EQ(ue8m0_byte(std::ldexp(1.0f, 127)), 254);
  EXPECT_EQ(ue8m0_byte(FLT_MAX), 254);  // 255 clamped
  EXPECT_EQ(ue8m0_byte(std::numeric_limits<float>::infinity()), 254);
  EXPECT_EQ(f2u(megamoe_ref::detail::inv448()), 0x3B124925u);

  EXPECT_EQ(megamoe_ref::half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(megamoe_ref::half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(megamoe_ref::half_to_float(0x8400), -std::ldexp(1.0f, -14));
  EXPECT_EQ(megamoe_ref::half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(megamoe_ref::half_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f2u(megamoe_ref::half_to_float(0x7E00)), 0x7FC00000u);
  EXPECT_EQ(f2u(megamoe_ref::half_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(megamoe_ref::bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(f2u(megamoe_ref::bf16_to_float(0x8001)), 0x80010000u);
}

// ---------------------------------------------------------------------------------------
// src/core against the reference.

/// Run f(lo, hi) over [0, n) split across the machine's threads.
template <typename F>
void parallel_for(uint64_t n, F f) {
  const unsigned nt = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (unsigned i = 0; i < nt; ++i) {
    th.emplace_back([&, i] { f(n * i / nt, n * (i + 1) / nt); });
  }
  for (auto& t : th) t.join();
}

/// Optimized builds sweep every pattern; unoptimized (Debug, sanitizer) ones a sample.
#if defined(__OPTIMIZE__)
constexpr bool kFullSweeps = true;
#else
constexpr bool kFullSweeps = false;
#endif

// Optimized builds check all 2^32 patterns (~15 s on 2 cores). Unoptimized (Debug,
// sanitizer) builds check every sign and exponent with the top 7 mantissa bits (the kept,
// round and first sticky bits of every fp8 target, normal or subnormal) crossed with
// 18 low-mantissa patterns, plus 2^24 random patterns.
std::vector<uint32_t> fp8_sample_patterns() {
  std::vector<uint32_t> v;
  const uint32_t lows[] = {0,       1,       2,       3,       0x7FFF,  0x8000,
                           0x8001,  0xFFFF,  0x10000, 0x10001, 0x1FFFF, 0x3FFFF,
                           0x7FFFF, 0x80000, 0x80001, 0xFFFFF, 0x5555,  0x2AAAA};
  for (uint32_t se = 0; se < 512; ++se) {
    for (uint32_t hi = 0; hi < 128; ++hi) {
      for (uint32_t lo : lows) v.push_back(se << 23 | hi << 16 | (lo & 0xFFFFu));
    }
  }
  for (uint32_t se = 0; se < 512; ++se) {
    for (uint32_t hi = 0; hi < 8; ++hi) {
      for (uint32_t lo : lows) v.push_back(se << 23 | hi << 20 | (lo & 0xFFFFFu));
    }
  }
  std::mt19937 rng(12345);
  for (int i = 0; i < (1 << 24); ++i) v.push_back(rng());
  return v;
}

// The MXFP4 scale as a multiply (core::kInv6Bits): ue8m0(fl(a * fl(1/6))) ==
// ue8m0(fl(a / 6)) for every non-negative finite fp32 a in optimized builds (~5 s on 2
// cores), the fp8 sample's non-negative finite patterns otherwise; +Inf as well.
// bf16 pass-through: the integer form (formats/bf16/codec.h) against the reference's
// nearest-even search in double, on every fp16 and on every fp32 of a stride through all
// 2^32 (each exponent, sign and NaN payload class, the ties and their neighbours planted).
TEST(CoreVsReference, Bf16FromFp16EveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(core::bf16_from_half(static_cast<uint16_t>(h)), megamoe_ref::bf16_rne_half(static_cast<uint16_t>(h)))
        << std::hex << h;
  }
}

TEST(CoreVsReference, Bf16FromFp32SweepAndTies) {
  auto check = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    ASSERT_EQ(core::bf16_from_float(f), megamoe_ref::bf16_rne(f)) << std::hex << u;
  };
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) check(static_cast<uint32_t>(u));
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) check((hi << 16) | lo);
  }
}

TEST(CoreVsReference, Mxfp4ScaleByMultiplyEqualsDivision) {
  const bool all = kFullSweeps;
  std::vector<uint32_t> sample;
  if (!all) {
    for (uint32_t u : fp8_sample_patterns()) {
      if (u <= 0x7F800000u) sample.push_back(u);
    }
  }
  const uint64_t n = all ? uint64_t{0x7F800001u} : sample.size();
  std::atomic<uint64_t> bad{0};
  parallel_for(n, [&](uint64_t lo, uint64_t hi) {
    uint64_t local = 0;
    for (uint64_t i = lo; i < hi; ++i) {
      const float a = u2f(all ? static_cast<uint32_t>(i) : sample[i]);
      const float q = a / 6.0f;  // IEEE division, rounded to nearest even
      local += core::ue8m0_exponent(core::mul_rn(a, core::bits_float(core::kInv6Bits))) != core::ue8m0_exponent(q);
    }
    bad += local;
  });
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_EQ(core::bits_float(core::kInv6Bits), 1.0f / 6.0f);
}

TEST(CoreVsReference, Fp8AllFloatBitPatterns) {
  const bool all = kFullSweeps;
  const std::vector<uint32_t> sample = all ? std::vector<uint32_t>{} : fp8_sample_patterns();
  const uint64_t n = all ? uint64_t{1} << 32 : sample.size();
  std::atomic<uint64_t> bad{0};
  std::atomic<uint64_t> first{~uint64_t{0}};
  parallel_for(n, [&](uint64_t lo, uint64_t hi) {
    uint64_t local = 0, lfirst = ~uint64_t{0};
    for (uint64_t i = lo; i < hi; ++i) {
      const uint32_t u = all ? static_cast<uint32_t>(i) : sample[i];
      const float f = u2f(u);
      const uint8_t want = megamoe_ref::fp8_e4m3(f);
      if (core::fp8_e4m3_from_float_sw(f) != want || core::fp8_e4m3_from_float(f) != want) {
        if (local++ == 0) lfirst = u;
      }
    }
    bad += local;
    uint64_t cur = first.load();
    while (lfirst < cur && !first.compare_exchange_weak(cur, lfirst)) {
    }
  });
  if (bad != 0) {
    const float f = u2f(static_cast<uint32_t>(first.load()));
    FAIL() << bad.load() << " patterns differ; first 0x" << std::hex << first.load()
           << ": core 0x" << int(core::fp8_e4m3_from_float_sw(f)) << ", reference 0x"
           << int(megamoe_ref::fp8_e4m3(f));
  }
}

TEST(CoreVsReference, E5m2AllFloatBitPatterns) {
  const bool all = kFullSweeps;
  const std::vector<uint32_t> sample = all ? std::vector<uint32_t>{} : fp8_sample_patterns();
  const uint64_t n = all ? uint64_t{1} << 32 : sample.size();
  std::atomic<uint64_t> bad{0};
  parallel_for(n, [&](uint64_t lo, uint64_t hi) {
    uint64_t local = 0;
    for (uint64_t i = lo; i < hi; ++i) {
      const float f = u2f(all ? static_cast<uint32_t>(i) : sample[i]);
      const uint8_t want = megamoe_ref::fp8_e5m2(f);
      if (core::fp8_e5m2_from_float_sw(f) != want || core::fp8_e5m2_from_float(f) != want) ++local;
    }
    bad += local;
  });
  EXPECT_EQ(bad.load(), 0u);
  std::mt19937 rng(11);
  for (int i = 0; i < 100000; ++i) {
    const float a = u2f(rng()), b = u2f(rng());
    const uint16_t p = core::fp8x2_e5m2_from_float(a, b);
    ASSERT_EQ(p & 0xFF, megamoe_ref::fp8_e5m2(a));
    ASSERT_EQ(p >> 8, megamoe_ref::fp8_e5m2(b));
  }
}

TEST(CoreVsReference, Fp8PairPacking) {
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const float a = u2f(rng()), b = u2f(rng());
    const uint16_t p = core::fp8x2_e4m3_from_float(a, b);
    ASSERT_EQ(p & 0xFF, megamoe_ref::fp8_e4m3(a));
    ASSERT_EQ(p >> 8, megamoe_ref::fp8_e4m3(b));
  }
}

TEST(CoreVsReference, WideningAll16BitPatterns) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    ASSERT_EQ(f2u(core::bf16_to_float(static_cast<uint16_t>(h))),
              f2u(megamoe_ref::bf16_to_float(static_cast<uint16_t>(h))))
        << "bf16 0x" << std::hex << h;
    ASSERT_EQ(f2u(core::half_to_float(static_cast<uint16_t>(h))),
              f2u(megamoe_ref::half_to_float(static_cast<uint16_t>(h))))
        << "fp16 0x" << std::hex << h;
  }
}

/// Reference group scale of a NaN-free amax: (UE8M0 byte, scale, 1/scale).
struct RefScale {
  int e;
  float scale;
  float inv;
};
RefScale ref_scale(float amax, bool ue8m0) {
  using namespace megamoe_ref::detail;
  const float s = mul_f32(std::max(amax, 1e-4f), inv448());
  RefScale r{0, s, 0.0f};
  if (ue8m0) {
    r.e = ue8m0_byte(s);
    r.scale = std::ldexp(1.0f, r.e - 127);
  }
  r.inv = div_f32(1.0f, r.scale);
  return r;
}

/// Bits of non-negative amaxes: the 64 lowest and highest mantissas of every exponent field
/// (where the ceil and clamps switch) and a walk over the finite ones in steps of @p stride.
std::vector<uint32_t> amax_sample(uint32_t stride) {
  std::vector<uint32_t> pats;
  for (uint32_t e = 0; e <= 0xFF; ++e) {
    for (uint32_t m = 0; m < 64; ++m) {
      pats.push_back(e << 23 | m);
      pats.push_back(e << 23 | (0x7FFFFFu - m));
    }
  }
  for (uint32_t u = 0; u < 0x7F800000u; u += stride) pats.push_back(u);
  return pats;
}

// Every non-negative amax of amax_sample(31).
TEST(CoreVsReference, GroupScaleDenseSample) {
  const std::vector<uint32_t> pats = amax_sample(31);
  std::atomic<uint64_t> bad{0};
  parallel_for(pats.size(), [&](uint64_t lo, uint64_t hi) {
    for (uint64_t i = lo; i < hi; ++i) {
      const float amax = u2f(pats[i]);
      if (std::isnan(amax)) continue;
      for (bool ue8m0 : {true, false}) {
        // The fp8 recipe's group parameters (formats/fp8/recipe.h) at the default floor.
        const core::GroupParams g = ue8m0 ? core::fp8_group_params<core::Sf::kUE8M0x4, core::Elem::kE4M3>(amax, core::kAmaxFloor)
                                          : core::fp8_group_params<core::Sf::kFp32, core::Elem::kE4M3>(amax, core::kAmaxFloor);
        const float scale = ue8m0 ? core::ue8m0_scale(g.sf) : u2f(g.sf);
        const RefScale r = ref_scale(amax, ue8m0);
        const bool ok = f2u(scale) == f2u(r.scale) && f2u(g.m) == f2u(r.inv) &&
                        (!ue8m0 || static_cast<int>(g.sf) == r.e);
        if (!ok && bad++ < 5) {
          ADD_FAILURE() << "amax 0x" << std::hex << pats[i] << (ue8m0 ? " ue8m0" : " fp32")
                        << ": core scale 0x" << f2u(scale) << " inv 0x" << f2u(g.m)
                        << " sf " << std::dec << g.sf << "; reference scale 0x" << std::hex
                        << f2u(r.scale) << " inv 0x" << f2u(r.inv) << " e " << std::dec << r.e;
        }
      }
    }
  });
  EXPECT_EQ(bad.load(), 0u);
}

// Floor 0: the recipes' unit-scale rules (formats/format_list.h: UE8M0 byte 127 for a zero
// amax, fp32 scale 1 for s <= 2^-128, pts 1 for a row below 2^-100) against the reference's,
// written another way (an infinite reciprocal formed in double, ldexp's 2^-100), on the 64
// lowest and highest mantissas of every exponent and a stride-997 walk (amax_sample), each
// finite amax a group of one element: the scale byte or fp32 scale and the element's code.
TEST(CoreVsReference, FloorZeroUnitScaleDenseSample) {
  namespace rd = megamoe_ref::detail;
  EXPECT_TRUE(std::isinf(rd::div_f32(1.0f, core::kFp32ScaleNoRecip)));
  EXPECT_TRUE(std::isfinite(rd::div_f32(1.0f, std::nextafter(core::kFp32ScaleNoRecip, 1.0f))));
  const std::vector<uint32_t> pats = amax_sample(997);
  std::atomic<uint64_t> bad{0};
  parallel_for(pats.size(), [&](uint64_t lo, uint64_t hi) {
    for (uint64_t i = lo; i < hi; ++i) {
      const float amax = u2f(pats[i]);
      if (!std::isfinite(amax)) continue;
      const float x[1] = {amax};
      uint8_t q[1] = {0};
      float s = 0.0f;
      bool ok = true;
      for (int kind = 0; kind < 3; ++kind) {  // e4m3 UE8M0, e4m3 fp32, e5m2 UE8M0
        const bool ue8m0 = kind != 1, e5m2 = kind == 2;
        const int e = rd::fp8_group(x, 1, ue8m0, 0.0f, &s, q, e5m2);
        core::GroupParams g;
        uint32_t code;
        if (kind == 0) {
          g = core::fp8_group_params<core::Sf::kUE8M0x4, core::Elem::kE4M3>(amax, 0.0f);
          code = core::fp8_encode<core::Elem::kE4M3>(amax, g);
        } else if (kind == 1) {
          g = core::fp8_group_params<core::Sf::kFp32, core::Elem::kE4M3>(amax, 0.0f);
          code = core::fp8_encode<core::Elem::kE4M3>(amax, g);
        } else {
          g = core::fp8_group_params<core::Sf::kUE8M0x4, core::Elem::kE5M2>(amax, 0.0f);
          code = core::fp8_encode<core::Elem::kE5M2>(amax, g);
        }
        ok = ok && (ue8m0 ? static_cast<int>(g.sf) == e : g.sf == f2u(s)) && code == q[0];
      }
      for (const bool rne : {false, true}) {
        const int e = rd::mxfp4_group(x, 1, 0.0f, rne ? megamoe_ref::Fp4Ties::kNearestEven : megamoe_ref::Fp4Ties::kTowardZero, q);
        const core::GroupParams g = core::mxfp4_group_params(amax, 0.0f);
        const uint32_t code = rne ? core::encode<core::Format::kMxfp4Rne>(amax, g) : core::encode<core::Format::kMxfp4>(amax, g);
        ok = ok && static_cast<int>(g.sf) == e && code == q[0];
      }
      if (!ok && bad++ < 5) {
        ADD_FAILURE() << "amax 0x" << std::hex << pats[i];
      }
    }
  });
  EXPECT_EQ(bad.load(), 0u);
  // Per-token: rows around 2^-100 (one element carries the row's max), through the
  // reference's staging.
  const float t = 0x1p-100f;
  for (const float ra : {0.0f, u2f(1u), 0x1p-101f, std::nextafter(t, 0.0f), t, std::nextafter(t, 1.0f), 1e-30f, 1.0f,
                         std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> row(64, 0.0f);  // four groups: one scale word
    row[3] = ra;
    const auto r = megamoe_ref::stage(row.data(), 1, 64, nullptr, nullptr, 0, nullptr,
                                      megamoe_ref::Format::nvfp4_per_token(0.0f));
    const float pts = core::per_token_scale(std::isnan(ra) ? 0.0f : ra, 0.0f);
    EXPECT_EQ(f2u(pts), f2u(r.x_scales[0])) << ra;
    EXPECT_EQ(f2u(pts), ra < t || std::isnan(ra) ? 0x3F800000u : f2u(rd::div_f32(ra, 2688.0f))) << ra;
  }
}

// The division-free UE8M0 multiplier equals the IEEE quotient 1 / 2^(e-127) for every byte
// the scale can take, including e = 254 where the quotient is the subnormal 2^-127.
TEST(CoreVsReference, Ue8m0InverseEveryExponent) {
  for (uint32_t e = 1; e <= 254; ++e) {
    const float scale = u2f(e << 23);
    EXPECT_EQ(f2u(core::ue8m0_inv_scale(e)), f2u(megamoe_ref::detail::div_f32(1.0f, scale))) << "e = " << e;
  }
  EXPECT_EQ(f2u(core::ue8m0_inv_scale(254)), 0x00400000u);
  EXPECT_EQ(f2u(core::ue8m0_inv_scale(127)), 0x3F800000u);
}

TEST(CoreVsReference, NanIgnoringMax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(core::fmax_nan_ignoring(nan, 2.0f), 2.0f);
  EXPECT_EQ(core::fmax_nan_ignoring(2.0f, nan), 2.0f);
  EXPECT_EQ(core::fmax_nan_ignoring(1.0f, 2.0f), 2.0f);
  EXPECT_TRUE(std::isnan(core::fmax_nan_ignoring(nan, nan)));
  EXPECT_EQ(f2u(core::abs_bits(u2f(0xFFC00000u))), 0x7FC00000u);
  EXPECT_EQ(f2u(core::abs_bits(-0.0f)), 0u);
}

TEST(CoreVsReference, SharedRowMap) {
  for (int64_t bm = 1; bm <= 300; ++bm) {
    for (int64_t t = 0; t < 1000; ++t) {
      ASSERT_EQ(core::shared_sf_row(t, bm), megamoe_ref::shared_row(t, bm))
          << "t=" << t << " bm=" << bm;
      // The kernels' 32-bit instantiation (used when every row fits 32 bits) agrees.
      ASSERT_EQ(static_cast<int64_t>(core::shared_sf_row(static_cast<uint32_t>(t), static_cast<uint32_t>(bm))),
                megamoe_ref::shared_row(t, bm))
          << "uint32 t=" << t << " bm=" << bm;
      // The kernels' form: block index by core::fastdiv, then the quotient/remainder map.
      const uint32_t t32 = static_cast<uint32_t>(t), bm32 = static_cast<uint32_t>(bm);
      const uint32_t q = core::fastdiv(t32, core::make_fastdiv(bm32));
      ASSERT_EQ(static_cast<int64_t>(core::shared_sf_row_qm(q, t32 - q * bm32, core::aligned_block_m(bm32))),
                megamoe_ref::shared_row(t, bm))
          << "fastdiv t=" << t << " bm=" << bm;
    }
    // Rows required: one past the largest row any of T tokens can map to, rounded to abm.
    for (int64_t T : {1, 7, 64, 65, 300, 999}) {
      int64_t max_row = 0;
      for (int64_t t = 0; t < T; ++t) max_row = std::max(max_row, megamoe_ref::shared_row(t, bm));
      const int64_t abm = (bm + 127) / 128 * 128;
      // output_shapes, the one shape rule, sizes shared_x_sf.
      const int64_t rows = megamoe::output_shapes(T, 256, 1, megamoe::QuantScheme::mxfp8(), bm).shared_x_sf->shape[0];
      EXPECT_EQ(rows, (T + bm - 1) / bm * abm);
      EXPECT_GT(rows, max_row);
    }
  }
  // Large t: no overflow in the 64-bit index math.
  const int64_t big = (int64_t{1} << 40) + 77;
  EXPECT_EQ(core::shared_sf_row(big, int64_t{96}), megamoe_ref::shared_row(big, 96));
}

TEST(CoreVsReference, Ue8m0WordPacking) {
  for (int64_t g = 0; g < 64; ++g) {
    EXPECT_EQ(core::ue8m0_word(g), g / 4);
    EXPECT_EQ(core::ue8m0_shift(g), static_cast<uint32_t>(8 * (g % 4)));
  }
}

/// Every bf16 bit pattern, NaN ones too unless @p nan is false.
std::vector<uint32_t> bf16_patterns(bool nan) {
  std::vector<uint32_t> v;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    if (nan || (b & 0x7FFFu) <= 0x7F80u) v.push_back(b);
  }
  return v;
}

/// Every non-NaN bf16 pattern, in each half of a word (the other half another pattern),
/// through core::e2m1_pair_nibbles<kEven> with @p keys, against want(x) (the reference)
/// and have(x) (core::encode); returns the mismatches, the first few reported.
template <bool kEven, typename Want, typename Have>
int64_t sweep_bf16_pairs(const core::E2m1PairKeys& keys, Want want, Have have, const std::string& what) {
  static const std::vector<uint32_t> pats = bf16_patterns(false);
  const size_t n = pats.size();
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t lo = pats[i], hi = pats[(i * 7919u + 104729u) % n];
    const uint32_t got = core::e2m1_pair_nibbles<kEven>(lo | (hi << 16), keys);
    for (int h = 0; h < 2; ++h) {
      const uint32_t bits = h == 0 ? lo : hi;
      const float x = megamoe_ref::bf16_to_float(static_cast<uint16_t>(bits));
      const uint32_t w = want(x), c = have(x), nib = (got >> (16 * h)) & 0xFFFFu;
      if ((nib != w || c != w) && ++bad <= 4) {
        ADD_FAILURE() << what << " bf16=0x" << std::hex << bits << ": pairs 0x" << nib << ", core 0x" << c
                      << ", reference 0x" << w;
      }
    }
  }
  return bad;
}

// The two-at-a-time MXFP4 codec of the CUDA kernels (formats/e2m1/pairs.h) against the
// reference's e2m1 of fl(x * 2^(127-e)) and against core::encode, for every non-NaN bf16
// bit pattern in each half of a word and every UE8M0 byte e it takes, both tie rules; the
// NaN flag for every pattern; the byte packing of two pairs.
template <bool kEven>
void check_e2m1_pairs() {
  using megamoe_ref::Fp4Ties;
  constexpr core::Format F = kEven ? core::Format::kMxfp4Rne : core::Format::kMxfp4;
  const Fp4Ties ties = kEven ? Fp4Ties::kNearestEven : Fp4Ties::kTowardZero;
  int64_t bad = 0;
  for (uint32_t e = core::kPairsMinE; e <= core::kPairsMaxE; ++e) {
    const core::GroupParams gp{e, core::ue8m0_inv_scale(e)};
    const auto want = [&](float x) {
      return megamoe_ref::fp4_e2m1(static_cast<float>(std::ldexp(static_cast<double>(x), 127 - static_cast<int>(e))),
                                   ties);
    };
    const auto have = [&](float x) { return core::encode<F>(x, gp); };
    bad += sweep_bf16_pairs<kEven>(core::e2m1_pair_keys<kEven>(e), want, have,
                                   std::string(kEven ? "rne" : "ttz") + " e=" + std::to_string(e));
  }
  EXPECT_EQ(bad, 0);
}

TEST(CoreVsReference, Mxfp4PairsEveryBf16AndExponentTtz) { check_e2m1_pairs<false>(); }
TEST(CoreVsReference, Mxfp4PairsEveryBf16AndExponentRne) { check_e2m1_pairs<true>(); }

/// Every bf16 pattern of @p pats once, in chunks of 16 (pattern i at position
/// (i + rotate) % 16), through encode(w, out) (a chunk codec), against want(x) (the
/// reference) and have(x) (core::encode); returns the mismatches, the first few reported,
/// and adds the values checked to @p checked.
template <typename Encode, typename Want, typename Have>
int64_t sweep_bf16_chunks(const std::vector<uint32_t>& pats, uint32_t rotate, Encode encode, Want want, Have have,
                          const std::string& what, int64_t& checked) {
  const size_t n = pats.size();
  int64_t bad = 0;
  for (size_t base = 0; base < n; base += 16) {
    uint16_t v[16];
    for (uint32_t i = 0; i < 16; ++i) v[(i + rotate) % 16] = static_cast<uint16_t>(pats[(base + i) % n]);
    uint32_t w[8], out[2];
    for (int i = 0; i < 8; ++i) w[i] = v[2 * i] | (static_cast<uint32_t>(v[2 * i + 1]) << 16);
    encode(w, out);
    for (int i = 0; i < 16; ++i) {
      const float x = megamoe_ref::bf16_to_float(v[i]);
      const uint32_t got = (out[i / 8] >> (4 * (i % 8))) & 0xFu, wv = want(x), c = have(x);
      ++checked;
      if ((got != wv || c != wv) && ++bad <= 4) {
        ADD_FAILURE() << what << " position " << i << " bf16=0x" << std::hex << v[i] << ": chunk form 0x" << got
                      << ", core 0x" << c << ", reference 0x" << wv;
      }
    }
  }
  return bad;
}

/// NVFP4 static divisors for the chunk-codec tests: both ends of the range, near powers of
/// two, e4m3 scale values times typical global scales (powers of two among them), log-
/// uniform random ones, and ones that put x / d within a few ulps of a midpoint.
std::vector<float> static_divisors() {
  std::vector<float> ds = {core::kPairsMinDivisor, core::kPairsMaxDivisor, 1.0f, 0.5f, 3.0f, 448.0f, 0x1p-9f};
  for (float p2 : {0x1p-60f, 0x1p-3f, 1.0f, 0x1p7f, 0x1p40f}) {
    ds.push_back(std::nextafter(p2, 0.0f));
    ds.push_back(std::nextafter(p2, 1e30f));
  }
  std::mt19937 rng(20261201u);
  std::uniform_int_distribution<int> e4m3(1, 0x7E);
  std::uniform_real_distribution<double> lg(-100.0, 100.0), gs(-12.0, 4.0);
  for (int i = 0; i < 60; ++i) {  // sf * gs as the kernels form it
    const float sf = static_cast<float>(megamoe_ref::detail::fp8_value(e4m3(rng)));
    ds.push_back(core::mul_rn(sf, static_cast<float>(std::exp2(gs(rng)))));
  }
  for (int code = 1; code <= 0x7E; code += 5) {  // global scales 1 and 2^-7
    const float sf = static_cast<float>(megamoe_ref::detail::fp8_value(code));
    ds.push_back(sf);
    ds.push_back(core::mul_rn(sf, 0x1p-7f));
  }
  for (int i = 0; i < 120; ++i) ds.push_back(static_cast<float>(std::exp2(lg(rng))));
  // Divisors that put x / d within a few ulps of a midpoint (ties and near-ties): d next to
  // fl(x / M) for a few bf16 x.
  for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
    for (float x : {1.0f, 1.5f, 3.0f, 0.8125f, 96.0f}) {
      const float d0 = megamoe_ref::detail::div_f32(x, m);
      uint32_t b = core::float_bits(d0) - 4u;
      for (int j = 0; j < 9; ++j) ds.push_back(core::bits_float(b++));
    }
  }
  return ds;
}

// NVFP4 static's f16 chunk codec (formats/e2m1/f16.h, its host form) against the reference's
// e2m1 of fl(x / d) and core::encode, every bf16 (NaN included) at a position that moves
// with the divisor, for the divisors of static_divisors().
TEST(CoreVsReference, Nvfp4StaticF16ChunksEveryBf16AndManyDivisors) {
  const std::vector<float> ds = static_divisors();
  const std::vector<uint32_t> pats = bf16_patterns(true);
  int64_t bad = 0, checked = 0, used = 0;
  for (const float d : ds) {
    if (!(d >= core::kPairsMinDivisor && d <= core::kPairsMaxDivisor)) continue;
    const core::GroupParams gp{0u, d};
    const auto want = [&](float x) {
      return megamoe_ref::fp4_e2m1(megamoe_ref::detail::div_f32(x, d), megamoe_ref::Fp4Ties::kTowardZero);
    };
    const auto have = [&](float x) { return core::encode<core::Format::kNvfp4Static>(x, gp); };
    const core::E2m1F16Keys keys = core::e2m1_f16_keys(d);
    const auto encode = [&](const uint32_t (&w)[8], uint32_t (&out)[2]) { core::e2m1_f16_chunk(w, keys, out); };
    std::ostringstream what;
    what << "d=" << std::hexfloat << d;
    bad += sweep_bf16_chunks(pats, static_cast<uint32_t>(used++ % 16), encode, want, have, what.str(), checked);
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(used, 400);
  EXPECT_EQ(checked, used * 65536);
}

// NVFP4 static through the multiply form (core::nvfp4_static_multiplier, then
// core::e2m1_f16_mul_chunk; the loop shape's table): for every divisor of
// static_divisors() that has a multiplier, every bf16 (NaN included) against the reference's
// e2m1 of fl(x / d) and core::encode. For those without one (the check fired), the form
// with r = rd(1 / d) forced is wrong on some bf16: the check refuses exactly the divisors
// it must.
TEST(CoreVsReference, Nvfp4StaticMulChunksEveryBf16AndManyDivisors) {
  const std::vector<float> ds = static_divisors();
  const std::vector<uint32_t> pats = bf16_patterns(true);
  int64_t bad = 0, checked = 0, used = 0, refused = 0, forced_wrong = 0, forced = 0;
  for (const float d : ds) {
    if (!(d >= core::kPairsMinDivisor && d <= core::kPairsMaxDivisor)) {
      EXPECT_EQ(core::float_bits(core::nvfp4_static_multiplier(d)), 0u);
      continue;
    }
    const auto want = [&](float x) {
      return megamoe_ref::fp4_e2m1(megamoe_ref::detail::div_f32(x, d), megamoe_ref::Fp4Ties::kTowardZero);
    };
    const float r = core::nvfp4_static_multiplier(d);
    if (r == 0.0f) {
      ++refused;

      if (forced < 40) {  // the form with rd(1 / d) would be wrong somewhere
        ++forced;
        const float rz = core::recip_rz(d);
        bool wrong = false;
        for (uint32_t b = 0; b < 0x10000u && !wrong; ++b) {
          uint32_t w[8], out[2];
          for (uint32_t& v : w) v = b | (b << 16);
          core::e2m1_f16_mul_chunk(w, rz, out);
          wrong = (out[0] & 0xFu) != want(megamoe_ref::bf16_to_float(static_cast<uint16_t>(b)));
        }
        forced_wrong += wrong ? 1 : 0;
      }
      continue;
    }
    EXPECT_EQ(core::float_bits(r), core::float_bits(core::recip_rz(d)));
    EXPECT_GE(r, core::kF16MulMinMultiplier);  // the kernels take the f16 form unchecked
    const core::GroupParams gp{0u, d};
    const auto have = [&](float x) { return core::encode<core::Format::kNvfp4Static>(x, gp); };
    const auto encode = [&](const uint32_t (&w)[8], uint32_t (&out)[2]) { core::e2m1_f16_mul_chunk(w, r, out); };
    std::ostringstream what;
    what << "d=" << std::hexfloat << d << " r=" << r;
    bad += sweep_bf16_chunks(pats, static_cast<uint32_t>(used++ % 16), encode, want, have, what.str(), checked);
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(used, 300);
  EXPECT_EQ(checked, used * 65536);
  EXPECT_GT(forced, 0);  // the planted near-ties reach the check
  EXPECT_EQ(forced_wrong, forced);
  std::printf("nvfp4_static_multiplier: %lld of %zu divisors refused\n", static_cast<long long>(refused), ds.size());
}

// A scale byte's multiplier as the kernels form it (of core::nvfp4_static_divisor(sf, gs)):
// e4m3_to_float is exact for every byte (the host form; the device's cvt form is checked
// against it in tests/cuda), and bytes 0 and 0x7F have none.
TEST(CoreVsReference, Nvfp4StaticMultiplierOfEveryScaleByte) {
  for (uint32_t sf = 0; sf < 256; ++sf) {
    const float f = core::e4m3_to_float(sf);
    if ((sf & 0x7Fu) == 0x7Fu) {
      EXPECT_NE(f, f) << sf;
      continue;
    }
    const double v = megamoe_ref::detail::fp8_value(static_cast<int>(sf & 0x7Fu));
    EXPECT_EQ(static_cast<double>(f), (sf & 0x80u) ? -v : v) << sf;
    EXPECT_EQ(std::signbit(f), (sf & 0x80u) != 0u) << sf;
  }
  for (float gs : {1.0f, 0.37f, 0x1p-7f, 0.0f}) {
    EXPECT_EQ(core::nvfp4_static_multiplier(core::nvfp4_static_divisor(0u, gs)), 0.0f);
    EXPECT_EQ(core::nvfp4_static_multiplier(core::nvfp4_static_divisor(0x7Fu, gs)), 0.0f);
  }
  // How often a byte has no multiplier (its groups then take the per-value division): never
  // for power-of-two global scales, rarely for others.
  std::mt19937 rng(20261203u);
  std::uniform_real_distribution<double> lg(-20.0, 10.0);
  int64_t refused = 0, n = 0;
  for (int i = 0; i < 400; ++i) {
    const float gs = i < 31 ? static_cast<float>(std::exp2(i - 20)) : static_cast<float>(std::exp2(lg(rng)));
    for (uint32_t sf = 1; sf <= 0x7Eu; ++sf, ++n) {
      const bool none = core::nvfp4_static_multiplier(core::nvfp4_static_divisor(sf, gs)) == 0.0f;
      refused += none ? 1 : 0;
      if (i < 31) {
        EXPECT_FALSE(none) << "gs 2^" << i - 20 << " sf " << sf;
      }
    }
  }
  EXPECT_LE(refused * 200, n) << refused << " of " << n;
  std::printf("scale bytes without a multiplier: %lld of %lld\n", static_cast<long long>(refused),
              static_cast<long long>(n));
}

// NVFP4 per-token's chunk codec of fl(x * m) (core::e2m1_mul_chunk, its host form: the f16
// form of formats/e2m1/f16mul.h, below its range the fp32 one of formats/e2m1/fp32.h) against the
// reference's e2m1 of fl(x * m) and core::encode, every bf16 (NaN included) at a position
// that moves with the multiplier: 0, powers of two and their neighbours, the fp32 ends
// and Inf, both sides of the f16 form's least multiplier, the multipliers the per-token
// path forms (1 / (sf * pts) for e4m3 scales and typical row maxima), log-uniform random
// ones, and ones that put x * m within a few ulps of a midpoint.
TEST(CoreVsReference, Nvfp4PerTokenMulChunksEveryBf16AndManyMultipliers) {
  using megamoe_ref::detail::div_f32;
  using megamoe_ref::detail::mul_f32;
  std::vector<float> ms = {0.0f, 1.0f, 0.5f, 3.0f, 1.0f / 3.0f, 0x1p-149f, 0x1p-126f, 0x1.fffffep127f,
                           std::numeric_limits<float>::infinity(), 0x1.3p-124f, 0x1.7p-140f};
  for (float p2 : {core::kF16MulMinMultiplier, 0x1p-100f, 0x1p-3f, 1.0f, 0x1p7f, 0x1p60f}) {
    ms.push_back(std::nextafter(p2, 0.0f));
    ms.push_back(p2);
    ms.push_back(std::nextafter(p2, 1e30f));
  }
  std::mt19937 rng(20261203u);
  std::uniform_int_distribution<int> e4m3(1, 0x7E);
  std::uniform_real_distribution<double> lg(-120.0, 120.0), row(-20.0, 20.0);
  for (int i = 0; i < 60; ++i) {
    const float pts = div_f32(static_cast<float>(std::exp2(row(rng))), 2688.0f);
    const float sf = static_cast<float>(megamoe_ref::detail::fp8_value(e4m3(rng)));
    ms.push_back(div_f32(1.0f, mul_f32(sf, pts)));
  }
  for (int i = 0; i < 100; ++i) ms.push_back(static_cast<float>(std::exp2(lg(rng))));
  for (float mid : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
    for (float x : {1.0f, 1.5f, 3.0f, 0.8125f, 96.0f, 0.0078125f}) {
      uint32_t b = core::float_bits(div_f32(mid, x)) - 4u;
      for (int j = 0; j < 9; ++j) ms.push_back(core::bits_float(b++));
    }
  }
  const std::vector<uint32_t> pats = bf16_patterns(true);
  int64_t bad = 0, checked = 0, used = 0, f16 = 0, fp32 = 0;
  for (const float m : ms) {
    const core::GroupParams gp{0u, m};
    const auto want = [&](float x) { return megamoe_ref::fp4_e2m1(mul_f32(x, m), megamoe_ref::Fp4Ties::kTowardZero); };
    const auto have = [&](float x) { return core::encode<core::Format::kNvfp4PerToken>(x, gp); };
    const auto encode = [&](const uint32_t (&w)[8], uint32_t (&out)[2]) { core::e2m1_mul_chunk(w, m, out); };
    (core::f16_mul_applies(m) ? f16 : fp32) += 1;
    std::ostringstream what;
    what << "m=" << std::hexfloat << m;
    bad += sweep_bf16_chunks(pats, static_cast<uint32_t>(used++ % 16), encode, want, have, what.str(), checked);
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(used, 500);
  EXPECT_GT(f16, 400);
  EXPECT_GE(fp32, 5);  // 0 < m < 2^-123
  EXPECT_EQ(checked, used * 65536);
}

/// The fp32-pipe MXFP4 chunk codec of the CUDA kernels (formats/e2m1/fp32.h, its host form)
/// against the reference's e2m1 of x * 2^(127-e) and core::encode: for every exponent in
/// range, chunks that hold every bf16 pattern once (at a position that moves with e); for a
/// few exponents, every pattern at every one of the 16 positions. NaN patterns only for
/// ties toward zero (nearest even's caller takes the per-value path on a NaN).
template <bool kEven>
void check_e2m1_fp32() {
  using megamoe_ref::Fp4Ties;
  constexpr core::Format F = kEven ? core::Format::kMxfp4Rne : core::Format::kMxfp4;
  const Fp4Ties ties = kEven ? Fp4Ties::kNearestEven : Fp4Ties::kTowardZero;
  const std::vector<uint32_t> pats = bf16_patterns(!kEven);
  int64_t bad = 0, checked = 0;
  auto sweep = [&](uint32_t e, uint32_t rotate) {
    const core::GroupParams gp{e, core::ue8m0_inv_scale(e)};
    const core::E2m1Fp32Keys keys = core::e2m1_fp32_keys(e);
    const auto encode = [&](const uint32_t (&w)[8], uint32_t (&out)[2]) { core::e2m1_fp32_chunk<kEven>(w, keys, out); };
    const auto want = [&](float x) {
      return megamoe_ref::fp4_e2m1(static_cast<float>(std::ldexp(static_cast<double>(x), 127 - static_cast<int>(e))),
                                   ties);
    };
    const auto have = [&](float x) { return core::encode<F>(x, gp); };
    bad += sweep_bf16_chunks(pats, rotate, encode, want, have, std::string(kEven ? "rne" : "ttz") + " e=" + std::to_string(e),
                             checked);
  };
  for (uint32_t e = core::kFp32MinE; e <= core::kFp32MaxE; ++e) sweep(e, e % 16);
  for (uint32_t e : {1u, 2u, 100u, 121u, 127u, 133u, 200u, 250u}) {
    for (uint32_t r = 1; r < 16; ++r) sweep(e, (e + r) % 16);
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(checked, static_cast<int64_t>((core::kFp32MaxE - core::kFp32MinE + 1 + 8 * 15) * ((pats.size() + 15) / 16) * 16));
}

TEST(CoreVsReference, Mxfp4Fp32ChunksEveryBf16PositionAndExponentTtz) { check_e2m1_fp32<false>(); }
TEST(CoreVsReference, Mxfp4Fp32ChunksEveryBf16PositionAndExponentRne) { check_e2m1_fp32<true>(); }

// The host forms of the fp32 codec's instructions: prmt's byte select and sign
// replication, the e5m2 bytes of z, the saturating fma's roundings.
TEST(CoreVsReference, Mxfp4Fp32Instructions) {
  EXPECT_EQ(core::prmt(0x33221100u, 0x77665544u, 0x7531u), 0x77553311u);
  EXPECT_EQ(core::prmt(0x0080FF7Fu, 0x80000001u, 0x0F98u), 0x7FFFFF00u);  // sign replication
  EXPECT_EQ(core::e5m2_of_z_sw(0.0f), 0u);
  EXPECT_EQ(core::e5m2_of_z_sw(2.0f), 0x40u);
  EXPECT_EQ(core::e5m2_of_z_sw(std::nextafter(2.0f, 0.0f)), 0x40u);
  EXPECT_EQ(core::e5m2_of_z_sw(2.25f), 0x40u);  // tie: even
  EXPECT_EQ(core::e5m2_of_z_sw(2.75f), 0x42u);  // tie: even
  EXPECT_EQ(core::e5m2_of_z_sw(6.5f), 0x46u);
  EXPECT_EQ(core::e5m2_of_z_sw(7.0f), 0x47u);
  EXPECT_EQ(core::e5m2_of_z_sw(1.0f), 0x3Cu);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(core::fma_sat<true>(nan, 1.0f, 0.25f), 0.0f);
  EXPECT_EQ(core::fma_sat<false>(inf, 0x1p-126f, -2.0f), 1.0f);
  EXPECT_EQ(core::fma_sat<true>(0.0f, 1.0f, 0.25f - 0x1p-26f), 0.25f - 0x1p-26f);
  EXPECT_EQ(core::fma_sat<true>(0.5f, 1.0f, 0.25f - 0x1p-26f), 0.75f - 0x1p-24f);   // rounded down
  EXPECT_EQ(core::fma_sat<false>(0.5f, 1.0f, 0.25f - 0x1p-26f), 0.75f);             // to nearest (even)
  EXPECT_EQ(core::fma_sat<false>(0x1p-100f, 1.0f, 0.25f), 0.25f);
  EXPECT_EQ(core::fma_sat<false>(5.0f, 0.5f, -2.0f), 0.5f);
  EXPECT_EQ(core::fma_sat<false>(3.0f, 0.5f, -2.0f), 0.0f);
}

TEST(CoreVsReference, Mxfp4PairsNanFlagAndPacking) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const bool nan = std::isnan(megamoe_ref::bf16_to_float(static_cast<uint16_t>(b)));
    const uint32_t other = 0x3F80u;  // 1.0 in the other half
    EXPECT_EQ(core::pairs_have_nan(b | (other << 16)), nan ? 0x8000u : 0u) << b;
    EXPECT_EQ(core::pairs_have_nan(other | (b << 16)), nan ? 0x80000000u : 0u) << b;
  }
  // Nibbles a, b (pair 0) and c, d (pair 1) -> bytes b:a, d:c.
  EXPECT_EQ(core::e2m1_pack_two_pairs(0x000F0001u, 0x00070009u), 0x79F1u);
  EXPECT_EQ(core::e2m1_pack_two_pairs(0u, 0x00080000u), 0x8000u);
  const uint32_t p[8] = {0x00020001u, 0x00040003u, 0x00060005u, 0x00080007u,
                         0x000A0009u, 0x000C000Bu, 0x000E000Du, 0x0000000Fu};
  uint32_t w[2];
  core::e2m1_pack_eight_pairs(p, w);
  EXPECT_EQ(w[0], 0x87654321u);
  EXPECT_EQ(w[1], 0x0FEDCBA9u);
}

// recip_refine from the correctly rounded reciprocal and the two nearest floats on either
// side (the GPU's rcp.approx is documented within an ulp) gives the correctly rounded one,
// for every significand at a small, a middle and a large exponent (its steps scale exactly
// between them), the all-ones significand included.
TEST(CoreNumerics, RecipRefineFromTwoUlpsEverySignificand) {
  int64_t bad = 0;
  for (uint32_t e : {15u, 127u, 233u}) {
    for (uint32_t m = 0; m < (1u << 23); ++m) {
      const float y = u2f((e << 23) | m);
      const float rn = megamoe_ref::detail::div_f32(1.0f, y);
      for (int d = -2; d <= 2; ++d) {
        const float got = core::recip_refine(y, u2f(f2u(rn) + static_cast<uint32_t>(d)));
        if (f2u(got) != f2u(rn) && ++bad <= 5) {
          ADD_FAILURE() << "y " << y << " (bits " << f2u(y) << ") from neighbour " << d << ": " << got << " != " << rn;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(f2u(core::recip_nearest(u2f(0x3FFFFFFFu))), f2u(1.0f / u2f(0x3FFFFFFFu)));
}

// sqrt_refine from the correctly rounded reciprocal root and the three nearest floats on
// either side (the GPU's rsqrt.approx is documented within 2^-22.9 relative, about two
// ulps) gives the IEEE square root: every significand of [1, 4) (both exponent parities:
// the steps scale exactly by powers of four between 2^-100 and the top), and of the ends
// of its range, [2^-100, 2^-96) and [2^124, 2^128). sqrt_nearest (scaled below 2^-100,
// special values selected) equals std::sqrt on every 61st bit pattern and the special
// values.
TEST(CoreNumerics, SqrtRefineFromThreeUlpsEverySignificand) {
  int64_t bad = 0;
  for (const auto& range : {std::pair<float, float>{1.0f, 4.0f}, {0x1p-100f, 0x1p-96f}, {0x1p124f, 0.0f}}) {
    const uint32_t end = range.second == 0.0f ? 0x7F800000u : f2u(range.second);
    for (uint32_t u = f2u(range.first); u < end; ++u) {
      const float x = u2f(u);
      const float want = static_cast<float>(std::sqrt(static_cast<double>(x)));  // correctly rounded
      const float y = static_cast<float>(1.0 / std::sqrt(static_cast<double>(x)));
      for (int d = -3; d <= 3; ++d) {
        const float got = core::sqrt_refine(x, u2f(f2u(y) + static_cast<uint32_t>(d)));
        if (f2u(got) != f2u(want) && ++bad <= 5) {
          ADD_FAILURE() << "x " << x << " (bits " << u << ") from neighbour " << d << ": " << got << " != " << want;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  for (uint64_t u = 0; u < 0x7F800000u; u += 61) {
    const float x = u2f(static_cast<uint32_t>(u));
    ASSERT_EQ(f2u(core::sqrt_nearest(x)), f2u(std::sqrt(x))) << "bits " << u;
  }
  for (float x : {0.0f, -0.0f, 0x1p-149f, 0x1p-126f, 0x1.fffffep-101f, 0x1p-100f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(f2u(core::sqrt_nearest(x)), f2u(std::sqrt(x))) << x;
  }
  EXPECT_TRUE(std::isnan(core::sqrt_nearest(NAN)));
}

// div_by_recip equals the IEEE division on every non-negative finite f16 amax (the row
// kernel's f16 and bf16 groups have at most 11 significant bits) over divisors across the
// fast range, and on random fp32 dividends with quotients from 2^-11 up; quotients below
// 2^-126 are only required to stay below it (NVFP4 maps them all to scale byte 0).
TEST(CoreNvfp4Token, DivByRecipEqualsDivision) {
  std::mt19937 rng(20261205);
  std::vector<float> divisors = {0x1p-60f, 0x1p120f, 1.0f, 1.5f, 6.0f / 2688.0f, u2f(0x3FFFFFFFu), u2f(0x21FFFFFFu),
                                 u2f(0x7B7FFFFFu), u2f(0x21800001u), u2f(0x3F800001u)};
  std::uniform_int_distribution<uint32_t> mant(0, 0x7FFFFFu), ex(127 - 60, 127 + 119);
  while (divisors.size() < 160) divisors.push_back(u2f((ex(rng) << 23) | mant(rng)));
  int64_t bad = 0;
  auto check = [&](float a, float b) {
    const float want = megamoe_ref::detail::div_f32(a, b);
    const float got = core::div_by_recip(a, b, megamoe_ref::detail::div_f32(1.0f, b));
    const bool ok = want < 0x1p-126f ? got < 0x1p-126f && got >= 0.0f : f2u(got) == f2u(want);
    if (!ok && ++bad <= 5) ADD_FAILURE() << a << " / " << b << ": " << got << " != " << want;
  };
  for (float b : divisors) {
    for (uint32_t h = 0; h < 0x7C00u; ++h) check(megamoe_ref::half_to_float(static_cast<uint16_t>(h)), b);
  }
  std::uniform_int_distribution<uint32_t> qex(127 - 11, 127 + 10);
  for (int i = 0; i < 4000000; ++i) {
    const float b = divisors[static_cast<size_t>(i) % divisors.size()];
    // a dividend whose quotient by b lies within 2^-11 .. 2^11 (the scale bytes' range)
    const float a = megamoe_ref::detail::mul_f32(u2f((qex(rng) << 23) | mant(rng)), b);
    if (std::isfinite(a)) check(a, b);
  }
  EXPECT_EQ(bad, 0);
}

// NVFP4 static's scale byte without a division (core::nvfp4_static_sf_of) against the
// reference's formula (the IEEE quotient, its NaN to the lower end, clamped, to e4m3): every
// non-negative bf16 and f16 pattern (Inf and NaN included) and random fp32 dividends around
// both clamp ends, under global scales across and beyond the fast range (its two ends exact,
// 0, negative, subnormal, NaN, Inf, FLT_MAX), so that both forms run.
TEST(CoreNvfp4Static, ScaleByteWithoutDivisionEqualsTheReference) {
  namespace rd = megamoe_ref::detail;
  std::mt19937 rng(20261205);
  std::vector<float> scales = {1.0f,     rd::div_f32(1.0f, 2688.0f), rd::div_f32(0x1p-60f, 6.0f), rd::div_f32(0x1p120f, 6.0f),
                               0x1p-63f, 0x1p118f, 0.0f, -1.0f, u2f(1u), FLT_MAX, std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(), u2f(0x3FFFFFFFu), 1e-4f, 3.0e-3f};
  std::uniform_int_distribution<uint32_t> mant(0, 0x7FFFFFu), ex(127 - 70, 127 + 125);
  while (scales.size() < 80) scales.push_back(u2f((ex(rng) << 23) | mant(rng)));
  auto want_sf = [](float a, float gs) {
    const float q = rd::div_f32(a, rd::mul_f32(6.0f, gs));
    const float clamped = std::isnan(q) ? 0x1p-9f : std::min(448.0f, std::max(0x1p-9f, q));
    return static_cast<uint32_t>(megamoe_ref::fp8_e4m3(clamped));
  };
  int64_t bad = 0, fast = 0;
  auto check = [&](float a, const core::StaticScale& s) {
    const uint32_t got = core::nvfp4_static_sf_of(a, s), want = want_sf(a, s.gs);
    if (got != want && ++bad <= 5) ADD_FAILURE() << "amax " << a << " gs " << s.gs << ": " << got << " != " << want;
  };
  std::uniform_int_distribution<uint32_t> qex(127 - 12, 127 + 11);
  for (float gs : scales) {
    const core::StaticScale s = core::nvfp4_static_scale(gs);
    fast += s.fast ? 1 : 0;
    EXPECT_EQ(s.fast, std::isfinite(gs) && rd::mul_f32(6.0f, gs) >= 0x1p-60f && rd::mul_f32(6.0f, gs) <= 0x1p120f) << gs;
    for (uint32_t h = 0; h < 0x8000u; ++h) {
      check(megamoe_ref::bf16_to_float(static_cast<uint16_t>(h)), s);
      check(megamoe_ref::half_to_float(static_cast<uint16_t>(h)), s);
    }
    for (int i = 0; i < 20000; ++i) {
      // quotients 2^-12 .. 2^12 (both clamp ends), and their neighbours
      const float a = rd::mul_f32(u2f((qex(rng) << 23) | mant(rng)), rd::mul_f32(6.0f, gs));
      if (!std::isfinite(a) || a < 0.0f) continue;
      for (int d = -1; d <= 1; ++d) check(u2f(f2u(a) + static_cast<uint32_t>(d)), s);
    }
    // Dividends whose quotients sit on or next to every e4m3 rounding midpoint (and the
    // clamp ends): where a quotient one ulp off would change the byte.
    for (uint32_t c = 0; c < 0x7Fu; ++c) {
      const float lo = rd::fp8_decode(static_cast<uint8_t>(c)), hi = c < 0x7Eu ? rd::fp8_decode(static_cast<uint8_t>(c + 1)) : 464.0f;
      for (float m : {rd::mul_f32(0.5f, lo + hi), lo}) {
        const float a = rd::mul_f32(m, s.d6);
        if (!std::isfinite(a) || !(a > 0.0f)) continue;
        for (int d = -2; d <= 2; ++d) check(u2f(f2u(a) + static_cast<uint32_t>(d)), s);
      }
    }
    for (float a : {0.0f, FLT_MAX, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                    u2f(1u), 0x1p-78f, 0x1p-79f}) {
      check(a, s);
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GE(fast, 60);                                   // the random scales, most in range
  EXPECT_LE(fast, static_cast<int64_t>(scales.size()) - 8);  // 0, -1, subnormal, FLT_MAX, Inf, NaN, 2^-63, 2^118
}

// core::nvfp4_token_group (the division-free form on rows with d6 in the fast range, the
// divisions elsewhere) against the reference's formula: the scale byte and the multiplier,
// for rows at both floors, tiny and huge row maxima, and rows whose pts is infinite (an
// Inf in the row) or subnormal (a floor far below the library's).
TEST(CoreNvfp4Token, GroupParamsEqualTheReferenceFormula) {
  namespace rd = megamoe_ref::detail;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> mant(0, 0x7FFFFFu), ex(1, 254);
  int64_t bad = 0, fast = 0, rows = 0, huge = 0;
  auto row = [&](float row_amax, float floor) {
    const float pts = core::per_token_scale(row_amax, floor);
    const core::TokenRow r = core::nvfp4_token_row(pts);
    fast += r.fast ? 1 : 0;
    huge += std::isfinite(pts) && rd::mul_f32(6.0f, pts) > 0x1p116f ? 1 : 0;
    ++rows;
    std::vector<float> amaxes = {0.0f, row_amax, u2f(1u), 1e-30f, floor, rd::mul_f32(row_amax, 0x1p-10f)};
    for (int i = 0; i < 400; ++i) amaxes.push_back(rd::mul_f32(row_amax, unit(rng)));
    for (int i = 0; i < 100; ++i) amaxes.push_back(rd::mul_f32(row_amax, u2f(((127u - 1u - (mant(rng) % 14u)) << 23) | mant(rng))));
    for (float a : amaxes) {
      if (!(a <= row_amax) && std::isfinite(row_amax)) continue;
      const core::GroupParams g = core::nvfp4_token_group(a, r);
      // a fast row's groups take the f16 multiply form untested (the row kernel)
      if (r.fast && !core::f16_mul_applies(g.m) && ++bad <= 5) ADD_FAILURE() << "fast row, multiplier " << g.m;
      const uint8_t sf = megamoe_ref::fp8_e4m3(rd::div_f32(a, rd::mul_f32(6.0f, pts)));
      const float sfv = rd::fp8_decode(sf);
      const float m = sfv > 0.0f ? rd::div_f32(1.0f, rd::mul_f32(sfv, pts)) : 0.0f;
      if ((g.sf != sf || f2u(g.m) != f2u(m)) && ++bad <= 5) {
        ADD_FAILURE() << "row_amax " << row_amax << " floor " << floor << " amax " << a << ": sf " << g.sf << " vs "
                      << int{sf} << ", m " << g.m << " vs " << m;
      }
    }
  };
  for (float floor : {1e-4f, 1e-10f}) {
    for (float ra : {0.0f, 1e-12f, 1e-5f, 1.0f, 3.0f, 448.0f, 65504.0f, 3.3895314e38f}) row(ra, floor);
    for (int i = 0; i < 300; ++i) row(u2f((ex(rng) << 23) | mant(rng)), floor);
  }
  row(std::numeric_limits<float>::infinity(), 1e-4f);  // pts = inf: divisions
  row(1e-30f, 1e-38f);                                 // d6 below 2^-60: divisions
  EXPECT_EQ(bad, 0);
  // Every finite row at the library's floors takes the division-free form but those whose
  // max is above 448 * 2^116 (about 3.7e37: some of the random ones and the bf16 maximum);
  // the two rows above (Inf, and a floor far below the library's) the divisions.
  EXPECT_GE(huge, 3);
  EXPECT_EQ(fast, rows - 2 - huge);
}

}  // namespace
