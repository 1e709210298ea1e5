// nvfp4/recipe.h: NVFP4's scales (e2m1 values, e4m3 scale bytes over groups of 16, a
// second-level fp32 scale), per group of a token with NaN-ignoring max |x| = amax:
//   static     sf = e4m3(clamp(fl(amax / fl(6*gs)), 2^-9, 448)); v = fl(x / fl(sf*gs))
//   per token  pts = fl(max(row_amax,floor) / 2688) per token (floor 0: 1 where the row's
//              max is below 2^-100);
//              sf = e4m3_satfinite(fl(amax / fl(6*pts))); inv = sf > 0 ? fl(1/fl(sf*pts)) : 0;
//              v = fl(x * inv)
//   online     gs = fl(max(A, floor) / 2688), A the NaN-ignoring max |x| over the whole
//              [T, H] tensor (floor 0: 1 where A is below 2^-100), written to global_scale;
//              then every group as static with that gs
// then e2m1 with ties toward zero (e2m1/codec.h).
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "formats/format_list.h"
#include "formats/group_params.h"

namespace megamoe {
namespace core {

constexpr float kNvfp4TokenDiv = 2688.0f;  ///< 6 * 448: per-token scale = max(row_amax, floor) / 2688

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
  // (formats/e2m1/f16mul.h), with no test a group. False for NaN and Inf.
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

/// The per-token second-level scale of kNvfp4PerToken from the row's NaN-ignoring max |x|.
/// Floor 0: 1 for a row whose max is below kMinFp32ScaleFloor (zero and all-NaN rows
/// included; its groups then have scale byte 0 and zero codes), so that every other row has
/// the scales of floor 2^-100, whose group multipliers are all finite.
MEGAMOE_HD float per_token_scale(float row_amax, float floor) {
  const float a = fmax_nan_ignoring(row_amax, floor);
  return floor == 0.0f && a < kMinFp32ScaleFloor ? 1.0f : div_rn(a, kNvfp4TokenDiv);
}

/// NVFP4 online's global scale from the tensor's NaN-ignoring max |x| (the per-token rule
/// applied to the whole tensor): fl(max(amax, floor) / 2688); floor 0: 1 where amax is
/// below kMinFp32ScaleFloor (an all-zero or all-NaN tensor included).
/// Monotone non-decreasing in amax for a fixed positive floor, so the max of per-block
/// candidates is the tensor's (the CUDA backend's atomicMax, online_candidate).
MEGAMOE_HD float online_global_scale(float amax, float floor) { return per_token_scale(amax, floor); }

/// A block's candidate for NVFP4 online's global scale from its part's max |x|, as the
/// CUDA backend accumulates it (atomicMax of the bits, from 0): the global scale of the
/// part, but 0 for floor 0 where the part's max is below kMinFp32ScaleFloor; the staging
/// reads a total of 0 as the unit scale 1 (only when every part is such).
MEGAMOE_HD float online_candidate(float amax, float floor) {
  const float a = fmax_nan_ignoring(amax, floor);
  return floor == 0.0f && a < kMinFp32ScaleFloor ? 0.0f : div_rn(a, kNvfp4TokenDiv);
}

}  // namespace core
}  // namespace megamoe
