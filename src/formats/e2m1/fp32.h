// e2m1_fp32.h: MXFP4 codes of a 16-element bf16 chunk through fp32 arithmetic and the
// e5m2 conversion instruction, for the CUDA kernels on sm_89+.
//
// Why: the integer forms (core::encode's compares, formats/e2m1/pairs.h's paired compares)
// issue ~12 integer instructions a value, and the SM's integer pipe executes a warp's
// instruction every other cycle: at prefill sizes the MXFP4 kernel was bound by that
// pipe, not by memory. This form spends three fp32 instructions a value (the fp32 pipes
// take one a cycle) and a quarter of the integer ones.
//
// How: for v = |x| * 2^(127-e) (exact: x is a bf16, so v has at most 8 significant bits),
//   t1 = sat(v/8 + 1/4),  t2 = sat(v/2 - 2),  z = 8 t1 - t2
// is v + 2 for v <= 4, 6 + (v - 4) / 2 for 4 <= v <= 6, 7 above (and for Inf), 0 for NaN
// (sat maps NaN to +0). The e5m2 values in [2, 8) are 2, 2.5, 3, 3.5, 4, 5, 6, 7: the
// e2m1 grid 0 .. 4 shifted by 2, then 6 at v = 4 and 7 at v = 6, with the midpoint 6.5 at
// v = 5, so every e2m1 midpoint of v is an e5m2 midpoint of z and the e5m2 byte of z is
// 0x40 | code. Nearest even: e5m2's rounding of z is e2m1's of v, the parity of the
// mantissa being the parity of the code. Ties toward zero: t1 is computed rounding down
// from v/8 + 1/4 - 2^-26, which lowers z by 2^-22 or 2^-21, far less than any non-tie v's
// distance from a midpoint (at least 2^-9), so exactly the ties go down. Every other step
// is exact (the products are by powers of two, the sums fit 24 bits) where it matters;
// below v = 2^-15 the roundings keep z within 2^-21 of 2, still code 0.
// The nibbles: the sign bytes of the inputs (prmt's sign replication) masked to bit 3 (for
// ties toward zero only where the code is nonzero: code + 7 carries into bit 3), OR'd
// into the codes, and two nibbles of neighbouring bytes joined by one multiply.
//
// Preconditions (the caller checks them per chunk and otherwise takes core::encode): e in
// [kFp32MinE, kFp32MaxE] (2^(124-e) a normal fp32); for nearest even no NaN among the
// values (NaN -> 0x7 there; ties toward zero gives NaN 0x0 as its rule says). The host
// forms evaluate the same steps exactly in double: tests/cpp/test_reference.cpp checks
// every bf16 pattern at every position of a chunk, every exponent, both tie rules, against
// the reference; tests/cuda/test_cuda_numerics.cu the device instructions.
#pragma once

#include <cstdint>

#include "formats/e2m1/pairs.h"
#include "core/numerics.h"

namespace megamoe {
namespace core {

constexpr uint32_t kFp32MinE = 1;    ///< the UE8M0 clamp's lower end
constexpr uint32_t kFp32MaxE = 250;  ///< 2^(124-e) stays a normal fp32

/// Per-group multipliers: 2^(124-e) = 2^(127-e) / 8 and 2^(126-e) = 2^(127-e) / 2.
struct E2m1Fp32Keys {
  float s8, s2;
};

MEGAMOE_HD E2m1Fp32Keys e2m1_fp32_keys(uint32_t e) { return {bits_float((251u - e) << 23), bits_float((253u - e) << 23)}; }

/// sat(a * p + c) rounded down (kDown) or to nearest, for a = |x| of a widened bf16 (NaN
/// and Inf included), p a power of two in [2^-126, 2^125] and c in {1/4 - 2^-26, 1/4, -2}.
template <bool kDown>
MEGAMOE_HD float fma_sat(float a, float p, float c) {
#if defined(__CUDA_ARCH__)
  float r;
  if constexpr (kDown) asm("fma.rm.sat.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(p), "f"(c));
  else asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(p), "f"(c));
  return r;
#else
  if (a != a) return 0.0f;
  const double prod = static_cast<double>(a) * static_cast<double>(p);  // exact (8 bits times 2^k)
  if (prod >= 4.0) return 1.0f;  // prod + c >= 2, Inf included
  // Below 2^-40 the sum is c plus less than half an ulp of c: c either way (c + tiny rounds
  // down to c, and to nearest to c).
  const double s = prod < 0x1p-40 ? static_cast<double>(c) : prod + static_cast<double>(c);  // exact: 49 bits
  float f = static_cast<float>(s);
  if (kDown && static_cast<double>(f) > s) f = bits_float(float_bits(f) - 1u);  // f > s > 0 here
  return f <= 0.0f ? 0.0f : (f > 1.0f ? 1.0f : f);
#endif
}

/// |x| (on the device an operand modifier of the fma that reads it).
MEGAMOE_HD float fp32_abs(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);
#else
  return abs_bits(x);
#endif
}

/// z of the file comment for one value x (a widened bf16).
template <bool kEven>
MEGAMOE_HD float e2m1_fp32_z(float x, const E2m1Fp32Keys& k) {
  const float a = fp32_abs(x);
  const float t1 = fma_sat<!kEven>(a, k.s8, kEven ? 0.25f : 0.25f - 0x1p-26f);
  const float t2 = fma_sat<false>(a, k.s2, -2.0f);
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(t1, 8.0f, -t2);
#else
  return static_cast<float>(8.0 * static_cast<double>(t1) - static_cast<double>(t2));  // exact
#endif
}

/// e5m2 byte of z, nearest even, for z = +0 or z in [1, 8) (the values e2m1_fp32_z takes).
MEGAMOE_HD uint32_t e5m2_of_z_sw(float z) {
  const uint32_t b = float_bits(z);
  if (b == 0u) return 0u;
  // two mantissa bits, nearest even; the exponent rebiased from 127 to 15
  return ((b + 0xFFFFFu + ((b >> 21) & 1u)) >> 21) - ((127u - 15u) << 2);
}

/// The e5m2 bytes of z_hi (bits 8..15) and z_lo (bits 0..7).
MEGAMOE_HD uint32_t e5m2x2_of_z(float z_hi, float z_lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(z_hi), "f"(z_lo));
  return r;
#else
  return e5m2_of_z_sw(z_lo) | (e5m2_of_z_sw(z_hi) << 8);
#endif
}

/// PTX prmt.b32 (default mode): result byte i is byte (s_i & 7) of b:a, or that byte's
/// sign bit replicated when s_i & 8, s_i the i-th selector nibble.
MEGAMOE_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#else
  const uint64_t ab = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(ab >> (8 * (s & 7u))) & 0xFFu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * i);
  }
  return r;
#endif
}

/// The chunk's two words of x_q (element 2j in the low nibble of byte j) from its e5m2
/// bytes 0x40 | code (0 for a NaN under nearest even): c[q] holds, low byte to high, those
/// of elements 4q+1, 4q, 4q+3, 4q+2; the sign of element 2i + h is bit 15 + 16h of w[i].
template <bool kEven>
MEGAMOE_HD void e2m1_pack_e5m2_codes(const uint32_t (&c)[4], const uint32_t (&w)[8], uint32_t (&out)[2]) {
  uint32_t p[4];
  MEGAMOE_UNROLL
  for (int q = 0; q < 4; ++q) {
    // The same elements' signs: 0xFF or 0x00 bytes (bytes 3, 1 of w[2q], 3, 1 of w[2q+1]).
    const uint32_t s = prmt(w[2 * q], w[2 * q + 1], 0xDF9Bu);
    const uint32_t s8 = kEven ? s & 0x08080808u : s & (c[q] + 0x07070707u) & 0x08080808u;
    const uint32_t n = (c[q] & 0x07070707u) | s8;  // one nibble a byte
    p[q] = n * 4097u;                              // bytes 1, 3: elements (4q, 4q+1), (4q+2, 4q+3)
  }
  out[0] = prmt(p[0], p[1], 0x7531u);
  out[1] = prmt(p[2], p[3], 0x7531u);
}

/// The nibbles of the chunk whose element 2i + h has magnitude source v[2i + h] (a bf16
/// value widened, any sign: z reads |v|) and sign bit 15 + 16h of w[i], as its two words of
/// x_q (element 2j in the low nibble of byte j), for a group with keys k.
template <bool kEven>
MEGAMOE_HD void e2m1_fp32_nibbles(const float (&v)[16], const uint32_t (&w)[8], const E2m1Fp32Keys& k,
                                  uint32_t (&out)[2]) {
  uint32_t c[4];
  MEGAMOE_UNROLL
  for (int q = 0; q < 4; ++q) {
    const uint32_t c01 = e5m2x2_of_z(e2m1_fp32_z<kEven>(v[4 * q], k), e2m1_fp32_z<kEven>(v[4 * q + 1], k));
    const uint32_t c23 = e5m2x2_of_z(e2m1_fp32_z<kEven>(v[4 * q + 2], k), e2m1_fp32_z<kEven>(v[4 * q + 3], k));
    c[q] = c01 | (c23 << 16);
  }
  e2m1_pack_e5m2_codes<kEven>(c, w, out);
}

/// The MXFP4 nibbles of the 16 bf16 values in w (element 2i in the low half of w[i]) as
/// the chunk's two words of x_q (element 2j in the low nibble of byte j), for a group with
/// UE8M0 byte e (keys e2m1_fp32_keys(e)); see the preconditions above.
template <bool kEven>
MEGAMOE_HD void e2m1_fp32_chunk(const uint32_t (&w)[8], const E2m1Fp32Keys& k, uint32_t (&out)[2]) {
  float v[16];
  MEGAMOE_UNROLL
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = bits_float(w[i] << 16);
    v[2 * i + 1] = bits_float(w[i] & 0xFFFF0000u);
  }
  e2m1_fp32_nibbles<kEven>(v, w, k, out);
}

/// fl(x * m) with its magnitude rounded up to the bf16 grid (see e2m1_fp32_mul_chunk).
MEGAMOE_HD float mul_up_to_bf16(float x, float m) {
  return bits_float((float_bits(mul_rn(x, m)) + 0xFFFFu) & 0xFFFF0000u);
}

/// The ties-toward-zero e2m1 nibbles of v = fl(x * m) for the 16 bf16 values x in w (layout
/// as e2m1_fp32_chunk), for any multiplier m >= +0 (NVFP4 per-token's 1 / (sf * pts), whose
/// products have up to 32 significant bits, so the form above does not apply to them).
/// Why it holds: ties toward zero counts the midpoints M strictly below |v|, and every M
/// (at most three significant bits) is a bf16; so |v| rounded up to the bf16 grid, v', has
/// the same count (|v| > M <=> v' > M for M on the grid), and v' is a bf16, which the form
/// above encodes exactly with e = 127 (multiplier 1). Rounding the magnitude up is one add
/// of 0xFFFF to v's bits and a mask of the low half (mul_up_to_bf16; the sign bit is not
/// touched; a NaN that wraps becomes -0 or +0, code 0 like NaN itself). The sign of v is
/// x's (m >= 0), and it only shows with a nonzero code.
MEGAMOE_HD void e2m1_fp32_mul_chunk(const uint32_t (&w)[8], float m, uint32_t (&out)[2]) {
  float v[16];
  MEGAMOE_UNROLL
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = mul_up_to_bf16(bits_float(w[i] << 16), m);
    v[2 * i + 1] = mul_up_to_bf16(bits_float(w[i] & 0xFFFF0000u), m);
  }
  e2m1_fp32_nibbles<false>(v, w, e2m1_fp32_keys(127u), out);
}

/// 1 / d rounded toward zero, for d a positive normal fp32 whose reciprocal is normal.
MEGAMOE_HD float recip_rz(float d) {
#if defined(__CUDA_ARCH__)
  return __frcp_rz(d);
#else
  // The double quotient cannot round onto a float f unless 1 / d = f: d f != 1 puts 1 / d at
  // least 2^-48 (relative) away from f, beyond the double's rounding error.
  const double q = 1.0 / static_cast<double>(d);
  float f = static_cast<float>(q);
  if (static_cast<double>(f) > q) f = bits_float(float_bits(f) - 1u);
  return f;
#endif
}

/// NVFP4 static through the multiply form: a multiplier r with which e2m1_fp32_mul_chunk(w, r)
/// gives every bf16 x the code of fl(x / d) (the divisor d = fl(sf * gs) of the group's scale
/// byte), or 0 when this d has none (then the caller takes another form). The kernels
/// compute it once per scale byte (a table of 126 entries a block) instead of a group's
/// seven thresholds (formats/e2m1/f16.h) for every group.
/// Why it holds: the form's code is #{M : fl(|x| r) > M} (see e2m1_fp32_mul_chunk), the
/// code of fl(x / d) is #{M : |x| > T_M} with T_M = rd(H d) (formats/e2m1/pairs.h); both are
/// counts of steps monotone in |x|. Let b_lo <= T_M < b_hi be the two bf16 next to T_M; if
/// fl(b_lo r) <= M < fl(b_hi r), then for every bf16 x the two steps at M agree (|x| <=
/// b_lo on both sides of the inequality, or |x| >= b_hi), so the codes agree for every x,
/// NaN (code 0) and Inf (7) included. r = rd(1 / d) makes fl(x r) <= fl(x / d), so only
/// values whose quotient lies within about 2^-23 (relative) above an H can disagree; the
/// check finds those (an 8-bit x rarely lands there: the tests count how often it does).
MEGAMOE_HD float nvfp4_static_multiplier(float d) {
  if (!(d >= kPairsMinDivisor && d <= kPairsMaxDivisor)) return 0.0f;
  const float r = recip_rz(d);
  bool ok = true;
  MEGAMOE_UNROLL
  for (int i = 0; i < 7; ++i) {
    const float m = e2m1_mid(i);
    const uint32_t lo = float_bits(mul_add_rd_exact(m, d, mul_rn(e2m1_mid_half_ulp(i), d))) & 0xFFFF0000u;
    ok = ok && !(mul_rn(bits_float(lo), r) > m) && mul_rn(bits_float(lo + 0x10000u), r) > m;
  }
  return ok ? r : 0.0f;
}

}  // namespace core
}  // namespace megamoe
