// formats.h: the activation formats, declared once, and their per-group math, shared
// bit-for-bit by the CPU backend and the CUDA kernels (docs/CONTRACT.md "Activation
// formats"; docs/DESIGN.md "Adding a format").
//
// A format is an element codec (e4m3 or e2m1, with its tie rule) times a scale codec
// (UE8M0 or e4m3 bytes packed four per int32 word, or fp32) times a second-level scale.
// The launch table is the Format enum: every backend dispatches on it with one switch, and
// a format's whole recipe is the specialisations below. Per group of G elements of a token,
// with amax = NaN-ignoring max |x| (fmaxf semantics) and `floor` the scheme's amax floor:
//   kFp8Ue8m0     e = ue8m0(fl(max(amax,floor) * fl(1/448)));  v = x * 2^(127-e);  e4m3(v)
//   kFp8Fp32      s = fl(max(amax,floor) * fl(1/448));         v = x * fl(1/s);    e4m3(v)
//   kMxfp4[Rne]   e = ue8m0(fl(max(amax,floor) * fl(1/6)));    v = x * 2^(127-e);  e2m1(v)
//                 (the same e as ue8m0(fl(max(amax,floor) / 6)), see kInv6Bits)
//   kNvfp4Static  sf = e4m3(clamp(fl(amax / fl(6*gs)), 2^-9, 448)); v = fl(x / fl(sf*gs)); e2m1 ttz
//   kNvfp4PerToken pts = fl(max(row_amax,floor) / 2688) per token;
//                 sf = e4m3_satfinite(fl(amax / fl(6*pts))); inv = sf > 0 ? fl(1/fl(sf*pts)) : 0;
//                 v = fl(x * inv); e2m1 ttz
// e4m3 is RNE, finite values saturating to 448, NaN -> 0x7F, +-Inf -> +-448 (PTX
// cvt.rn.satfinite.e4m3x2.f32). e2m1 (grid 0, .5, 1, 1.5, 2, 3, 4, 6) ties toward zero:
// code = number of midpoints {.25,.75,1.25,1.75,2.5,3.5,5} that |v| strictly exceeds, sign
// only when the code is nonzero, NaN -> 0; or nearest even: saturating, sign always kept,
// NaN -> 0x7 (PTX cvt.rn.satfinite.e2m1x2.f32).
#pragma once

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace core {

/// The launch table: one row per accepted (element codec, scale codec, scale2) triple.
enum class Format : uint8_t {
  kFp8Ue8m0,       ///< e4m3 values, UE8M0 scales packed 4 per int32 (MXFP8 and G = 128)
  kFp8Fp32,        ///< e4m3 values, fp32 scales
  kMxfp4,          ///< e2m1 values (ties toward zero), UE8M0 scales, G = 32
  kMxfp4Rne,       ///< e2m1 values (nearest even), UE8M0 scales, G = 32
  kNvfp4Static,    ///< e2m1 values, e4m3 scales packed 4 per int32, G = 16, static gs
  kNvfp4PerToken,  ///< as kNvfp4Static with a per-token second-level scale
};
constexpr int kFormatCount = 6;

/// Element codecs.
enum class Elem : uint8_t { kE4M3, kE2M1 };
/// Scale codecs.
enum class Sf : uint8_t { kUE8M0x4, kE4M3x4, kFp32 };

struct ElemCodec {
  int bits;         ///< bits per value (8: one per byte; 4: two per byte, low nibble first)
  float max_value;  ///< largest finite magnitude
  const char* name;
};
struct ScaleCodec {
  bool packed4;  ///< one byte per group, four groups per int32 word (little-endian)
  const char* name;
};

MEGAMOE_HD constexpr Elem elem_of(Format f) {
  return f == Format::kFp8Ue8m0 || f == Format::kFp8Fp32 ? Elem::kE4M3 : Elem::kE2M1;
}
MEGAMOE_HD constexpr Sf sf_of(Format f) {
  return f == Format::kFp8Fp32                                      ? Sf::kFp32
         : f == Format::kNvfp4Static || f == Format::kNvfp4PerToken ? Sf::kE4M3x4
                                                                    : Sf::kUE8M0x4;
}
/// e2m1 ties toward zero (every e2m1 format but kMxfp4Rne).
MEGAMOE_HD constexpr bool ttz_of(Format f) { return elem_of(f) == Elem::kE2M1 && f != Format::kMxfp4Rne; }
/// The group size a format fixes (0: any G dividing 128, the fp8 formats).
MEGAMOE_HD constexpr int fixed_group_of(Format f) {
  return elem_of(f) == Elem::kE4M3 ? 0 : sf_of(f) == Sf::kE4M3x4 ? 16 : 32;
}
MEGAMOE_HD constexpr ElemCodec elem_codec(Elem e) {
  return e == Elem::kE4M3 ? ElemCodec{8, 448.0f, "e4m3"} : ElemCodec{4, 6.0f, "e2m1"};
}
MEGAMOE_HD constexpr ScaleCodec scale_codec(Sf s) {
  return s == Sf::kFp32 ? ScaleCodec{false, "fp32"}
         : s == Sf::kE4M3x4 ? ScaleCodec{true, "e4m3x4"} : ScaleCodec{true, "ue8m0x4"};
}
/// Values per byte of x_q.
MEGAMOE_HD constexpr int values_per_byte(Format f) { return elem_of(f) == Elem::kE4M3 ? 1 : 2; }
constexpr const char* format_name(Format f) {
  return f == Format::kFp8Ue8m0       ? "fp8_ue8m0"
         : f == Format::kFp8Fp32      ? "fp8_fp32"
         : f == Format::kMxfp4        ? "mxfp4"
         : f == Format::kMxfp4Rne     ? "mxfp4_rne"
         : f == Format::kNvfp4Static  ? "nvfp4_static"
                                      : "nvfp4_per_token";
}

/// The smallest amax floor a format accepts. Formats that store an fp32 scale derived from
/// the floor (fp8 with fp32 scales: s = floor / 448; NVFP4 per-token: pts = floor / 2688 and
/// each group's sf * pts, sf >= 2^-9) need floors from 2^-100 up: there every such scale is a
/// normal fp32 (>= 2^-126 after the divisions) with a finite reciprocal, so a zero group
/// encodes as zero codes with a nonzero scale. Below ~3e-43 the scale underflows to zero and
/// a zero group's codes become NaN (0 * (1 / 0)). The UE8M0 formats clamp their exponent
/// byte to >= 1 and accept any positive floor; NVFP4 static reads no floor.
constexpr float kMinFp32ScaleFloor = 0x1p-100f;
MEGAMOE_HD constexpr float min_amax_floor(Format f) {
  return f == Format::kFp8Fp32 || f == Format::kNvfp4PerToken ? kMinFp32ScaleFloor : 0.0f;
}

constexpr float kNvfp4TokenDiv = 2688.0f;  ///< 6 * 448: per-token scale = max(row_amax, floor) / 2688
constexpr float kE4M3MinSubnormal = 0.001953125f;  ///< 2^-9, NVFP4 static's lower clamp
/// Bits of fl(1/6). The UE8M0 exponent of fl(a * fl(1/6)) equals that of fl(a / 6) for
/// every non-negative fp32 a (SPEC.md "MXFP4"; tests/cpp/test_reference.cpp checks all
/// 2^31 of them): the MXFP4 scale is a multiply, one instruction instead of a division.
constexpr uint32_t kInv6Bits = 0x3E2AAAABu;

// ---------------------------------------------------------------------------------------
// Element codecs.

/// e4m3fn byte -> fp32 for a byte that is not NaN (c & 0x7F != 0x7F; the caller's range),
/// exact.
MEGAMOE_HD float e4m3_to_float_finite(uint32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // Branch-free on the device (it sits between a group's amax and its codes): e4m3 to f16
  // and f16 to fp32 are exact.
  uint32_t h2;
  float f;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(c & 0xFFu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h2 & 0xFFFFu)));
  return f;
#else
  const uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u;
  // normal: (1 + m/8) 2^(e-7) -> fp32 exponent e + 120; subnormal: m 2^-9, exact by mul
  if (e != 0) return bits_float(sign | ((e + 120u) << 23) | (m << 20));
  return bits_float(float_bits(mul_rn(static_cast<float>(m), kE4M3MinSubnormal)) | sign);
#endif
}

/// e4m3fn byte -> fp32 (exact; 0x7F / 0xFF -> NaN, with the same bits on host and device).
MEGAMOE_HD float e4m3_to_float(uint32_t c) {
  return (c & 0x7Fu) == 0x7Fu ? bits_float(0x7FC00000u | ((c & 0x80u) << 24)) : e4m3_to_float_finite(c);
}

/// The e2m1 magnitude code of |v| >= 1 (bits @p u, NaN excluded by the caller) from its
/// fp32 bits: from 1 up, two e2m1 values per binade (1.0 and 1.5 times 2^e), so the code
/// is the exponent and the top mantissa bit after rounding the mantissa to one bit:
/// adding 2^21 - 1 rounds half down (ties toward zero), adding 2^21 - 1 plus the kept bit
/// rounds half to even; 1.0 (bits 0x3F800000 >> 22 = 254) is code 2, 6.0 code 7, and
/// anything above (Inf included) saturates to 7. Half the instructions of the seven
/// compares, which dominate the FP4 kernels; equal to them on all 2^32 inputs (checked
/// exhaustively when this form was written; tests/cpp/test_cpu_simd.cpp pins it against
/// the SIMD backend's compare form on strided fp32 patterns and every midpoint).
template <bool kEven>
MEGAMOE_HD uint32_t e2m1_code_from_one(uint32_t u) {
  const uint32_t r = (u + 0x1FFFFFu + (kEven ? (u >> 22) & 1u : 0u)) >> 22;
  const uint32_t c = r - 252u;
  return c < 7u ? c : 7u;
}

/// e2m1 nibble of v, ties toward zero (see file comment).
MEGAMOE_HD uint32_t e2m1_ttz(float v) {
  const uint32_t u = float_bits(v) & 0x7FFFFFFFu;
  const float a = bits_float(u);
  // NaN compares false everywhere: the low branch, code 0. Below 1: midpoints .25 and .75.
  const uint32_t code = a >= 1.0f ? e2m1_code_from_one<false>(u) : (a > 0.25f) + (a > 0.75f);
  return code != 0u ? code | ((float_bits(v) >> 28) & 8u) : 0u;
}

/// e2m1 nibble of v, nearest even, saturating (see file comment).
MEGAMOE_HD uint32_t e2m1_rne(float v) {
  const uint32_t sign = (float_bits(v) >> 28) & 8u;
  if (v != v) return 0x7u;
  const uint32_t u = float_bits(v) & 0x7FFFFFFFu;
  const float a = bits_float(u);
  // Below 1: at the midpoint .75 the upper neighbour (1.0, code 2) has the even code.
  const uint32_t code = a >= 1.0f ? e2m1_code_from_one<true>(u) : (a > 0.25f) + (a >= 0.75f);
  return code | sign;
}

// ---------------------------------------------------------------------------------------
// Per-group parameters.

/// What a group stores as its scale and how its values are mapped before encoding.
struct GroupParams {
  uint32_t sf;  ///< stored scale: UE8M0 byte, e4m3 byte, or fp32 bits
  float m;      ///< multiplier, or divisor for kNvfp4Static
};

/// NVFP4 static's scale byte of a group with NaN-ignoring max |x| = amax, global scale gs:
/// e4m3(clamp(fl(amax / fl(6 gs)), 2^-9, 448)), a NaN quotient (0 / 0 when gs = 0) to the
/// lower end. Always in [1, 0x7E].
MEGAMOE_HD uint32_t nvfp4_static_sf(float amax, float gs) {
  const float q = div_rn(amax, mul_rn(6.0f, gs));
  return fp8_e4m3_from_float(fminf_nan_ignoring(fmax_nan_ignoring(q, kE4M3MinSubnormal), 448.0f));
}

/// NVFP4 static's divisor of scale byte sf under global scale gs: fl(sf * gs).
MEGAMOE_HD float nvfp4_static_divisor(uint32_t sf, float gs) { return mul_rn(e4m3_to_float(sf), gs); }

// ---------------------------------------------------------------------------------------
// NVFP4 per-token's group parameters, e4m3(fl(amax / fl(6 pts))) and fl(1 / fl(sf pts)),
// with the row's constants computed once a row. Both are IEEE divisions by definition; a
// GPU's division is ~10 instructions with a branch to its slow path, two a group, a tenth
// of the row kernel's work. Where the row's d6 = fl(6 pts) is finite and at least 2^-60
// (every finite row at the floors the library offers) the quotient is amax times RN(1 / d6),
// corrected twice by the exact residual (Markstein: a correctly rounded reciprocal and a
// faithful quotient give the correctly rounded one; the first correction makes the
// quotient faithful), and the multiplier a refined reciprocal (recip_nearest). Other rows
// (infinite or NaN pts, extreme floors) divide. Both forms give the divisions' bits:
// tests/cpp/test_reference.cpp checks them against the divisions on every f16 amax pattern
// and large random sets, and recip_refine (core/numerics.h) from two ulps either side on
// every significand.

/// fl(a / b) from rb = RN(1 / b), for b in [2^-60, 2^120] and finite a >= 2^-78 (or 0):
/// two corrections by the residual a - b q (exact once q is faithful, and a normal number
/// for such a). Smaller dividends and quotients below 2^-126 may be an ulp or two off; in
/// nvfp4_token_group they are quotients below 2^-11, which all map to scale byte 0
/// (a >= 2^-11 d6 >= 2^-71 otherwise).
MEGAMOE_HD float div_by_recip(float a, float b, float rb) {
  const float q0 = mul_rn(a, rb);
  const float q1 = fma_rn(fma_rn(-q0, b, a), rb, q0);
  return fma_rn(fma_rn(-q1, b, a), rb, q1);
}

/// NVFP4 static's constants of one global scale for nvfp4_static_sf_of: computed once a
/// thread of a looping kernel, each group's scale byte then costs a multiply and two
/// corrections instead of an IEEE division (~10 instructions and a branch to its slow path).
struct StaticScale {
  float gs = 0.0f;    ///< the global scale
  float d6 = 0.0f;    ///< fl(6 gs), the divisor of nvfp4_static_sf
  float rd6 = 0.0f;   ///< RN(1 / d6) when fast
  bool fast = false;  ///< d6 in [2^-60, 2^120] (div_by_recip's range); false for NaN, Inf, 0, negative
};

MEGAMOE_HD StaticScale nvfp4_static_scale(float gs) {
  StaticScale s;
  s.gs = gs;
  s.d6 = mul_rn(6.0f, gs);
  s.fast = s.d6 >= 0x1p-60f && s.d6 <= 0x1p120f;
  // A select, not a branch: a branch on gs, which a kernel loads, would hold back the
  // loads behind it until gs arrives.
  s.rd6 = recip_nearest(s.fast ? s.d6 : 1.0f);
  return s;
}

/// nvfp4_static_sf(amax, s.gs), division-free where s.fast. The quotient div_by_recip
/// returns is the division's wherever the clamp does not decide alone: a dividend below
/// 2^-78 has a quotient below 2^-18 either way (clamped to 2^-9), and q0 = RN(amax RN(1/d6))
/// >= 512 means amax / d6 > 448 (two roundings of 2^-24 each), Inf included, where the
/// corrections would produce NaN. A NaN amax stays NaN and goes to the lower end, as the
/// division's quotient does.
MEGAMOE_HD uint32_t nvfp4_static_sf_of(float amax, const StaticScale& s) {
  if (!s.fast) return nvfp4_static_sf(amax, s.gs);
  const float q = mul_rn(amax, s.rd6) >= 512.0f ? 448.0f : div_by_recip(amax, s.d6, s.rd6);
  return fp8_e4m3_from_float(fminf_nan_ignoring(fmax_nan_ignoring(q, kE4M3MinSubnormal), 448.0f));
}

/// A row's constants for its groups' parameters (nvfp4_token_group).
struct TokenRow {
  float pts;   ///< the per-token scale
  float d6;    ///< fl(6 pts)
  float rd6;   ///< RN(1 / d6) when fast
  bool fast;   ///< d6 in [2^-60, 2^116]: the division-free forms apply, multipliers 0 or >= 2^-123
};

MEGAMOE_HD TokenRow nvfp4_token_row(float pts) {
  TokenRow r;
  r.pts = pts;
  r.d6 = mul_rn(6.0f, pts);
  // From 2^-60: the residuals of quotients from 2^-11 up are normal. Up to 2^116 (finite
  // d6 reach 2^120 at most: pts <= FLT_MAX / 2688): sf pts <= 448 pts < 2^123, so every
  // nonzero multiplier is at least 2^-123, the f16 multiply form's range
  // (core/e2m1_f16mul.h), with no test a group. False for NaN and Inf.
  r.fast = r.d6 >= 0x1p-60f && r.d6 <= 0x1p116f;
  r.rd6 = r.fast ? recip_nearest(r.d6) : 0.0f;  // RN(1 / d6), without the division's branch
  return r;
}

/// nvfp4_token_group's division-free form, for a row with r.fast (straight-line code: a
/// row kernel can take this branch once a row, outside its groups).
MEGAMOE_HD GroupParams nvfp4_token_group_fast(float amax, const TokenRow& r) {
  GroupParams g;
  g.sf = fp8_e4m3_from_float(div_by_recip(amax, r.d6, r.rd6));  // 0..0x7E: amax <= row max
  // sf in [1, 0x7E] (2^-9 .. 448) times pts = d6 / 6: a normal product with a normal
  // reciprocal.
  const float m = recip_nearest(mul_rn(e4m3_to_float_finite(g.sf), r.pts));
  g.m = g.sf != 0u ? m : 0.0f;
  return g;
}

/// The scale byte and multiplier of a group with NaN-ignoring max |x| = amax >= 0 under
/// row r: the division-free forms where r.fast, the divisions otherwise.
MEGAMOE_HD GroupParams nvfp4_token_group(float amax, const TokenRow& r) {
  GroupParams g;
  if (r.fast) {
    g = nvfp4_token_group_fast(amax, r);
  } else {
    g.sf = fp8_e4m3_from_float(div_rn(amax, r.d6));
    const float sf = e4m3_to_float(g.sf);
    g.m = sf > 0.0f ? div_rn(1.0f, mul_rn(sf, r.pts)) : 0.0f;
  }
  return g;
}

/// Parameters of a group with NaN-ignoring max |x| = amax. s2: the static global scale
/// (kNvfp4Static) or the token's per-token scale (kNvfp4PerToken); ignored otherwise.
template <Format F>
MEGAMOE_HD GroupParams group_params(float amax, float floor, float s2) {
  GroupParams g;
  if constexpr (F == Format::kFp8Ue8m0 || F == Format::kFp8Fp32) {
    const float s = mul_rn(fmax_nan_ignoring(amax, floor), bits_float(kInv448Bits));
    if constexpr (F == Format::kFp8Ue8m0) {
      g.sf = ue8m0_exponent(s);
      g.m = ue8m0_inv_scale(g.sf);
    } else {
      g.sf = float_bits(s);
      g.m = div_rn(1.0f, s);
    }
  } else if constexpr (F == Format::kMxfp4 || F == Format::kMxfp4Rne) {
    g.sf = ue8m0_exponent(mul_rn(fmax_nan_ignoring(amax, floor), bits_float(kInv6Bits)));
    g.m = ue8m0_inv_scale(g.sf);
  } else if constexpr (F == Format::kNvfp4Static) {
    (void)floor;
    g.sf = nvfp4_static_sf(amax, s2);
    g.m = nvfp4_static_divisor(g.sf, s2);
  } else {
    (void)floor;
    g = nvfp4_token_group(amax, nvfp4_token_row(s2));
  }
  return g;
}

/// The per-token second-level scale of kNvfp4PerToken from the row's NaN-ignoring max |x|.
MEGAMOE_HD float per_token_scale(float row_amax, float floor) {
  return div_rn(fmax_nan_ignoring(row_amax, floor), kNvfp4TokenDiv);
}

/// Code of value x in a group with parameters g: an e4m3 byte or an e2m1 nibble.
template <Format F>
MEGAMOE_HD uint32_t encode(float x, const GroupParams& g) {
  if constexpr (elem_of(F) == Elem::kE4M3) {
    return fp8_e4m3_from_float(mul_rn(x, g.m));
  } else {
    const float v = F == Format::kNvfp4Static ? div_rn(x, g.m) : mul_rn(x, g.m);
    return ttz_of(F) ? e2m1_ttz(v) : e2m1_rne(v);
  }
}

/// The scale a stored scale code stands for (dequantization): 2^(e-127), the e4m3 value,
/// or the fp32 itself.
template <Format F>
MEGAMOE_HD float scale_value(uint32_t sf) {
  if constexpr (sf_of(F) == Sf::kUE8M0x4) return ue8m0_scale(sf);
  else if constexpr (sf_of(F) == Sf::kE4M3x4) return e4m3_to_float(sf);
  else return bits_float(sf);
}

/// True for NaN and +-Inf (the non-finite counter).
MEGAMOE_HD bool non_finite(float x) { return (float_bits(x) & 0x7F800000u) == 0x7F800000u; }

}  // namespace core
}  // namespace megamoe
