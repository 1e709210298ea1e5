// numerics.h: the numeric rules of MegaMoE staging, shared bit-for-bit by the CPU backend
// and the CUDA kernels (this is the only copy of the math; see docs/CONTRACT.md "Formats").
//
// Per group of G hidden elements of one token:
//   amax  = NaN-ignoring max |x| in fp32           (fmaxf semantics)
//   amax  = max(amax, 1e-4f)
//   s     = amax * C,  C = 1.0f/448.0f (0x3B124925), product rounded to nearest even
//   UE8M0: e = biased exponent of s, +1 if s has a nonzero mantissa, clamped to [1, 254];
//          scale = 2^(e-127)                         fp32: scale = s
//   r     = 1.0f / scale                             (IEEE, round to nearest even)
//   q     = fp8_e4m3fn(x * r)  satfinite, RNE, NaN -> 0x7F, +-Inf -> +-448
// Nothing here flushes subnormals; builds must not use fast-math.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MEGAMOE_HD __host__ __device__ __forceinline__
#else
#define MEGAMOE_HD inline
#endif

// A rarely taken path (an exact fallback) as a call, not inlined, so that its code does not
// sit between the instructions of the fast path that takes it (the router's exact score
// chain: its decode launch at E = 384 0.5-3.2% faster on the H200, docs/PERFORMANCE.md).
// Only where the caller has registers to spare: a call changes the caller's allocation.
#if defined(__CUDACC__)
#define MEGAMOE_HD_COLD __host__ __device__ inline __noinline__
#else
#define MEGAMOE_HD_COLD inline
#endif

// Unroll the next loop in device code (host compilers do not know the pragma).
#if defined(__CUDA_ARCH__)
#define MEGAMOE_UNROLL _Pragma("unroll")
#else
#define MEGAMOE_UNROLL
#endif

namespace megamoe {
namespace core {

constexpr uint32_t kInv448Bits = 0x3B124925u;  ///< bits of 1.0f / 448.0f
constexpr float kAmaxFloor = 1e-4f;            ///< lower bound of amax
constexpr uint8_t kFp8NaN = 0x7F;              ///< fp8 e4m3fn NaN byte the hardware emits
constexpr uint8_t kFp8Max = 0x7E;              ///< +448

MEGAMOE_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MEGAMOE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// fp32 product rounded to nearest even, never contracted into an FMA.
MEGAMOE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // host code is built with -ffp-contract=off (see CMakeLists.txt)
#endif
}

/// fp32 sum rounded to nearest even.
MEGAMOE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// IEEE fp32 division rounded to nearest even.
MEGAMOE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// fp32 fused multiply-add a * b + c, one rounding to nearest even (glibc's fmaf is exact).
MEGAMOE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// ---------------------------------------------------------------------------------------
// Correctly rounded reciprocal and square root without the library's slow-path branch.
// A GPU's IEEE division and square root (__fdiv_rn, __fsqrt_rn) are an approximation, a
// refinement and a range test that branches to a slow path: a convergence region the
// compiler schedules nothing across, so independent chains that each contain one run one
// after another (the router's N scores "side by side" did, in route_kernel's sm_90 SASS).
// Where the operand's range is known, the approximation (rcp.approx, rsqrt.approx: within
// about an ulp, PTX ISA) and Newton steps give the same correctly rounded bits branch-free;
// the host takes the seed from its own arithmetic and runs the same steps.

/// RN(1 / y) from r0 within two ulps of it, for y a normal fp32 with a normal reciprocal:
/// two Newton steps r + r (1 - y r) reach it (from up to four ulps away), but for an all-ones
/// significand y = (2 - 2^-23) 2^e, whose steps stop at the power of two just below
/// RN(1 / y) = (1 + 2^-23) 2^(-e-1): that case is lifted by one ulp. (One step is not
/// enough: from the upper neighbour it misses 32 significands a binade.)
MEGAMOE_HD float recip_refine(float y, float r0) {
  const float r1 = fma_rn(fma_rn(-y, r0, 1.0f), r0, r0);
  const float r2 = fma_rn(fma_rn(-y, r1, 1.0f), r1, r1);
  const uint32_t b = float_bits(r2);
  const bool stuck = (float_bits(y) & 0x7FFFFFu) == 0x7FFFFFu && (b & 0x7FFFFFu) == 0u;
  return stuck ? bits_float(b + 1u) : r2;
}

/// The reciprocal 1 / y rounded to nearest even (y as for recip_refine), from the GPU's
/// rcp.approx (documented within an ulp) or the host's division.
MEGAMOE_HD float recip_nearest(float y) {
#if defined(__CUDA_ARCH__)
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(y));
  return recip_refine(y, r0);
#else
  return recip_refine(y, 1.0f / y);
#endif
}

/// sqrt(x) rounded to nearest even from y0 within three ulps of RN(1 / sqrt(x)), for x a
/// normal fp32 >= 2^-100: one Newton step on the reciprocal root, then the root and one
/// correction by its exact residual (x - s^2, an fma). Without the first step the
/// correction misses from some seeds two ulps away; below 2^-100 the residual is no longer
/// exact (tests/cpp/test_reference.cpp: every significand of two binades, so of both
/// exponent parities, from seven seeds each, and the ends of the range).
MEGAMOE_HD float sqrt_refine(float x, float y0) {
  const float h0 = mul_rn(0.5f, y0);
  const float y1 = fma_rn(fma_rn(-mul_rn(x, y0), y0, 1.0f), h0, y0);
  const float s = mul_rn(x, y1), h = mul_rn(0.5f, y1);
  return fma_rn(fma_rn(-s, s, x), h, s);
}

/// sqrt(x) rounded to nearest even (IEEE) for x >= +0, +inf or NaN, branch-free: operands
/// below 2^-100 (subnormals included) are scaled by 2^64 and the root by 2^-32, both exact;
/// +-0, +inf and NaN are selected through. The seed: rsqrt.approx on the GPU, the host's
/// double root rounded (within an ulp).
MEGAMOE_HD float sqrt_nearest(float x) {
  const bool tiny = x < 0x1p-100f;
  const float xs = tiny ? mul_rn(x, 0x1p64f) : x;
#if defined(__CUDA_ARCH__)
  float y0;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(xs));
#else
  const float y0 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(xs)));
#endif
  float r = sqrt_refine(xs, y0);
  r = tiny ? mul_rn(r, 0x1p-32f) : r;
  r = x == 0.0f || x == bits_float(0x7F800000u) ? x : r;
  return x != x ? x : r;
}

/// NaN-ignoring maximum (fmaxf semantics: if one operand is NaN, the other).
MEGAMOE_HD float fmax_nan_ignoring(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  if (a != a) return b;
  if (b != b) return a;
  return a > b ? a : b;
#endif
}

/// A kept top-k weight times the routed scaling factor: one fp32 rounding; a NaN weight
/// keeps its bits, and a NaN the product makes (+-Inf times +-0) is 0x7FC00000: hardware
/// NaNs differ between CPUs (x86 0xFFC00000, Arm 0x7FC00000) and GPUs (0x7FFFFFFF), the
/// bytes must not.
MEGAMOE_HD float scale_weight(float w, float alpha) {
  if (w != w) return w;
  const float r = mul_rn(w, alpha);
  return r != r ? bits_float(0x7FC00000u) : r;
}

/// NaN-ignoring minimum (fminf semantics).
MEGAMOE_HD float fminf_nan_ignoring(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  if (a != a) return b;
  if (b != b) return a;
  return a < b ? a : b;
#endif
}

/// |x| by clearing the sign bit.
MEGAMOE_HD float abs_bits(float x) { return bits_float(float_bits(x) & 0x7FFFFFFFu); }

/// bf16 bits -> fp32 (exact).
MEGAMOE_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

/// IEEE binary16 bits -> fp32 (exact; subnormals, Inf, NaN payloads preserved).
MEGAMOE_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_float(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return bits_float(sign);
  // subnormal half: normalize
  uint32_t e = 113;  // exponent of 2^-14 biased for fp32 is 113
  while ((man & 0x400u) == 0) {
    man <<= 1;
    --e;
  }
  return bits_float(sign | (e << 23) | ((man & 0x3FFu) << 13));
}

/// UE8M0 exponent byte of scale s: ceil to a power of two, clamped to [1, 254].
MEGAMOE_HD uint32_t ue8m0_exponent(float s) {
  const uint32_t b = float_bits(s);
  uint32_t e = ((b >> 23) & 0xFFu) + ((b & 0x7FFFFFu) != 0u ? 1u : 0u);
  e = e < 1u ? 1u : e;
  e = e > 254u ? 254u : e;
  return e;
}

/// The scale 2^(e-127) of a UE8M0 byte e in [1, 254].
MEGAMOE_HD float ue8m0_scale(uint32_t e) { return bits_float(e << 23); }

/// 1.0f / 2^(e-127) for a UE8M0 byte e in [1, 254], exactly (no division): 2^(127-e) is a
/// normal fp32 for e <= 253 and the subnormal 2^-127 for e = 254. Equal to
/// 1 / ue8m0_scale(e) for every e (the quotient is exact, so rounding plays no part).
MEGAMOE_HD float ue8m0_inv_scale(uint32_t e) {
  return bits_float(e < 254u ? (254u - e) << 23 : 0x00400000u);
}

/// fp32 -> an fp8 byte with kMan mantissa bits whose normals start at 2^kMinE, round to
/// nearest even, finite values saturating to kMax, +-Inf to +-kMax, NaN (either sign) to
/// kNaN: PTX cvt.rn.satfinite's rule, in software (e4m3 below, e5m2 in formats/fp8/e5m2.h).
template <int kMan, int kMinE, uint32_t kMax, uint32_t kNaN>
MEGAMOE_HD uint8_t fp8_from_float_sw(float x) {
  const uint32_t b = float_bits(x);
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t exp = (b >> 23) & 0xFFu;
  const uint32_t man = b & 0x7FFFFFu;
  if (exp == 0xFFu) return static_cast<uint8_t>(man != 0u ? kNaN : sign | kMax);
  if (exp == 0u) return static_cast<uint8_t>(sign);  // fp32 zero/subnormal < 2^-126: rounds to 0
  const int E = static_cast<int>(exp) - 127;
  // Keep kMan fraction bits for fp8 normals (E >= kMinE); fewer for fp8 subnormals.
  const int shift = E >= kMinE ? 23 - kMan : 23 - kMan + kMinE - E;
  if (shift > 24) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
  const uint32_t m24 = man | 0x800000u;
  uint32_t q = m24 >> shift;
  const uint32_t rem = m24 & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  const int base = E - kMinE > 0 ? E - kMinE : 0;
  const int64_t enc = (static_cast<int64_t>(base) << kMan) + static_cast<int64_t>(q);
  return static_cast<uint8_t>(sign | static_cast<uint32_t>(enc > kMax ? kMax : enc));
}

/// fp32 -> fp8 e4m3fn, round to nearest even, finite values saturate to +-448, NaN -> 0x7F,
/// +-Inf -> +-448. Bit-identical to PTX cvt.rn.satfinite.e4m3x2.f32 (portable software path).
MEGAMOE_HD uint8_t fp8_e4m3_from_float_sw(float x) { return fp8_from_float_sw<3, -6, kFp8Max, kFp8NaN>(x); }

/// fp32 -> fp8 e4m3fn with the hardware instruction where the device has it (sm_89+),
/// else the software path. Same bytes either way.
MEGAMOE_HD uint8_t fp8_e4m3_from_float(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(r & 0xFFu);
#else
  return fp8_e4m3_from_float_sw(x);
#endif
}

/// Two fp32 -> two fp8 bytes packed little-endian (lo = a) in one 16-bit value.
MEGAMOE_HD uint16_t fp8x2_e4m3_from_float(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
#else
  return static_cast<uint16_t>(fp8_e4m3_from_float_sw(a) |
                               (static_cast<uint16_t>(fp8_e4m3_from_float_sw(b)) << 8));
#endif
}

constexpr float kE4M3MinSubnormal = 0.001953125f;  ///< 2^-9, the smallest e4m3 magnitude

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

/// True for NaN and +-Inf (the non-finite counter).
MEGAMOE_HD bool non_finite(float x) { return (float_bits(x) & 0x7F800000u) == 0x7F800000u; }

}  // namespace core
}  // namespace megamoe
