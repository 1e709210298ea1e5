// e2m1_f16.h: NVFP4-static codes of a 16-element bf16 chunk by saturating f16x2 adds, two
// values and one threshold an instruction, for the CUDA kernels.
//
// Why: NVFP4 static's code of v = fl(x / d) counts the midpoints M that v exceeds, which
// is x beyond the per-group threshold rd(H * d) (formats/e2m1/pairs.h: H = M + ulp(M) / 2).
// Seven thresholds that no affine map sends onto a conversion's rounding points, so the
// code is a count; the integer form counts with ~12 integer instructions a value on the
// SM's integer pipe, which bound the kernel at prefill sizes. Here the count runs on the
// half-precision pipe, two values an instruction.
//
// How: scale by P = 2^(12 - E), E the exponent of d, so that d P is in [2^12, 2^13) and the
// thresholds T_i = rd(H_i d P) (= rd(H_i d) P, exact) are in [1024, 40961). The values
// A = |x| P are exact in f16 (x is a bf16: 8 significant bits; above 65504 they become
// 65504 or Inf, beyond every threshold; tiny ones round, far below 1024), and so are the
// thresholds rounded down to f16, C_i = rd_f16(T_i): x > T_i <=> A > C_i, since A is on
// the f16 grid. Both are multiples of f16's ulp at 1024, which is 1, so A > C_i means
// A - C_i >= 1: sat(A - C_i) (f16 add with .sat; NaN -> 0) is the 0/1 flag, and the code
// is 1024 + sum of the seven flags, exact in f16, read off the low bits. NaN counts
// nothing (code 0, NVFP4's rule), Inf everything. The sign follows the ties-toward-zero
// rule: kept only with a nonzero code (code + 7 carries into bit 3).
//
// Precondition (the caller checks it per chunk and otherwise takes core::encode): d in
// [kPairsMinDivisor, kPairsMaxDivisor]. The host forms evaluate the same steps exactly:
// tests/cpp/test_reference.cpp checks them on every bf16 for many divisors against the
// reference; tests/cuda/test_cuda_numerics.cu the device instructions against core::encode.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/e2m1/pairs.h"
#include "core/numerics.h"

namespace megamoe {
namespace core {

/// Per-group constants: the scale P and the seven thresholds -C_i as f16 pairs (both
/// halves the same; negated, so that the flag is one add).
struct E2m1F16Keys {
  float p;
  uint32_t neg_c[7];
};

// Host form of the f16 conversions below, exact: the f16 bits of a double rounded to
// nearest even (overflow to Inf, subnormals kept) or toward zero.
inline uint32_t f16_bits_of(double x, bool toward_zero) {
  if (x != x) return 0x7E00u;
  const uint32_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(x);
  if (a == 0.0) return sign;
  const double lim = toward_zero ? 65536.0 : 65520.0;  // beyond: Inf (65504 is the largest finite)
  if (a >= lim) return sign | (toward_zero ? 0x7BFFu : 0x7C00u);
  int e = 0;
  (void)std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  e = e - 1 < -14 ? -14 : e - 1;  // the binade's exponent, subnormals sharing -14's ulp
  const double y = std::ldexp(a, 10 - e);  // units of the ulp 2^(e-10)
  double q = toward_zero ? std::floor(y) : std::nearbyint(y);  // the default mode: nearest even
  // (q may reach 2048: the next binade's first value, whose bits follow by the carry)
  return sign | static_cast<uint32_t>((e + 14) * 1024 + static_cast<int64_t>(q));
}

/// f16x2 of (hi, lo) rounded toward zero (lo in bits 0..15), for finite hi, lo.
MEGAMOE_HD uint32_t f16x2_rz(float hi, float lo) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rz.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return f16_bits_of(lo, true) | (f16_bits_of(hi, true) << 16);
#endif
}

/// f16x2 of (|hi| P, |lo| P), the products in fp32, rounded to nearest even (lo in bits 0..15).
MEGAMOE_HD uint32_t f16x2_scaled_abs(float hi, float lo, float p) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(__fmul_rn(fabsf(hi), p)), "f"(__fmul_rn(fabsf(lo), p)));
  return r;
#else
  return f16_bits_of(mul_rn(abs_bits(lo), p), false) | (f16_bits_of(mul_rn(abs_bits(hi), p), false) << 16);
#endif
}

/// Host form of f16x2_fma and f16x2_add: per lane a * b + c rounded to nearest even,
/// saturated to [0, 1] when kSat (NaN -> +0), for b a power of two. Exact: a * b is an f16
/// times a power of two, and two such values (exponents -24 .. 19) sum within 53 bits.
template <bool kSat>
inline uint32_t f16x2_fma_host(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const auto value = [h](uint32_t x) {
      return static_cast<double>(half_to_float(static_cast<uint16_t>(x >> (16 * h))));
    };
    const double s = value(a) * value(b) + value(c);
    uint32_t v = f16_bits_of(s, false);
    if (kSat) {
      const double f = static_cast<double>(half_to_float(static_cast<uint16_t>(v)));
      v = s != s || f <= 0.0 ? 0u : (f >= 1.0 ? 0x3C00u : v);
    }
    r |= v << (16 * h);
  }
  return r;
}

/// Per lane of f16 pairs: a + b rounded to nearest even, saturated to [0, 1] when kSat
/// (PTX add{.sat}.f16x2; .sat maps NaN to +0).
template <bool kSat>
MEGAMOE_HD uint32_t f16x2_add(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if constexpr (kSat) asm("add.rn.sat.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return f16x2_fma_host<kSat>(a, 0x3C003C00u, b);  // a * 1 + b
#endif
}

/// Per lane of f16 pairs: a * b + c rounded to nearest even, saturated to [0, 1] when kSat
/// (fma.rn{.sat}.f16x2; .sat maps NaN to +0), for b a power of two in both lanes.
template <bool kSat>
MEGAMOE_HD uint32_t f16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if constexpr (kSat) asm("fma.rn.sat.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  else asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
#else
  return f16x2_fma_host<kSat>(a, b, c);
#endif
}

/// Per lane of an f16 pair: -a (neg.f16x2, which the device folds into the instruction
/// that reads it).
MEGAMOE_HD uint32_t f16x2_neg(uint32_t a) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("neg.f16x2 %0, %1;" : "=r"(r) : "r"(a));
  return r;
#else
  return a ^ 0x80008000u;
#endif
}

/// The keys of an NVFP4 static group with divisor d in [kPairsMinDivisor, kPairsMaxDivisor].
MEGAMOE_HD E2m1F16Keys e2m1_f16_keys(float d) {
  E2m1F16Keys k;
  k.p = bits_float((266u - (float_bits(d) >> 23)) << 23);  // 2^(12 - E)
  const float dp = mul_rn(d, k.p);
  MEGAMOE_UNROLL
  for (int i = 0; i < 7; ++i) {
    const float t = -mul_add_rd_exact(e2m1_mid(i), dp, mul_rn(e2m1_mid_half_ulp(i), dp));
    k.neg_c[i] = f16x2_rz(t, t);
  }
  return k;
}

/// The NVFP4 static nibbles of the 16 bf16 values in w (element 2i in the low half of w[i])
/// as the chunk's two words of x_q (element 2j in the low nibble of byte j).
MEGAMOE_HD void e2m1_f16_chunk(const uint32_t (&w)[8], const E2m1F16Keys& k, uint32_t (&out)[2]) {
  uint32_t p[8];
  MEGAMOE_UNROLL
  for (int i = 0; i < 8; ++i) {
    const uint32_t a = f16x2_scaled_abs(bits_float(w[i] & 0xFFFF0000u), bits_float(w[i] << 16), k.p);
    uint32_t acc = 0x64006400u;  // 1024 in both halves
    MEGAMOE_UNROLL
    for (int j = 0; j < 7; ++j) acc = f16x2_add<false>(acc, f16x2_add<true>(a, k.neg_c[j]));
    // code in bits 0..2 of each half; the sign (bit 15 of each bf16) to bit 3 when code != 0
    p[i] = (acc & 0x00070007u) | ((w[i] >> 12) & (acc + 0x00070007u) & 0x00080008u);
  }
  e2m1_pack_eight_pairs(p, out);
}

}  // namespace core
}  // namespace megamoe
