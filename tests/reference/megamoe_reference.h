// megamoe_reference.h: an independent, header-only host reference of SPEC.md's staging math.
//
// Deliberately shares no code with src/core: every rule is written a second way so that a
// mistake in one formulation shows up as a mismatch against the other.
//  - fp8 e4m3fn: the table of all 127 non-negative finite fp8 values, decoded from their
//    bytes; the nearest one is found by comparing |v| (exactly, in double) with the
//    midpoints between neighbours, a tie going to the even byte (even byte == even
//    mantissa). Finite values beyond 448 saturate to 448, NaN -> 0x7F, +-Inf -> 0x7E/0xFE.
//  - fp8 e5m2 (MXFP8 e5m2): the same table method over its 124 non-negative finite values
//    (beyond 57344 saturate to 57344, NaN -> 0x7F, +-Inf -> 0x7B/0xFB).
//  - fp32 products: the exact product of two floats in double (48 significant bits fit
//    in 53), rounded once to float.
//  - 1/scale: double division rounded to float; double rounding is innocuous for a
//    quotient of two floats because 53 >= 2*24 + 2 (Figueroa), so this equals the IEEE
//    fp32 quotient.
//  - UE8M0: ceil(log2 s) from std::frexp (s = m * 2^x, m in [0.5, 1): ceil is x - 1 when
//    m == 0.5, else x), + 127, clamped to [1, 254]; +Inf gives 254.
//  - fp16 widening by ldexp of the integer significand.
//  - fp4 e2m1: the grid of the 8 non-negative values decoded from their codes and its 7
//    midpoints; the code counts the midpoints |v| strictly exceeds (exactly, in double),
//    and the nearest-even rule moves an exact tie up when that count is odd.
//  - MXFP4 UE8M0: the smallest k with 6 * 2^k >= amax (exact in double: no quotient is
//    formed), + 127, clamped to [1, 254]; +Inf gives 254.
//  - NVFP4 e4m3 scale bytes: the fp8 table above (NaN -> 0x7F, beyond 448 -> 0x7E), and
//    the byte decoded back through the same table; its quotients and products are IEEE
//    fp32 operations formed in double as above.
//  - non-finite elements: the exponent field of the widened fp32 is all ones.
//  - bf16 pass-through: bf16 input bits as they are; fp32 (and fp16, widened) to the
//    nearest bf16 found in double: the multiple of the binade's quantum (2^(e-8), or 2^-133
//    below 2^-126) at or below |v| and the next one up, the nearer taken, a tie going to the
//    even multiple; 2^128 or more is Inf (IEEE overflow); every NaN 0x7FC0 (torch's CPU rule).
//  - amax floor 0 (the unit scale): UE8M0 formats give byte 127 to a group whose amax is
//    0; fp32 scales whose reciprocal, formed in double and narrowed, is infinite are 1;
//    NVFP4 per-token rows whose amax is below 2^-100 (ldexp) get pts = 1.
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

/// Value of the non-negative fp8 e5m2 byte c in [0, 0x7B].
inline double e5m2_value(int c) {
  const int e = c >> 2, m = c & 3;
  return e == 0 ? std::ldexp(static_cast<double>(m), -16)       // subnormal: m * 2^-16
                : std::ldexp(static_cast<double>(4 + m), e - 17);  // (1 + m/4) * 2^(e-15)
}

/// The 124 non-negative finite e5m2 values (index = byte) and the 123 midpoints.
struct E5m2Table {
  std::array<double, 124> value;
  std::array<double, 123> mid;
  E5m2Table() {
    for (int c = 0; c <= 0x7B; ++c) value[c] = e5m2_value(c);
    for (int c = 0; c < 0x7B; ++c) mid[c] = (value[c] + value[c + 1]) / 2;
  }
};

inline const E5m2Table& e5m2_table() {
  static const E5m2Table t;
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
/// 1/57344 rounded to fp32 (e5m2's largest value; DeepGEMM-style amax / max).
inline float inv57344() { return static_cast<float>(1.0 / 57344.0); }

/// UE8M0 exponent byte of a scale s >= 0: ceil(log2 s) + 127, clamped to [1, 254]. A zero
/// s (a subnormal amax floor times 1/448 underflows) has log2 = -Inf: byte 1 (frexp would
/// report exponent 0 for it, as if s were 1).
inline int ue8m0_byte(float s) {
  if (std::isinf(s)) return 254;
  if (s == 0.0f) return 1;
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

/// fp32 -> fp8 e5m2 byte, round to nearest even, finite values saturate to +-57344, NaN
/// (either sign) -> 0x7F, +Inf -> 0x7B, -Inf -> 0xFB (PTX cvt.rn.satfinite.e5m2x2.f32).
inline uint8_t fp8_e5m2(float v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isinf(v)) return static_cast<uint8_t>(sign | 0x7B);
  const double a = std::fabs(static_cast<double>(v));
  const detail::E5m2Table& tb = detail::e5m2_table();
  if (a >= tb.value[0x7B]) return static_cast<uint8_t>(sign | 0x7B);
  if (a <= tb.mid[0]) return sign;  // at most half the smallest subnormal (tie -> 0, even)
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

/// Value of the non-negative fp4 e2m1 code c in [0, 7]: exponent field c >> 1, mantissa
/// bit c & 1, bias 1 (subnormal when the exponent field is 0).
inline double fp4_value(int c) {
  const int e = c >> 1, m = c & 1;
  return e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
}

namespace detail {

/// The 7 midpoints between consecutive e2m1 values (exact in double):
/// 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0.
struct Fp4Table {
  std::array<double, 7> mid;
  Fp4Table() {
    for (int c = 0; c < 7; ++c) mid[c] = (fp4_value(c) + fp4_value(c + 1)) / 2;
  }
};

inline const Fp4Table& fp4_table() {
  static const Fp4Table t;
  return t;
}

/// Whether fp32 v is NaN or +-Inf, read from its exponent field alone.
inline bool nonfinite(float v) { return (bits_of(v) & 0x7F800000u) == 0x7F800000u; }

/// MXFP4 UE8M0 exponent byte of a floored group amax: 127 + the smallest k with
/// 6 * 2^k >= amax, i.e. ceil(log2(amax / 6)) without forming the quotient; clamped to
/// [1, 254]; +Inf gives 254.
inline int fp4_ue8m0_byte(float amax) {
  if (std::isinf(amax)) return 254;
  if (amax == 0.0f) return 1;  // log2 0 = -Inf (ilogb(0) has no exponent to start from)
  const double a = amax;
  int k = std::ilogb(a) - 3;  // 6 * 2^k = 0.75 * 2^ilogb(a) < a: a lower start
  while (std::ldexp(6.0, k) < a) ++k;
  return std::min(254, std::max(1, k + 127));
}

/// Value of an fp8 e4m3fn byte with either sign (0x7F / 0xFF: NaN).
inline float fp8_decode(uint8_t b) {
  if ((b & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  const float mag = static_cast<float>(fp8_table().value[b & 0x7F]);
  return (b & 0x80) ? -mag : mag;
}

/// Largest |x| over n values, NaN skipped (like fmaxf); 0 for none.
inline float amax_of(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

}  // namespace detail

/// Tie rule of the e2m1 encoding.
enum class Fp4Ties {
  kTowardZero,   ///< ttz: DeepGEMM's per_token_cast_to_fp4 (sign only on a nonzero code)
  kNearestEven,  ///< rne: PTX cvt.rn.satfinite.e2m1x2 (sign always kept, NaN -> 0x7)
};

/// SPEC "Activation formats": fp32 -> e2m1 nibble (sign << 3 | code).
///  ttz: code = number of midpoints |v| strictly exceeds; sign only when code != 0; NaN -> 0.
///  rne: nearest on the grid, an exact tie to the even code, saturating at 6; the sign is
///       always kept (-0.0 -> 0x8); NaN (either sign) -> 0x7.
inline uint8_t fp4_e2m1(float v, Fp4Ties ties) {
  const bool rne = ties == Fp4Ties::kNearestEven;
  if (std::isnan(v)) return rne ? 0x7 : 0x0;
  const double a = std::fabs(static_cast<double>(v));
  const std::array<double, 7>& mid = detail::fp4_table().mid;
  int code = 0;
  while (code < 7 && a > mid[code]) ++code;  // +Inf exceeds all seven: 6 (saturation)
  if (rne && code < 7 && a == mid[code] && (code & 1)) ++code;  // tie between code, code+1
  const bool neg = std::signbit(v);
  if (rne) return static_cast<uint8_t>((neg ? 0x8 : 0x0) | code);
  return static_cast<uint8_t>((neg && code != 0 ? 0x8 : 0x0) | code);
}

/// Codec of the element values.
enum class Elem { kFp8E4M3, kFp8E5M2, kFp4E2M1 };
/// Codec of the group scales (and where the second-level scale comes from).
enum class ScaleCodec {
  kUe8m0,          ///< power-of-two exponent bytes, four per int32 word
  kFp32,           ///< the fp32 scale itself
  kE4m3Static,     ///< NVFP4: e4m3 bytes four per word, caller's global scale
  kE4m3PerToken,   ///< NVFP4: e4m3 bytes four per word, per-token scale (x_scales)
  kE4m3Online,     ///< NVFP4: e4m3 bytes four per word, global scale from the whole tensor
};

/// One activation format of SPEC.md (what the reference needs of a scheme).
struct Format {
  Elem elem = Elem::kFp8E4M3;
  ScaleCodec scale = ScaleCodec::kUe8m0;
  int64_t G = 32;                       ///< group size along H
  float amax_floor = 1e-4f;             ///< group floor (fp8, MXFP4); row floor (NVFP4 per-token); tensor floor (online)
  Fp4Ties ties = Fp4Ties::kTowardZero;  ///< e2m1 tie rule
  float global_scale = 1.0f;            ///< gs of NVFP4 static

  bool fp4() const { return elem == Elem::kFp4E2M1; }
  /// Scales are bytes packed four per int32 word (UE8M0 and e4m3).
  bool packed_scales() const { return scale != ScaleCodec::kFp32; }
  /// Columns of x_q (bytes): two e2m1 values per byte.
  int64_t q_cols(int64_t H) const { return fp4() ? H / 2 : H; }
  /// Columns of x_sf: words of four scale bytes, or one fp32 per group.
  int64_t sf_cols(int64_t H) const { return packed_scales() ? H / (4 * G) : H / G; }

  static Format fp8(bool ue8m0, int64_t G, float floor = 1e-4f) {
    Format f;
    f.scale = ue8m0 ? ScaleCodec::kUe8m0 : ScaleCodec::kFp32;
    f.G = G;
    f.amax_floor = floor;
    return f;
  }
  /// MXFP8 with e5m2 values: UE8M0 scales from amax / 57344, G = 32.
  static Format mxfp8_e5m2(float floor = 1e-4f) {
    Format f = fp8(true, 32, floor);
    f.elem = Elem::kFp8E5M2;
    return f;
  }
  static Format mxfp4(Fp4Ties ties, float floor = 1e-4f) {
    Format f;
    f.elem = Elem::kFp4E2M1;
    f.ties = ties;
    f.amax_floor = floor;
    return f;
  }
  /// NVFP4 with the caller's global scale gs (no amax floor: SPEC says so).
  static Format nvfp4_static(float gs) {
    Format f = fp4_g16();
    f.scale = ScaleCodec::kE4m3Static;
    f.global_scale = gs;
    return f;
  }
  /// NVFP4 with a global scale computed from the whole tensor; @p floor bounds its amax.
  static Format nvfp4_online(float floor = 1e-4f) {
    Format f = fp4_g16();
    f.scale = ScaleCodec::kE4m3Online;
    f.amax_floor = floor;
    return f;
  }
  /// NVFP4 with per-token scales; @p floor bounds each row's amax.
  static Format nvfp4_per_token(float floor = 1e-4f) {
    Format f = fp4_g16();
    f.scale = ScaleCodec::kE4m3PerToken;
    f.amax_floor = floor;
    return f;
  }

 private:
  static Format fp4_g16() {  // e2m1 values in groups of 16
    Format f;
    f.elem = Elem::kFp4E2M1;
    f.G = 16;
    return f;
  }
};

/// Dense staging results.
struct Result {
  std::vector<uint8_t> x_q;       ///< [T, H] fp8 bytes, or [T, H/2] packed e2m1 bytes
  std::vector<uint32_t> sf_words;   ///< [T, H/(4G)] packed UE8M0 / e4m3 words
  std::vector<float> sf_f32;        ///< [T, H/G] fp32 scales (fp32 only)
  std::vector<float> x_scales;      ///< [T] per-token second-level scales (NVFP4 per-token)
  float global_scale = 0.0f;        ///< gs the call writes (NVFP4 online; T > 0)
  int64_t nonfinite = 0;            ///< NaN and +-Inf elements of hidden (all T rows)
  std::vector<int64_t> idx;         ///< [T, K]
  std::vector<float> w;             ///< [T, K]
};

namespace detail {

/// SPEC "Scale and value": fp8 e4m3 values of group x[0..G) with UE8M0 or fp32 scale;
/// returns the scale byte (UE8M0) and writes the fp32 scale to *s_out (fp32).
inline int fp8_group(const float* x, int64_t G, bool ue8m0, float floor, float* s_out,
                     uint8_t* q, bool e5m2 = false) {
  const float amax = std::max(amax_of(x, G), floor);
  const float s = mul_f32(amax, e5m2 ? inv57344() : inv448());
  float scale = s;
  int e = 0;
  if (ue8m0) {
    // Floor 0: a group whose amax is 0 has the unit scale 2^0.
    e = floor == 0.0f && amax == 0.0f ? 127 : ue8m0_byte(s);
    scale = std::ldexp(1.0f, e - 127);
  } else if (floor == 0.0f && std::isinf(div_f32(1.0f, s))) {
    scale = 1.0f;  // floor 0: a scale without a finite reciprocal (0 included) becomes 1
  }
  *s_out = ue8m0 ? s : scale;
  const float inv = div_f32(1.0f, scale);
  for (int64_t i = 0; i < G; ++i) q[i] = e5m2 ? fp8_e5m2(mul_f32(x[i], inv)) : fp8_e4m3(mul_f32(x[i], inv));
  return e;
}

/// SPEC MXFP4: e2m1 nibbles of group x[0..32); returns the UE8M0 byte.
inline int mxfp4_group(const float* x, int64_t G, float floor, Fp4Ties ties, uint8_t* nib) {
  const float amax = std::max(amax_of(x, G), floor);
  const int e = floor == 0.0f && amax == 0.0f ? 127 : fp4_ue8m0_byte(amax);  // floor 0: unit scale
  for (int64_t i = 0; i < G; ++i) {
    // x * 2^(127 - e) is exact in double; narrowing it to float rounds only results
    // below 2^-126 (e = 254 from an Inf amax), which encode as code 0 either way.
    nib[i] = fp4_e2m1(static_cast<float>(std::ldexp(static_cast<double>(x[i]), 127 - e)), ties);
  }
  return e;
}

/// SPEC NVFP4 static: e4m3 scale byte of group x[0..16) and its ttz nibbles.
/// The clamp to [2^-9, 448] takes a NaN quotient (amax = 0 with gs = 0) to 2^-9, the
/// fminf/fmaxf reading; SPEC leaves that case open.
inline uint8_t nvfp4_static_group(const float* x, int64_t G, float gs, uint8_t* nib) {
  const float q = div_f32(amax_of(x, G), mul_f32(6.0f, gs));
  const float lo = std::ldexp(1.0f, -9), hi = 448.0f;
  const float clamped = std::isnan(q) ? lo : std::min(hi, std::max(lo, q));
  const uint8_t sf = fp8_e4m3(clamped);
  const float d = mul_f32(fp8_decode(sf), gs);
  for (int64_t i = 0; i < G; ++i) nib[i] = fp4_e2m1(div_f32(x[i], d), Fp4Ties::kTowardZero);
  return sf;
}

/// SPEC NVFP4 per-token: e4m3 scale byte of group x[0..16) under the token scale pts.
inline uint8_t nvfp4_token_group(const float* x, int64_t G, float pts, uint8_t* nib) {
  const uint8_t sf = fp8_e4m3(div_f32(amax_of(x, G), mul_f32(6.0f, pts)));
  const float sfv = fp8_decode(sf);  // NaN for 0x7F: "sf > 0" fails, inv = 0
  const float inv = sfv > 0.0f ? div_f32(1.0f, mul_f32(sfv, pts)) : 0.0f;
  for (int64_t i = 0; i < G; ++i) nib[i] = fp4_e2m1(mul_f32(x[i], inv), Fp4Ties::kTowardZero);
  return sf;
}

}  // namespace detail

/// Stage dense inputs per SPEC.md in format @p f.
/// @param hidden      row-major fp32 [T, H] (already widened exactly from bf16/fp16)
/// @param ids         row-major int64 [T, K]
/// @param weights     row-major fp32 [T, K]
/// @param is_padding  [T] bytes, nonzero = padded; may be null
inline Result stage(const float* hidden, int64_t T, int64_t H, const int64_t* ids,
                    const float* weights, int64_t K, const uint8_t* is_padding,
                    const Format& f) {
  Result r;
  const int64_t G = f.G, groups = H / G, qc = f.q_cols(H), sc = f.sf_cols(H);
  r.x_q.assign(static_cast<size_t>(T * qc), 0);
  if (f.packed_scales()) {
    r.sf_words.assign(static_cast<size_t>(T * sc), 0u);
  } else {
    r.sf_f32.resize(static_cast<size_t>(T * sc));
  }
  if (f.scale == ScaleCodec::kE4m3PerToken) r.x_scales.resize(static_cast<size_t>(T));
  r.idx.resize(static_cast<size_t>(T * K));
  r.w.resize(static_cast<size_t>(T * K));
  std::vector<uint8_t> q(static_cast<size_t>(G));
  float gs = f.global_scale;
  if (f.scale == ScaleCodec::kE4m3Online) {
    // SPEC NVFP4 online: A = max |x| over every element (NaN skipped, Inf counts), then
    // the per-token rule on A; the groups are static's under it.
    const float a = std::max(detail::amax_of(hidden, T * H), f.amax_floor);
    gs = f.amax_floor == 0.0f && a < std::ldexp(1.0f, -100) ? 1.0f : detail::div_f32(a, 2688.0f);
    r.global_scale = gs;
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* row = hidden + t * H;
    for (int64_t h = 0; h < H; ++h) r.nonfinite += detail::nonfinite(row[h]) ? 1 : 0;
    float pts = 0.0f;
    if (f.scale == ScaleCodec::kE4m3PerToken) {
      const float ra = std::max(detail::amax_of(row, H), f.amax_floor);
      // Floor 0: a row below 2^-100 (the smallest positive floor of this format) has pts 1.
      pts = f.amax_floor == 0.0f && ra < std::ldexp(1.0f, -100) ? 1.0f : detail::div_f32(ra, 2688.0f);
      r.x_scales[static_cast<size_t>(t)] = pts;
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = row + g * G;
      int byte = 0;  // the group's packed scale byte (UE8M0 or e4m3)
      if (f.elem != Elem::kFp4E2M1) {
        float s = 0.0f;
        byte = detail::fp8_group(x, G, f.scale == ScaleCodec::kUe8m0, f.amax_floor, &s, q.data(),
                                 f.elem == Elem::kFp8E5M2);
        if (!f.packed_scales()) r.sf_f32[static_cast<size_t>(t * sc + g)] = s;
      } else if (f.scale == ScaleCodec::kUe8m0) {
        byte = detail::mxfp4_group(x, G, f.amax_floor, f.ties, q.data());
      } else if (f.scale == ScaleCodec::kE4m3Static || f.scale == ScaleCodec::kE4m3Online) {
        byte = detail::nvfp4_static_group(x, G, gs, q.data());
      } else {
        byte = detail::nvfp4_token_group(x, G, pts, q.data());
      }
      if (f.packed_scales()) {
        r.sf_words[static_cast<size_t>(t * sc + g / 4)] |= static_cast<uint32_t>(byte) << (8 * (g % 4));
      }
      for (int64_t i = 0; i < G; ++i) {
        const int64_t h = g * G + i;
        if (!f.fp4()) {
          r.x_q[static_cast<size_t>(t * qc + h)] = q[static_cast<size_t>(i)];
        } else {  // column 2j -> low nibble of byte j, column 2j+1 -> high nibble
          r.x_q[static_cast<size_t>(t * qc + h / 2)] |=
              static_cast<uint8_t>(q[static_cast<size_t>(i)] << (4 * (h % 2)));
        }
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

/// Stage dense inputs in an fp8 format (the original entry point).
/// @param G      group size along H
/// @param ue8m0  UE8M0 scales (else fp32)
inline Result stage(const float* hidden, int64_t T, int64_t H, const int64_t* ids,
                    const float* weights, int64_t K, const uint8_t* is_padding, int64_t G,
                    bool ue8m0) {
  return stage(hidden, T, H, ids, weights, K, is_padding, Format::fp8(ue8m0, G));
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

/// bf16 pass-through of an fp32 value (see the file comment): bits of the nearest bf16,
/// ties to even, NaN -> 0x7FC0.
inline uint16_t bf16_rne(float v) {
  if (std::isnan(v)) return 0x7FC0;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isinf(v)) return static_cast<uint16_t>(sign | 0x7F80);
  const double a = std::fabs(static_cast<double>(v));
  if (a == 0.0) return sign;
  int e = 0;
  (void)std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): 8 significant bits -> quantum 2^(e-8)
  const double q = std::ldexp(1.0, std::max(e - 8, -133));
  const double n = std::floor(a / q);  // exact: a / q is a and q's exponents apart
  const double lo = n * q, hi = (n + 1) * q;
  double r;
  if (a - lo < hi - a) r = lo;
  else if (a - lo > hi - a) r = hi;
  else r = std::fmod(n, 2.0) == 0.0 ? lo : hi;
  if (r >= std::ldexp(1.0, 128)) return static_cast<uint16_t>(sign | 0x7F80);
  const uint32_t bits = detail::bits_of(static_cast<float>(r));  // r is a bf16 value: exact
  return static_cast<uint16_t>(sign | (bits >> 16));
}

/// bf16 pass-through of fp16 bits: exact widening, then bf16_rne.
inline uint16_t bf16_rne_half(uint16_t h) { return bf16_rne(half_to_float(h)); }

}  // namespace megamoe_ref
