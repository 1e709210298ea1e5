// fastdiv.h: unsigned 32-bit division by a run-time invariant divisor as a multiply-high,
// an add and a shift (Granlund & Montgomery, "Division by invariant integers using
// multiplication", 1994, round-up variant with a 33-bit add). The host builds the
// multiplier once per launch; the kernels divide chunk indices by the chunks per row with
// it instead of the ~20-instruction integer division. Exact for every n < 2^32 and every
// divisor >= 1 (tests/cpp/test_fastdiv.cpp).
#pragma once

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace core {

struct FastDivU32 {
  uint32_t divisor;  ///< d >= 1
  uint32_t mul;      ///< floor(2^32 * (2^shift - d) / d) + 1
  uint32_t shift;    ///< ceil(log2(d))
};

inline FastDivU32 make_fastdiv(uint32_t d) {
  uint32_t shift = 0;
  while ((uint64_t{1} << shift) < d) ++shift;
  const uint64_t mul = ((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1;
  return FastDivU32{d, static_cast<uint32_t>(mul), shift};
}

MEGAMOE_HD uint32_t mulhi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

/// n / f.divisor.
MEGAMOE_HD uint32_t fastdiv(uint32_t n, const FastDivU32& f) {
  return static_cast<uint32_t>((static_cast<uint64_t>(mulhi_u32(n, f.mul)) + n) >> f.shift);
}

}  // namespace core
}  // namespace megamoe
