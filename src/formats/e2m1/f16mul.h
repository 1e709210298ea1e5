// e2m1_f16mul.h: the ties-toward-zero e2m1 codes of v = fl(x * m) for a 16-element bf16
// chunk (NVFP4 per-token's values; NVFP4 static's through a multiplier), with the z map of
// formats/e2m1/fp32.h evaluated on f16 pairs, for the CUDA kernels on sm_89+.
//
// Why: the fp32 form (e2m1_fp32_mul_chunk) spends 7.5 instructions a value: unpack, the
// product, two integer ones rounding it up to the bf16 grid, three fp32 FMAs and half a
// conversion. The three FMAs and the mask need not run per value: here they run on f16
// pairs, 6 instructions a value, and the kernel of these formats is bound by issue slots.
//
// How, per value: a = sat(|x| * m/8) (one multiply, rounded to nearest: fl(|x| m) / 8
// exactly while m/8 is normal or 0, the precondition; the clamp at 1 stands for v >= 8 and Inf,
// the .sat maps NaN to 0, the code of NaN under ties toward zero). Its magnitude rounded up
// to four significant bits, u, keeps its count of the midpoints M/8 below it (every e2m1
// midpoint 0.25 .. 5 has at most three significant bits; e2m1_fp32_mul_chunk gives the
// argument): one add of 0xFFFFF to a's bits, then the truncating conversion of two values
// to f16 (cvt.rz.f16x2.f32, exact down to 11 bits) and one mask of a pair to 4 bits. On
// the pair, exactly in f16 (u is a multiple of 2^-8 from the first midpoint M/8 = 2^-5 up):
//   t1 = sat(u + 1/4 - 2^-9),  t2 = sat(4u - 2),  z = 8 t1 - t2
// is the z of formats/e2m1/fp32.h for v = 8u, lowered by 2^-6: 8u + 2 - 2^-6 up to v = 4,
// 6 + (8u - 4) / 2 - 2^-6 up to v = 6, 7 above. The e5m2 byte of z is 0x40 | code: an
// exact tie v = M lands 2^-6 below its midpoint of z and goes down, and the next u above M
// (at least 2^-8 above M/8: z at least 2^-5 above the midpoint on the slope 1, 2^-4 on the
// slope 1/2) lands above it. Below the first midpoint the conversion and the add may round,
// to values still below 2.25 (code 0).
// The host forms evaluate each instruction exactly (the f16 sums and products of a power of
// two are exact in double): tests/cpp/test_reference.cpp checks the chunk on every bf16 for
// many multipliers against the reference; tests/cuda/test_cuda_numerics.cu the device's
// instructions against core::encode.
#pragma once

#include <cstdint>

#include "formats/e2m1/f16.h"
#include "formats/e2m1/fp32.h"
#include "core/numerics.h"

namespace megamoe {
namespace core {

/// The least multiplier of the f16 form: m / 8 stays a normal fp32.
constexpr float kF16MulMinMultiplier = 0x1p-123f;

/// sat(|x| * p) rounded to nearest, NaN to +0 (mul.rn.sat.f32 reading |x|).
MEGAMOE_HD float mul_abs_sat(float x, float p) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("mul.rn.sat.f32 %0, %1, %2;" : "=f"(r) : "f"(fabsf(x)), "f"(p));
  return r;
#else
  const float v = mul_rn(abs_bits(x), p);
  return v != v ? 0.0f : (v > 1.0f ? 1.0f : v);
#endif
}

/// The e5m2 bytes of the f16 pair z (lane 1 to bits 8..15), nearest even, for lanes +0 or
/// in [1, 8) (the values of the z map).
MEGAMOE_HD uint32_t e5m2x2_of_f16x2(uint32_t z) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e5m2x2.f16x2 %0, %1;" : "=h"(r) : "r"(z));
  return r;
#else
  return e5m2_of_z_sw(half_to_float(static_cast<uint16_t>(z))) |
         (e5m2_of_z_sw(half_to_float(static_cast<uint16_t>(z >> 16))) << 8);
#endif
}

/// The e5m2 bytes 0x40 | code of elements 2i + 1 (low byte) and 2i (high) of the pair w,
/// for the scaled multiplier m8 = m / 8 (see the file comment).
MEGAMOE_HD uint32_t e2m1_f16mul_pair(uint32_t w, float m8) {
  const float a0 = mul_abs_sat(bits_float(w << 16), m8);
  const float a1 = mul_abs_sat(bits_float(w & 0xFFFF0000u), m8);
  // a in [0, 1]: the add does not reach the exponent's top; element 2i to the high lane
  const uint32_t u = f16x2_rz(bits_float(float_bits(a0) + 0xFFFFFu), bits_float(float_bits(a1) + 0xFFFFFu)) &
                     0xFF80FF80u;
  const uint32_t t1 = f16x2_add<true>(u, 0x33F033F0u);          // 1/4 - 2^-9
  const uint32_t t2 = f16x2_fma<true>(u, 0x44004400u, 0xC000C000u);  // 4, -2
  return e5m2x2_of_f16x2(f16x2_fma<false>(t1, 0x48004800u, f16x2_neg(t2)));  // 8, -t2
}

/// The ties-toward-zero e2m1 nibbles of v = fl(x * m) for the 16 bf16 values x in w
/// (element 2i in the low half of w[i]) as the chunk's two words of x_q (element 2j in the
/// low nibble of byte j), for m = +0 or m >= kF16MulMinMultiplier (Inf included).
MEGAMOE_HD void e2m1_f16_mul_chunk(const uint32_t (&w)[8], float m, uint32_t (&out)[2]) {
  const float m8 = mul_rn(m, 0.125f);
  uint32_t c[4];
  MEGAMOE_UNROLL
  for (int q = 0; q < 4; ++q) c[q] = e2m1_f16mul_pair(w[2 * q], m8) | (e2m1_f16mul_pair(w[2 * q + 1], m8) << 16);
  e2m1_pack_e5m2_codes<false>(c, w, out);
}

/// The f16 form applies to multiplier m (m / 8 is +0 or normal).
MEGAMOE_HD bool f16_mul_applies(float m) { return m >= kF16MulMinMultiplier || m == 0.0f; }

/// The same codes for any multiplier m >= +0: the f16 form, or where it does not apply the
/// fp32 one.
MEGAMOE_HD void e2m1_mul_chunk(const uint32_t (&w)[8], float m, uint32_t (&out)[2]) {
  if (f16_mul_applies(m)) e2m1_f16_mul_chunk(w, m, out);
  else e2m1_fp32_mul_chunk(w, m, out);
}

}  // namespace core
}  // namespace megamoe
