// recipe.h: a format's per-group math, shared bit-for-bit by the CPU backend and the CUDA
// kernels (docs/CONTRACT.md "Formats"). group_params and encode choose a row's recipe by
// its registry columns (element codec, second-level scale), never by its name:
//   e4m3 or e5m2                  fp8/recipe.h (UE8M0 or fp32 scales)
//   e2m1, no second-level scale   mxfp4/recipe.h
//   e2m1, static or per token     nvfp4/recipe.h
// and the element codecs: e4m3 in core/numerics.h, e5m2 in fp8/e5m2.h, e2m1 in
// e2m1/codec.h (either tie rule, the row's "rounds" column). Nothing here flushes
// subnormals; builds never use fast-math.
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "formats/e2m1/codec.h"
#include "formats/format_list.h"
#include "formats/fp8/recipe.h"
#include "formats/group_params.h"
#include "formats/mxfp4/recipe.h"
#include "formats/nvfp4/recipe.h"

namespace megamoe {
namespace core {

/// Parameters of a group with NaN-ignoring max |x| = amax. s2: the static global scale or
/// the token's per-token scale (formats with a second-level scale); ignored otherwise.
template <Format F>
MEGAMOE_HD GroupParams group_params(float amax, float floor, float s2) {
  constexpr Scale2 kS2 = row_of(F).s2;
  if constexpr (fp8_elem(F)) {
    (void)s2;
    return fp8_group_params<sf_of(F), elem_of(F)>(amax, floor);
  } else if constexpr (kS2 == Scale2::kNone) {
    (void)s2;
    return mxfp4_group_params(amax, floor);
  } else if constexpr (global_scaled(F)) {  // online: static's groups under the computed gs
    (void)floor;
    GroupParams g;
    g.sf = nvfp4_static_sf(amax, s2);
    g.m = nvfp4_static_divisor(g.sf, s2);
    return g;
  } else {
    (void)floor;
    return nvfp4_token_group(amax, nvfp4_token_row(s2));
  }
}

/// Code of value x in a group with parameters g: an fp8 byte or an e2m1 nibble (NVFP4
/// static divides by its divisor, the others multiply).
template <Format F>
MEGAMOE_HD uint32_t encode(float x, const GroupParams& g) {
  if constexpr (fp8_elem(F)) {
    return fp8_encode<elem_of(F)>(x, g);
  } else {
    const float v = global_scaled(F) ? div_rn(x, g.m) : mul_rn(x, g.m);
    return ttz_of(F) ? e2m1_ttz(v) : e2m1_rne(v);
  }
}

}  // namespace core
}  // namespace megamoe
