// format_list.h: the registry of activation formats, one row each. It is the only list of
// formats: the Format enum, the codecs and traits below, the scheme -> format resolution
// (src/scheme.cpp) and the one switch on a format (visit_format, formats/visit.h) are all
// generated from it, so a format cannot lack a row and a row cannot lack a case. A row's
// recipe (scale and value math) lives in its folder: formats/fp8/, formats/mxfp4/,
// formats/nvfp4/ (formats/recipe.h gathers them); docs/DESIGN.md "Adding a format".
//
// Columns:
//   name     the format's name in plans and messages
//   elem     element codec (Elem): e4m3, e5m2, e2m1, bf16 (pass-through: no scales)
//   qelem    the public QuantElem a scheme names
//   rounds   the Rounding values a scheme may give (kDefault is the codec's own rule)
//   sf       scale codec (Sf): UE8M0 or e4m3 bytes packed four per int32, fp32, or none
//   scale    the public ScaleType a scheme names
//   s2       second-level scale (Scale2): none, static, per token, online (one for the
//            tensor, computed by the call: its groups are the static row's, nvfp4/recipe.h)
//   group    the group size G it fixes (0: any G dividing 128; a row without scales has no
//            groups and takes group_k == 0)
//   fast     the fast kernel's group sizes, a bit per G (kG16 | kG32 | kG128; 0: none)
//   floor    the smallest positive amax floor the format accepts (0 is accepted by every
//            format: the unit scale below)
//
// bf16 is the row without scales (FlashInfer's Bf16InputStage; DeepGEMM's NVFP4 shared
// experts read bf16): x_q is [T, H] bf16, bf16 input copied bit for bit, fp16 and fp32
// rounded to nearest even with every NaN 0x7FC0 (c10::BFloat16's scalar rule, formats/bf16/codec.h),
// x_sf empty; it reads no floor (any finite floor >= 0 is accepted and ignored, as NVFP4
// static's) and has no group math: the backends' copy paths take it (passthrough()).
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "megamoe/quant.h"

namespace megamoe {
namespace core {

/// Element codecs.
enum class Elem : uint8_t { kE4M3, kE5M2, kE2M1, kBF16 };
/// Scale codecs.
enum class Sf : uint8_t { kUE8M0x4, kE4M3x4, kFp32, kNone };

/// Group sizes of the fast kernel, one bit each (the "fast" column).
constexpr uint32_t kG16 = 1u << 0, kG32 = 1u << 1, kG128 = 1u << 2;
/// The Rounding values a row accepts, one bit each (the "rounds" column).
/// (A value outside the enum, which a caller's raw bytes can hold, has no bit: no row accepts it.)
MEGAMOE_HD constexpr uint32_t round_bit(Rounding r) {
  return static_cast<uint32_t>(r) < 32u ? 1u << static_cast<uint32_t>(r) : 0u;
}
constexpr uint32_t kRoundFp8 = round_bit(Rounding::kDefault) | round_bit(Rounding::kNearestEven);
constexpr uint32_t kRoundTtz = round_bit(Rounding::kDefault) | round_bit(Rounding::kTiesTowardZero);
constexpr uint32_t kRoundRne = round_bit(Rounding::kNearestEven);

/// Formats that store an fp32 scale derived from the floor (fp8 with fp32 scales: s =
/// floor / 448; NVFP4 per-token: pts = floor / 2688 and each group's sf * pts, sf >= 2^-9)
/// need positive floors from 2^-100 up: there every such scale is a normal fp32 (>= 2^-126
/// after the divisions) with a finite reciprocal, so a zero group encodes as zero codes with
/// a nonzero scale. Below ~3e-43 the scale underflows to zero and a zero group's codes
/// become NaN (0 * (1 / 0)). The UE8M0 formats clamp their exponent byte to >= 1 and accept
/// any positive floor; NVFP4 static reads no floor.
constexpr float kMinFp32ScaleFloor = 0x1p-100f;

// A floor of 0 (FlashInfer's `amax > 0 ? amax / 448 : 1`) is accepted by every format and
// gives the unit scale where the scale would otherwise have none (docs/CONTRACT.md "Amax
// floor 0"): a UE8M0 group whose amax is 0 (byte kUe8m0Unit, multiplier 1); an fp32 scale
// s <= kFp32ScaleNoRecip, exactly those whose reciprocal overflows, 0 included (scale and
// multiplier 1); an NVFP4 per-token row whose amax is below kMinFp32ScaleFloor (pts 1, so
// that every other row has floor 2^-100's scales); an NVFP4 online tensor whose amax is
// below kMinFp32ScaleFloor (gs 1).
//
// NVFP4 online (kNvfp4Online): e2m1 values with ties toward zero, e4m3 scale bytes packed
// four per int32, G = 16, floors as per-token's; gs = fl(max(A, floor) / 2688), A the
// NaN-ignoring max |x| over all T x H elements (padded rows included, +-Inf counts as Inf,
// an all-NaN tensor has A = 0), written to global_scale (an output for this row); every
// group is then NVFP4 static's under gs, the bytes of kNvfp4Static called with it. The recipes test `floor == 0` first:
// a kernel with its floor compiled in drops the select, and no positive floor reaches it.
constexpr uint32_t kUe8m0Unit = 127;            ///< UE8M0 byte of the unit scale 2^0
constexpr float kFp32ScaleNoRecip = 0x1p-128f;  ///< fl(1 / s) = +Inf exactly for 0 <= s <= this

// clang-format off
//   Enum            name               elem  qelem        rounds     sf        scale        s2         group fast          floor
#define MEGAMOE_FORMAT_LIST(X)                                                                                                        \
  X(kFp8Ue8m0,      "fp8_ue8m0",       kE4M3, kFloat8E4M3, kRoundFp8, kUE8M0x4, kUE8M0,      kNone,     0,    kG32 | kG128, 0.0f) \
  X(kFp8Fp32,       "fp8_fp32",        kE4M3, kFloat8E4M3, kRoundFp8, kFp32,    kFloat32,    kNone,     0,    kG32 | kG128, kMinFp32ScaleFloor) \
  X(kMxfp4,         "mxfp4",           kE2M1, kFloat4E2M1, kRoundTtz, kUE8M0x4, kUE8M0,      kNone,     32,   kG32,         0.0f) \
  X(kMxfp4Rne,      "mxfp4_rne",       kE2M1, kFloat4E2M1, kRoundRne, kUE8M0x4, kUE8M0,      kNone,     32,   kG32,         0.0f) \
  X(kNvfp4Static,   "nvfp4_static",    kE2M1, kFloat4E2M1, kRoundTtz, kE4M3x4,  kFloat8E4M3, kStatic,   16,   kG16,         0.0f) \
  X(kNvfp4PerToken, "nvfp4_per_token", kE2M1, kFloat4E2M1, kRoundTtz, kE4M3x4,  kFloat8E4M3, kPerToken, 16,   0,            kMinFp32ScaleFloor) \
  X(kMxfp8E5m2,     "mxfp8_e5m2",      kE5M2, kFloat8E5M2, kRoundFp8, kUE8M0x4, kUE8M0,      kNone,     32,   kG32,         0.0f) \
  X(kBf16,          "bf16",            kBF16, kBFloat16,   kRoundFp8, kNone,    kNone,       kNone,     0,    0,            0.0f) \
  X(kNvfp4Online,   "nvfp4_online",    kE2M1, kFloat4E2M1, kRoundTtz, kE4M3x4,  kFloat8E4M3, kOnline,   16,   0,            kMinFp32ScaleFloor)
// clang-format on

/// The launch table: one enumerator per row.
enum class Format : uint8_t {
#define MEGAMOE_FORMAT_ENUM(E, ...) E,
  MEGAMOE_FORMAT_LIST(MEGAMOE_FORMAT_ENUM)
#undef MEGAMOE_FORMAT_ENUM
};

/// One row of the registry as a value.
struct FormatRow {
  Format format = Format{};
  const char* name = "";
  Elem elem = Elem::kE4M3;
  QuantElem qelem = QuantElem::kFloat8E4M3;
  uint32_t rounds = 0;
  Sf sf = Sf::kFp32;
  ScaleType scale = ScaleType::kFloat32;
  Scale2 s2 = Scale2::kNone;
  int group = 0;
  uint32_t fast = 0;
  float floor = 0.0f;
};

/// The row of @p f (a generated switch: usable in device code, unlike a table).
MEGAMOE_HD constexpr FormatRow row_of(Format f) {
  switch (f) {
#define MEGAMOE_FORMAT_CASE(E, name, elem, qelem, rounds, sf, scale, s2, group, fast, floor) \
  case Format::E:                                                                          \
    return FormatRow{Format::E, name, Elem::elem, QuantElem::qelem, rounds, Sf::sf, ScaleType::scale, Scale2::s2, group, fast, floor};
    MEGAMOE_FORMAT_LIST(MEGAMOE_FORMAT_CASE)
#undef MEGAMOE_FORMAT_CASE
  }
  return FormatRow{};
}

/// Every row, in enum order (host code: scheme resolution walks them).
constexpr FormatRow kFormatRows[] = {
#define MEGAMOE_FORMAT_ROW(E, ...) row_of(Format::E),
    MEGAMOE_FORMAT_LIST(MEGAMOE_FORMAT_ROW)
#undef MEGAMOE_FORMAT_ROW
};

MEGAMOE_HD constexpr Elem elem_of(Format f) { return row_of(f).elem; }
MEGAMOE_HD constexpr Sf sf_of(Format f) { return row_of(f).sf; }
/// e2m1 ties toward zero (every e2m1 row whose rule is not nearest even).
MEGAMOE_HD constexpr bool ttz_of(Format f) {
  return elem_of(f) == Elem::kE2M1 && (row_of(f).rounds & round_bit(Rounding::kNearestEven)) == 0;
}
/// The group size a format fixes (0: any G dividing 128).
MEGAMOE_HD constexpr int fixed_group_of(Format f) { return row_of(f).group; }
/// No scales and no group math: x_q is a copy of the input as bf16 (the bf16 row). Every
/// per-group trait below is false or unused for it; the backends branch on this first.
MEGAMOE_HD constexpr bool passthrough(Format f) { return sf_of(f) == Sf::kNone; }
/// Scale bytes packed four per int32 word (UE8M0 and e4m3 scales).
MEGAMOE_HD constexpr bool packed_scales(Format f) { return sf_of(f) == Sf::kUE8M0x4 || sf_of(f) == Sf::kE4M3x4; }
/// Values per element of x_q (fp4: two per byte; every other row one per element).
MEGAMOE_HD constexpr int values_per_byte(Format f) { return elem_of(f) == Elem::kE2M1 ? 2 : 1; }
/// An fp8 element codec (e4m3 or e5m2): one byte a value, UE8M0 or fp32 scales from amax.
MEGAMOE_HD constexpr bool fp8_elem(Format f) { return elem_of(f) == Elem::kE4M3 || elem_of(f) == Elem::kE5M2; }
constexpr const char* format_name(Format f) { return row_of(f).name; }
/// The smallest positive amax floor the format accepts (kMinFp32ScaleFloor above); 0 is
/// accepted by every format.
constexpr float min_amax_floor(Format f) { return row_of(f).floor; }
/// The fast kernel has a variant for format @p f with group size @p G.
constexpr bool fast_group(Format f, int64_t G) {
  const uint32_t bit = G == 16 ? kG16 : G == 32 ? kG32 : G == 128 ? kG128 : 0u;
  return (row_of(f).fast & bit) != 0u;
}
/// The row kernel (a whole row's amax before any group) is the per-token scale's.
MEGAMOE_HD constexpr bool row_scaled(Format f) { return row_of(f).s2 == Scale2::kPerToken; }
/// NVFP4 online (kNvfp4Online): a global scale from the whole tensor's amax, written to
/// global_scale, after which every group is NVFP4 static's under it. Backends compute gs,
/// then stage the call as staged_format(f) reading gs back from global_scale, so no
/// kernel has a variant of its own for it (the "fast" column is empty: nothing launches
/// with this row).
MEGAMOE_HD constexpr bool online_scaled(Format f) { return row_of(f).s2 == Scale2::kOnline; }
/// The row whose kernels stage the groups of @p f (the static row for NVFP4 online).
MEGAMOE_HD constexpr Format staged_format(Format f) { return online_scaled(f) ? Format::kNvfp4Static : f; }
/// The recipe reads a global scale (static, or online once computed).
MEGAMOE_HD constexpr bool global_scaled(Format f) {
  return row_of(f).s2 == Scale2::kStatic || row_of(f).s2 == Scale2::kOnline;
}

}  // namespace core
}  // namespace megamoe
