// mxfp4/recipe.h: MXFP4's scales (e2m1 values, UE8M0 scales over groups of 32), per group
// of a token with NaN-ignoring max |x| = amax:
//   e = ue8m0(fl(max(amax, floor) * fl(1/6)));  v = fl(x * 2^(127-e));  e2m1(v)
// with either tie rule (e2m1/codec.h). e is the same as ue8m0(fl(max(amax, floor) / 6)).
// Floor 0: e = 127 (the unit scale) where max(amax, floor) is 0.
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "formats/format_list.h"
#include "formats/group_params.h"

namespace megamoe {
namespace core {

/// Bits of fl(1/6). The UE8M0 exponent of fl(a * fl(1/6)) equals that of fl(a / 6) for
/// every non-negative fp32 a (tests/cpp/test_reference.cpp checks all 2^31 of them): the
/// MXFP4 scale is a multiply, one instruction instead of a division.
constexpr uint32_t kInv6Bits = 0x3E2AAAABu;

/// The scale byte and multiplier of an MXFP4 group.
MEGAMOE_HD GroupParams mxfp4_group_params(float amax, float floor) {
  GroupParams g;
  const float a = fmax_nan_ignoring(amax, floor);
  g.sf = floor == 0.0f && a == 0.0f ? kUe8m0Unit : ue8m0_exponent(mul_rn(a, bits_float(kInv6Bits)));
  g.m = ue8m0_inv_scale(g.sf);
  return g;
}

}  // namespace core
}  // namespace megamoe
