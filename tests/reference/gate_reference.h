// gate_reference.h: an independent host reference of the gate's logits (docs/CONTRACT.md
// "Gate, route and stage"), written from the contract's text without the library's headers
// (the bit casts are megamoe_reference.h's):
//  - the fused multiply-add is formed in double: the product of two floats is exact there
//    (24 + 24 <= 53 bits), the sum's rounding error is recovered exactly (Knuth's two-sum),
//    the exact sum is rounded to double by round-to-odd (the sticky bit kept in the last
//    place), and that double is rounded once to float: round-to-odd at 53 >= 24 + 2 bits
//    makes the second rounding the correctly rounded one (Boldo and Melquiond). No std::fma.
//  - each chunk's chain stops at the row's last column (no padding zeros are formed);
//  - the fold of halves is written as its closed form: the sum over the chunks j = r mod s
//    is fl(sum over j = r mod 2s + sum over j = r + s mod 2s), recursively from (r, s) =
//    (0, 1) down to single chunks at s = N (chunks past n are +0); fp32 sums are formed in
//    double and rounded once (innocuous for a sum of two floats).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "megamoe_reference.h"

namespace megamoe_ref {
namespace gate {

using megamoe_ref::detail::bits_of;

inline uint64_t dbits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
inline double dfrom(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

/// a * b + c with one rounding to nearest even (fp32), formed as the header says.
inline float fma32(float a, float b, float c) {
  const double p = static_cast<double>(a) * static_cast<double>(b);  // exact for finite a, b
  const double cd = c;
  const double s = p + cd;
  // Infinities and NaNs: IEEE's rules are the same in double (p is never an overflow).
  if (!std::isfinite(a) || !std::isfinite(b) || !std::isfinite(c)) return static_cast<float>(s);
  const double bb = s - p;
  const double err = (p - (s - bb)) + (cd - bb);  // p + c == s + err exactly
  if (err == 0.0) return static_cast<float>(s);   // s is exact (zeros keep IEEE's sign rule)
  // s != 0 here. The truncation of s + err toward zero, then its last bit forced to 1.
  uint64_t u = dbits(s);
  const bool s_neg = (u >> 63) != 0;
  const bool err_neg = err < 0.0;
  if (s_neg != err_neg) u -= 1;  // |s + err| < |s|: one step toward zero
  u |= 1u;
  return static_cast<float>(dfrom(u));
}

/// fl(a + b) in fp32.
inline float add32(float a, float b) { return static_cast<float>(static_cast<double>(a) + static_cast<double>(b)); }

/// The sum over the chunks j = r mod s of @p c (c.size() a power of two).
inline float residue_sum(const std::vector<float>& c, size_t r, size_t s) {
  if (s == c.size()) return c[r];
  return add32(residue_sum(c, r, 2 * s), residue_sum(c, r + s, 2 * s));
}

/// One logit from the widened row @p y and weight row @p w of H columns.
inline float logit(const float* y, const float* w, int64_t H) {
  const int64_t n = (H + 15) / 16;
  size_t N = 1;
  while (static_cast<int64_t>(N) < n) N *= 2;
  std::vector<float> c(N, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int64_t i = 16 * j; i < 16 * j + 16 && i < H; ++i) acc = fma32(y[i], w[i], acc);
    c[static_cast<size_t>(j)] = acc;
  }
  return residue_sum(c, 0, 1);
}

/// Every logit: @p y [T, H] and @p w [E, H] row-major values (already widened), out [T, E];
/// a NaN logit is the quiet NaN 0x7FC00000, as the contract writes it.
inline std::vector<float> logits(const std::vector<float>& y, const std::vector<float>& w, int64_t T, int64_t E,
                                 int64_t H) {
  std::vector<float> out(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const float v = logit(&y[static_cast<size_t>(t * H)], &w[static_cast<size_t>(e * H)], H);
      out[static_cast<size_t>(t * E + e)] = std::isnan(v) ? megamoe_ref::detail::float_of(0x7FC00000u) : v;
    }
  }
  return out;
}

}  // namespace gate
}  // namespace megamoe_ref
