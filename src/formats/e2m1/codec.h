// e2m1/codec.h: the e2m1 element codec (grid 0, 0.5, 1, 1.5, 2, 3, 4, 6; nibble = sign << 3 |
// code), shared by the MXFP4 and NVFP4 formats, in both tie rules:
//  - ties toward zero (DeepGEMM's reference): code = the number of midpoints
//    {.25,.75,1.25,1.75,2.5,3.5,5} that |v| strictly exceeds, the sign only when the code is
//    nonzero, NaN -> 0;
//  - nearest even (PTX cvt.rn.satfinite.e2m1x2.f32): saturating, the sign always kept,
//    NaN -> 0x7.
// The fast encodes of whole chunks beside it (e2m1_fp32.h, e2m1_f16.h, e2m1_f16mul.h,
// e2m1_pairs.h) give these bits.
#pragma once

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace core {

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

}  // namespace core
}  // namespace megamoe
