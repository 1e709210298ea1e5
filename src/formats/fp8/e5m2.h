// fp8/e5m2.h: the e5m2 element codec (1 sign, 5 exponent bits of bias 15, 2 mantissa bits:
// normals (1 + m/4) 2^(e-15) up to 57344 = 0x7B, subnormals m 2^-16), encoded as PTX
// cvt.rn.satfinite.e5m2x2.f32 does it: round to nearest even, finite values saturating to
// +-57344, +-Inf to +-57344, NaN (either sign) to 0x7F.
#pragma once

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace core {

constexpr uint8_t kE5M2Max = 0x7B;   ///< +57344
constexpr uint8_t kE5M2NaN = 0x7F;   ///< the NaN byte the hardware emits
/// Bits of fl(1/57344) = fl(1/448) * 2^-7 exactly (57344 = 448 * 2^7).
constexpr uint32_t kInv57344Bits = kInv448Bits - (7u << 23);

/// fp32 -> e5m2 byte (see file comment), the portable software path.
MEGAMOE_HD uint8_t fp8_e5m2_from_float_sw(float x) { return fp8_from_float_sw<2, -14, kE5M2Max, kE5M2NaN>(x); }

/// fp32 -> e5m2 with the hardware instruction where the device has it (sm_89+), else the
/// software path. Same bytes either way.
MEGAMOE_HD uint8_t fp8_e5m2_from_float(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(r & 0xFFu);
#else
  return fp8_e5m2_from_float_sw(x);
#endif
}

/// Two fp32 -> two e5m2 bytes packed little-endian (lo = a) in one 16-bit value.
MEGAMOE_HD uint16_t fp8x2_e5m2_from_float(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
#else
  return static_cast<uint16_t>(fp8_e5m2_from_float_sw(a) |
                               (static_cast<uint16_t>(fp8_e5m2_from_float_sw(b)) << 8));
#endif
}

/// e5m2 byte -> fp32 (exact; 0x7C / 0xFC -> +-Inf, 0x7D-0x7F and 0xFD-0xFF -> NaN).
MEGAMOE_HD float e5m2_to_float(uint32_t c) {
  const uint32_t sign = (c & 0x80u) << 24, e = (c >> 2) & 0x1Fu, m = c & 3u;
  if (e == 0x1Fu) return bits_float(sign | 0x7F800000u | (m != 0u ? 0x400000u : 0u));
  // normal: (1 + m/4) 2^(e-15) -> fp32 exponent e + 112; subnormal: m 2^-16, exact
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (m << 21));
  return bits_float(float_bits(static_cast<float>(m) * 0x1p-16f) | sign);
}

}  // namespace core
}  // namespace megamoe
