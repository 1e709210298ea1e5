// norm_reference.h: an independent host reference of rmsnorm_and_stage's norm
// (docs/CONTRACT.md "RMSNorm and stage"), written without the library's headers (the bit
// casts are megamoe_reference.h's):
//  - every fp32 operation (+, *, /, sqrt) is formed in double and rounded once to float;
//    double rounding is innocuous for these on two floats (53 >= 2*24 + 2, Figueroa);
//  - bf16 rounding by comparing the value (in double) with its two bf16 neighbours, a tie
//    to the even one, the neighbour above the largest finite bf16 being 2^128 (so overflow
//    goes to Inf exactly past the midpoint), NaN -> 0x7FC0;
//  - the sum of squares: sequential 16-element chunk sums, then the chunk sums combined as
//    fl(even-indexed tree + odd-indexed tree), recursively (the contract states the same
//    tree as folds of halves, highest first).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "megamoe_reference.h"

namespace megamoe_ref {
namespace norm {

using megamoe_ref::detail::bits_of;
using megamoe_ref::detail::float_of;
inline float add(float a, float b) { return static_cast<float>(static_cast<double>(a) + static_cast<double>(b)); }
inline float mul(float a, float b) { return static_cast<float>(static_cast<double>(a) * static_cast<double>(b)); }
inline float bf16_value(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

/// bf16 nearest to @p f, ties to even; NaN -> 0x7FC0.
inline uint16_t to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t u = bits_of(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // toward zero
  if ((u & 0xFFFFu) == 0) return lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // away from zero
  const double a = std::fabs(static_cast<double>(f));
  const double vlo = std::fabs(static_cast<double>(bf16_value(lo)));
  const double vhi = (hi & 0x7FFFu) == 0x7F80u ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(bf16_value(hi)));
  const double dlo = a - vlo, dhi = vhi - a;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) == 0 ? lo : hi;
}

/// The combining tree over c[off], c[off + st], ... (count a power of two).
inline float tree(const std::vector<float>& c, size_t off, size_t st, size_t count) {
  if (count == 1) return c[off];
  return add(tree(c, off, 2 * st, count / 2), tree(c, off + st, 2 * st, count / 2));
}

/// One row: z (bf16 bits after the residual add, if any) and y (bf16 bits).
struct Row {
  std::vector<uint16_t> z, y;
};

/// @param x, residual  bf16 bits of one row (residual may be null); @param w the weight as floats.
inline Row row(const uint16_t* x, const uint16_t* residual, const std::vector<float>& w, float eps) {
  const size_t H = w.size();
  Row r;
  r.z.resize(H);
  r.y.resize(H);
  std::vector<float> z(H);
  for (size_t j = 0; j < H; ++j) {
    r.z[j] = residual != nullptr ? to_bf16(add(bf16_value(x[j]), bf16_value(residual[j]))) : x[j];
    z[j] = bf16_value(r.z[j]);
  }
  size_t n = H / 16, N = 1;
  while (N < n) N *= 2;
  std::vector<float> c(N, 0.0f);
  for (size_t k = 0; k < n; ++k) {
    float acc = mul(z[16 * k], z[16 * k]);
    for (size_t i = 1; i < 16; ++i) acc = add(acc, mul(z[16 * k + i], z[16 * k + i]));
    c[k] = acc;
  }
  const float S = H == 0 ? 0.0f : tree(c, 0, 1, N);
  const float mean = static_cast<float>(static_cast<double>(S) / static_cast<double>(H));
  const float root = static_cast<float>(std::sqrt(static_cast<double>(add(mean, eps))));
  const float s = static_cast<float>(1.0 / static_cast<double>(root));
  for (size_t j = 0; j < H; ++j) r.y[j] = to_bf16(mul(bf16_value(to_bf16(mul(z[j], s))), w[j]));
  return r;
}

}  // namespace norm
}  // namespace megamoe_ref
