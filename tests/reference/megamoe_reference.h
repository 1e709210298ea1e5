// megamoe_reference.h: an independent, header-only host reference of SPEC.md's staging math.
//
// Deliberately shares no code with src/core: every rule is written a second way so that a
// mistake in one formulation shows up as a mismatch against the other.
//  - fp8 e4m3fn: the table of all 127 non-negative finite fp8 values, decoded from their
//    bytes; the nearest one is found by comparing |v| (exactly, in double) with the
//    midpoints between neighbours, a tie going to the even byte (even byte == even
//    mantissa). Finite values beyond 448 saturate to 448, NaN -> 0x7F, +-Inf -> 0x7E/0xFE.
//  - fp32 products: the exact product of two floats in double (48 significant bits fit
//    in 53), rounded once to float.
//  - 1/scale: double division rounded to float; double rounding is innocuous for a
//    quotient of two floats because 53 >= 2*24 + 2 (Figueroa), so this equals the IEEE
//    fp32 quotient.
//  - UE8M0: ceil(log2 s) from std::frexp (s = m * 2^x, m in [0.5, 1): ceil is x - 1 when
//    m == 0.5, else x), + 127, clamped to [1, 254]; +Inf gives 254.
//  - fp16 widening by ldexp of the integer significand.
// Nothing here depends on compiler floating-point flags (no sums to contract, no
// subnormal-sensitive intermediate other than the final roundings, which are IEEE).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace megamoe_ref {

namespace detail {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Value of the non-negative fp8 e4m3fn byte c in [0, 0x7E].
inline double fp8_value(int c) {
  const int e = c >> 3, m = c & 7;
  return e == 0 ? std::ldexp(static_cast<double>(m), -9)       // subnormal: m * 2^-9
                : std::ldexp(static_cast<double>(8 + m), e - 10);  // (1 + m/8) * 2^(e-7)
}

/// Table of the 127 non-negative finite fp8 values (index = byte) and the 126 midpoints
/// between consecutive ones (all exact in double).
struct Fp8Table {
  std::array<double, 127> value;
  std::array<double, 126> mid;
  Fp8Table() {
    for (int c = 0; c <= 0x7E; ++c) value[c] = fp8_value(c);
    for (int c = 0; c < 0x7E; ++c) mid[c] = (value[c] + value[c + 1]) / 2;
  }
};

inline const Fp8Table& fp8_table() {
  static const Fp8Table t;
  return t;
}

/// fp32 product of two floats, rounded to nearest even once.
inline float mul_f32(float a, float b) {
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b));
}

/// IEEE fp32 quotient a / b (via double; see file comment).
inline float div_f32(float a, float b) {
  return static_cast<float>(static_cast<double>(a) / static_cast<double>(b));
}

/// C = 1/448 rounded to fp32 (bits 0x3B124925).
inline float inv448() { return static_cast<float>(1.0 / 448.0); }

/// UE8M0 exponent byte of a positive scale s: ceil(log2 s) + 127, clamped to [1, 254].
inline int ue8m0_byte(float s) {
  if (std::isinf(s)) return 254;
  int x = 0;
  const double m = std::frexp(static_cast<double>(s), &x);
  const int ceil_log2 = (m == 0.5) ? x - 1 : x;
  return std::min(254, std::max(1, ceil_log2 + 127));
}

}  // namespace detail

/// SPEC rule 5: fp32 -> fp8 e4m3fn byte, round to nearest even, finite values saturate to
/// +-448, NaN (either sign) -> 0x7F, +Inf -> 0x7E, -Inf -> 0xFE.
inline uint8_t fp8_e4m3(float v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isinf(v)) return static_cast<uint8_t>(sign | 0x7E);
  const double a = std::fabs(static_cast<double>(v));
  const detail::Fp8Table& tb = detail::fp8_table();
  if (a >= tb.value[0x7E]) return static_cast<uint8_t>(sign | 0x7E);
  if (a <= tb.mid[0]) return sign;  // at most half the smallest subnormal (tie -> 0, even)
  // First midpoint >= a: a lies between value[c] and value[c+1] with c = that index.
  const auto it = std::lower_bound(tb.mid.begin(), tb.mid.end(), a);
  int c = static_cast<int>(it - tb.mid.begin());
  if (it != tb.mid.end() && *it == a && (c & 1)) ++c;  // exact tie: the even byte
  return static_cast<uint8_t>(sign | c);
}

/// bf16 bits -> fp32 (exact).
inline float bf16_to_float(uint16_t b) { return detail::float_of(static_cast<uint32_t>(b) << 16); }

/// IEEE binary16 bits -> fp32 (exact; NaN keeps sign and payload).
inline float half_to_float(uint16_t h) {
  const bool neg = (h & 0x8000u) != 0;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 0x1F) {
    return detail::float_of((neg ? 0x80000000u : 0u) | 0x7F800000u |
                            (static_cast<uint32_t>(m) << 13));
  }
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                           : std::ldexp(static_cast<float>(1024 + m), e - 25);
  return neg ? -mag : mag;
}

/// Dense staging results.
struct Result {
  std::vector<uint8_t> x_q;       ///< [T, H] fp8 bytes
  std::vector<uint32_t> sf_words;   ///< [T, H/(4G)] packed UE8M0 words (UE8M0 only)
  std::vector<float> sf_f32;        ///< [T, H/G] fp32 scales (fp32 only)
  std::vector<int64_t> idx;         ///< [T, K]
  std::vector<float> w;             ///< [T, K]
};

/// Stage dense inputs per SPEC.md.
/// @param hidden      row-major fp32 [T, H] (already widened exactly from bf16/fp16)
/// @param ids         row-major int64 [T, K]
/// @param weights     row-major fp32 [T, K]
/// @param is_padding  [T] bytes, nonzero = padded; may be null
/// @param G           group size along H
/// @param ue8m0       UE8M0 scales (else fp32)
inline Result stage(const float* hidden, int64_t T, int64_t H, const int64_t* ids,
                    const float* weights, int64_t K, const uint8_t* is_padding, int64_t G,
                    bool ue8m0) {
  Result r;
  const int64_t groups = H / G;
  r.x_q.resize(static_cast<size_t>(T * H));
  if (ue8m0) {
    r.sf_words.assign(static_cast<size_t>(T * (groups / 4)), 0u);
  } else {
    r.sf_f32.resize(static_cast<size_t>(T * groups));
  }
  r.idx.resize(static_cast<size_t>(T * K));
  r.w.resize(static_cast<size_t>(T * K));
  const float C = detail::inv448();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = hidden + t * H + g * G;
      float amax = 0.0f;
      for (int64_t i = 0; i < G; ++i) {
        if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(x[i]));
      }
      if (amax < 1e-4f) amax = 1e-4f;
      const float s = detail::mul_f32(amax, C);
      float scale = s;
      if (ue8m0) {
        const int e = detail::ue8m0_byte(s);
        scale = std::ldexp(1.0f, e - 127);
        r.sf_words[static_cast<size_t>(t * (groups / 4) + g / 4)] |=
            static_cast<uint32_t>(e) << (8 * (g % 4));
      } else {
        r.sf_f32[static_cast<size_t>(t * groups + g)] = s;
      }
      const float inv = detail::div_f32(1.0f, scale);
      for (int64_t i = 0; i < G; ++i) {
        r.x_q[static_cast<size_t>(t * H + g * G + i)] = fp8_e4m3(detail::mul_f32(x[i], inv));
      }
    }
    const bool pad = is_padding != nullptr && is_padding[t] != 0;
    for (int64_t k = 0; k < K; ++k) {
      r.idx[static_cast<size_t>(t * K + k)] = pad ? -1 : ids[t * K + k];
      r.w[static_cast<size_t>(t * K + k)] = pad ? 0.0f : weights[t * K + k];
    }
  }
  return r;
}

/// SPEC shared_x_sf row of token t for block size bm: tokens of one scheduler block fill
/// 128-row tiles, and inside a tile the 4 x 32 arrangement (quad, lane) is transposed to
/// row lane * 4 + quad.
inline int64_t shared_row(int64_t t, int64_t bm) {
  const int64_t block = t / bm, m = t - block * bm;
  const int64_t padded_bm = ((bm + 127) / 128) * 128;
  const int64_t tile = m / 128, r = m - tile * 128;
  const int64_t quad = r / 32, lane = r - quad * 32;
  return block * padded_bm + tile * 128 + lane * 4 + quad;
}

}  // namespace megamoe_ref
