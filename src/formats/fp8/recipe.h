// fp8/recipe.h: the fp8 formats' scales (fp8 e4m3 values, groups of G dividing 128), per
// group of a token with NaN-ignoring max |x| = amax (fmaxf semantics):
//   s = fl(max(amax, floor) * fl(1/448))          (PyTorch's CUDA division by a scalar)
//   UE8M0  e = exponent(s) + (mantissa(s) != 0), clamped to [1, 254]; multiplier 2^(127-e)
//   fp32   the scale is s; multiplier fl(1/s)
//   value  e4m3(fl(x * multiplier))               (core/numerics.h, satfinite)
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "formats/format_list.h"
#include "formats/group_params.h"

namespace megamoe {
namespace core {

/// The scale and multiplier of an fp8 group with UE8M0 (@p S = Sf::kUE8M0x4) or fp32 scales.
template <Sf S>
MEGAMOE_HD GroupParams fp8_group_params(float amax, float floor) {
  GroupParams g;
  const float s = mul_rn(fmax_nan_ignoring(amax, floor), bits_float(kInv448Bits));
  if constexpr (S == Sf::kUE8M0x4) {
    g.sf = ue8m0_exponent(s);
    g.m = ue8m0_inv_scale(g.sf);
  } else {
    g.sf = float_bits(s);
    g.m = div_rn(1.0f, s);
  }
  return g;
}

/// The e4m3 byte of x in a group with parameters g.
MEGAMOE_HD uint32_t fp8_encode(float x, const GroupParams& g) { return fp8_e4m3_from_float(mul_rn(x, g.m)); }

}  // namespace core
}  // namespace megamoe
