// fp8/recipe.h: the fp8 formats' scales (one fp8 byte a value: e4m3, max 448, or e5m2,
// max 57344), per group of a token with NaN-ignoring max |x| = amax (fmaxf semantics):
//   s = fl(max(amax, floor) * fl(1/max))          (PyTorch's CUDA division by a scalar)
//   UE8M0  e = exponent(s) + (mantissa(s) != 0), clamped to [1, 254]; multiplier 2^(127-e)
//   fp32   the scale is s; multiplier fl(1/s)
//   value  fp8(fl(x * multiplier))                (RNE, satfinite: core/numerics.h, e5m2.h)
// Floor 0: UE8M0 byte 127 where max(amax, floor) is 0; fp32 scale and multiplier 1 where
// s <= 2^-128 (fl(1/s) would be +Inf). Neither can happen at a positive floor.
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "formats/format_list.h"
#include "formats/fp8/e5m2.h"
#include "formats/group_params.h"

namespace megamoe {
namespace core {

/// Bits of fl(1 / the largest finite value) of fp8 element codec @p E.
template <Elem E>
constexpr uint32_t kInvMaxBits = E == Elem::kE5M2 ? kInv57344Bits : kInv448Bits;

/// The scale and multiplier of a group of fp8 codec @p E with UE8M0 (@p S = Sf::kUE8M0x4)
/// or fp32 scales; at floor 0 the unit scale where the scale has none (format_list.h).
template <Sf S, Elem E>
MEGAMOE_HD GroupParams fp8_group_params(float amax, float floor) {
  GroupParams g;
  const float a = fmax_nan_ignoring(amax, floor);
  const float s = mul_rn(a, bits_float(kInvMaxBits<E>));
  if constexpr (S == Sf::kUE8M0x4) {
    g.sf = floor == 0.0f && a == 0.0f ? kUe8m0Unit : ue8m0_exponent(s);
    g.m = ue8m0_inv_scale(g.sf);
  } else {
    const float su = floor == 0.0f && s <= kFp32ScaleNoRecip ? 1.0f : s;
    g.sf = float_bits(su);
    g.m = div_rn(1.0f, su);
  }
  return g;
}

/// The fp8 byte of value v (already multiplied) in codec @p E.
template <Elem E>
MEGAMOE_HD uint32_t fp8_from_float(float v) {
  if constexpr (E == Elem::kE5M2) return fp8_e5m2_from_float(v);
  else return fp8_e4m3_from_float(v);
}

/// Two fp8 bytes of codec @p E packed little-endian (lo = a) in one 16-bit value.
template <Elem E>
MEGAMOE_HD uint32_t fp8x2_from_float(float a, float b) {
  if constexpr (E == Elem::kE5M2) return fp8x2_e5m2_from_float(a, b);
  else return fp8x2_e4m3_from_float(a, b);
}

/// The fp8 byte of x in a group with parameters g.
template <Elem E>
MEGAMOE_HD uint32_t fp8_encode(float x, const GroupParams& g) { return fp8_from_float<E>(mul_rn(x, g.m)); }

}  // namespace core
}  // namespace megamoe
