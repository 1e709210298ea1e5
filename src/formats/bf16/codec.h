// bf16/codec.h: the bf16 pass-through row's element rule (formats/format_list.h kBf16),
// shared bit for bit by the CPU backend and the CUDA kernels. bf16 input is copied as bits
// (NaN payloads kept); fp32 rounds to the nearest bf16, ties to even, by the integer form
// (the carry of the rounding bias into the exponent gives the overflow to +-Inf and the
// subnormals with no special case, and no hardware conversion with its NaN and flush
// rules is involved); fp16 widens exactly (core::half_to_float) and rounds the same way.
// Every NaN becomes 0x7FC0, the positive quiet NaN: c10::BFloat16's scalar rule
// (round_to_nearest_even). torch's vectorized CPU cast and its CUDA cast (__float2bfloat16,
// 0x7FFF) give other NaN bits; every non-NaN value is the same (an H100 run compared them).
#pragma once

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace core {

/// The quiet NaN every NaN input becomes.
constexpr uint16_t kBf16NaN = 0x7FC0;

/// fp32 -> bf16 bits, nearest even; NaN -> kBf16NaN.
MEGAMOE_HD uint16_t bf16_from_float(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return kBf16NaN;
  // Below NaN the sum cannot wrap (0xFF800000 + 0x8000 < 2^32).
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// fp16 bits -> bf16 bits: exact widening, then bf16_from_float.
MEGAMOE_HD uint16_t bf16_from_half(uint16_t h) { return bf16_from_float(half_to_float(h)); }

/// bf16 bits that are NaN or +-Inf (nonfinite_count).
MEGAMOE_HD bool bf16_non_finite(uint16_t b) { return (b & 0x7F80u) == 0x7F80u; }

}  // namespace core
}  // namespace megamoe
