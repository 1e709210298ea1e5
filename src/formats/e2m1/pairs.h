// e2m1_pairs.h: MXFP4 codes of bf16 values two at a time, in the 16-bit halves of one
// 32-bit word, by integer compares of the inputs' bits against per-group thresholds (the
// kernels' form before sm_89, which has no e5m2 conversion; formats/e2m1/fp32.h from sm_89);
// and the thresholds of NVFP4 static's e2m1 of fl(x / d), which formats/e2m1/f16.h compares.
//
// Why: the per-element e2m1 rule (core::encode: a multiply, then compares and selects on
// each fp32 value) costs most of the FP4 kernels' instructions. For MXFP4 the multiplier is
// 2^(127-e), so v = x * 2^(127-e) is exact whenever it matters (an fp32-subnormal v is
// below 0.25 and codes 0 either way), and |v| > M for an e2m1 midpoint M is the same as
// |x| > M * 2^(e-127): a compare of |x|'s bf16 bits with the bits of that threshold, which
// is a bf16 itself (the midpoints have at most three significant bits) when its exponent
// stays in range, i.e. for e in [kPairsMinE, kPairsMaxE]. Two 15-bit magnitudes sit in one
// word; adding 0x7FFF - B to a half sets its bit 15 exactly when the magnitude exceeds B,
// and never carries into the other half (0x7FFF + 0x7FFF < 2^16). The code is the number of
// the seven sorted thresholds the magnitude exceeds: its three bits come from a binary
// search done with bitwise selects on those bit-15 flags (LOP3), no branches, no fp math.
//
// Preconditions (the caller checks them per chunk and otherwise takes core::encode): no NaN
// among the values (pairs_have_nan), and e in [kPairsMinE, kPairsMaxE]. Then equal to
// core::encode of each widened bf16: tests/cpp/test_reference.cpp checks every bf16 bit
// pattern in both halves, for every MXFP4 exponent, against the reference;
// tests/cuda/test_cuda_numerics.cu does the same on the device.
#pragma once

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace core {

constexpr uint32_t kPairsMinE = 3;    ///< the .25 threshold's exponent field e - 2 >= 1
constexpr uint32_t kPairsMaxE = 252;  ///< the 5.0 threshold's exponent field e + 2 <= 254

/// Per-group constants: K_i = 0x7FFF - B_i in both halves, B_i the bf16 bits of midpoint
/// i times 2^(e-127) (minus one where a tie rounds up: the compare becomes >=).
struct E2m1PairKeys {
  uint32_t k1, k2, k3, k4, k5, k6, k7;
};

/// One key: bf16 bits @p mid of a midpoint (exponent field 127 + E), @p up = 1 where the
/// compare is >= (a tie rounding up).
MEGAMOE_HD uint32_t e2m1_pair_key(uint32_t mid, uint32_t e, uint32_t up) {
  return (0x7FFFu - (mid + (e << 7) - (127u << 7) - up)) * 0x00010001u;
}

/// The keys of a group with UE8M0 byte e (in [kPairsMinE, kPairsMaxE]); kEven: nearest
/// even, whose ties at 0.75, 1.75 and 3.5 go up to the even code.
template <bool kEven>
MEGAMOE_HD E2m1PairKeys e2m1_pair_keys(uint32_t e) {
  const uint32_t up = kEven ? 1u : 0u;
  // bf16 bits of the midpoints .25 .75 1.25 1.75 2.5 3.5 5
  return {e2m1_pair_key(0x3E80u, e, 0u), e2m1_pair_key(0x3F40u, e, up), e2m1_pair_key(0x3FA0u, e, 0u),
          e2m1_pair_key(0x3FE0u, e, up), e2m1_pair_key(0x4020u, e, 0u), e2m1_pair_key(0x4060u, e, up),
          e2m1_pair_key(0x40A0u, e, 0u)};
}

// NVFP4 static: v = fl(x / d) for the group's divisor d = fl(sf * gs) > 0. fl(x / d) > M
// for a midpoint M (whose last mantissa bit is 0, so the tie between M and the next fp32
// rounds to M) holds exactly when x / d > H = M + ulp(M) / 2, i.e. x > H * d, i.e.
// x > rd(H * d), the fp32 rounded down; for bf16 x, when x's bits exceed that fp32's top
// 16 bits (truncation rounds a positive value down). H * d = M * d + (ulp(M) / 2) * d,
// the second term a power-of-two multiple of d (exact for d >= 2^-100), so rd(H * d) is
// one fused multiply-add rounded down. No division per value.
constexpr float kPairsMinDivisor = 0x1p-100f;  ///< (ulp(M) / 2) * d stays a normal fp32
constexpr float kPairsMaxDivisor = 0x1p100f;   ///< 5 d stays finite

/// The e2m1 midpoint M_i (i in 0..6) and half its fp32 ulp: H_i = M_i + ulp(M_i) / 2.
/// (Functions, not constexpr arrays: device code may not index a namespace-scope array.)
MEGAMOE_HD float e2m1_mid(int i) {
  const float m[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  return m[i];
}
MEGAMOE_HD float e2m1_mid_half_ulp(int i) {
  const float h[7] = {0x1p-26f, 0x1p-25f, 0x1p-24f, 0x1p-24f, 0x1p-23f, 0x1p-23f, 0x1p-22f};
  return h[i];
}

/// rd(a * b + c) for a product a * b exact in 53 bits and a sum exact in 53 bits (the
/// thresholds above: 3 + 24 and 25 + 24 significant bits), all positive.
MEGAMOE_HD float mul_add_rd_exact(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rd(a, b, c);
#else
  const double p = static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c);  // exact
  float f = static_cast<float>(p);
  if (static_cast<double>(f) > p) f = bits_float(float_bits(f) - 1u);  // one step toward 0
  return f;
#endif
}

/// Bit 15 of each half set where that half of w (two bf16) is NaN; OR these over a chunk.
MEGAMOE_HD uint32_t pairs_have_nan(uint32_t w) { return ((w & 0x7FFF7FFFu) + 0x007F007Fu) & 0x80008000u; }

/// The e2m1 nibbles of the two bf16 in w: element 0 (low half) in bits 0..3, element 1
/// (high half) in bits 16..19, sign << 3 | code; ttz keeps the sign only with a nonzero
/// code, nearest even always.
template <bool kEven>
MEGAMOE_HD uint32_t e2m1_pair_nibbles(uint32_t w, const E2m1PairKeys& k) {
  const uint32_t a = w & 0x7FFF7FFFu;
  // Bit 15 of t_i (per half): |x| beyond threshold i.
  const uint32_t t1 = a + k.k1, t2 = a + k.k2, t3 = a + k.k3, t4 = a + k.k4;
  const uint32_t t5 = a + k.k5, t6 = a + k.k6, t7 = a + k.k7;
  // code = 4 b2 + 2 b1 + b0: b2 = beyond 1.75; b1 = beyond 3.5 or .75 (as b2 says);
  // b0 = beyond the middle threshold of the quarter (b2, b1) names.
  const uint32_t b2 = t4;
  const uint32_t b1 = (b2 & t6) | (~b2 & t2);
  const uint32_t lo = (b1 & t3) | (~b1 & t1), hi = (b1 & t7) | (~b1 & t5);
  const uint32_t b0 = (b2 & hi) | (~b2 & lo);
  uint32_t sign;
  if constexpr (kEven) {
    sign = w;
  } else {
    sign = w & (b2 | b1 | b0);  // a nonzero code: beyond .25
  }
  return ((sign >> 12) & 0x00080008u) | ((b2 >> 13) & 0x00040004u) | ((b1 >> 14) & 0x00020002u) |
         ((b0 >> 15) & 0x00010001u);
}

/// Two pairs' nibble words (e2m1_pair_nibbles) as the 16 bits of four packed values:
/// element 2j in the low nibble of byte j (x_q's layout), p0 holding elements 0, 1.
MEGAMOE_HD uint32_t e2m1_pack_two_pairs(uint32_t p0, uint32_t p1) {
  return ((p0 | (p0 >> 12)) & 0xFFu) | (((p1 | (p1 >> 12)) & 0xFFu) << 8);
}

/// Eight pairs' nibble words (elements 0..15 of a chunk) as its two words of x_q.
MEGAMOE_HD void e2m1_pack_eight_pairs(const uint32_t (&p)[8], uint32_t (&w)[2]) {
  w[0] = e2m1_pack_two_pairs(p[0], p[1]) | (e2m1_pack_two_pairs(p[2], p[3]) << 16);
  w[1] = e2m1_pack_two_pairs(p[4], p[5]) | (e2m1_pack_two_pairs(p[6], p[7]) << 16);
}

}  // namespace core
}  // namespace megamoe
