// scheme.cpp: schemes resolved to the launch table (core::Format), their names, and the
// one output shape rule (include/megamoe/shapes.h).
#include <cmath>
#include <string>

#include "core/checked.h"
#include "formats/recipe.h"
#include "check.h"
#include "megamoe/error.h"
#include "megamoe/quant.h"
#include "megamoe/shapes.h"
#include "scheme.h"

namespace megamoe {
namespace {

const char* elem_name(QuantElem e) {
  switch (e) {
    case QuantElem::kFloat8E4M3: return "fp8_e4m3fn";
    case QuantElem::kFloat8E5M2: return "fp8_e5m2";
    case QuantElem::kInt8: return "int8";
    case QuantElem::kFloat4E2M1: return "fp4_e2m1";
    case QuantElem::kBFloat16: return "bf16";
  }
  return "unknown element type";
}
const char* scale_name(ScaleType s) {
  switch (s) {
    case ScaleType::kUE8M0: return "ue8m0";
    case ScaleType::kFloat32: return "float32";
    case ScaleType::kFloat16: return "float16";
    case ScaleType::kFloat8E4M3: return "fp8_e4m3";
    case ScaleType::kNone: return "none";
  }
  return "unknown scale type";
}
const char* rounding_name(Rounding r) {
  switch (r) {
    case Rounding::kDefault: return "default";
    case Rounding::kNearestEven: return "nearest_even";
    case Rounding::kTiesTowardZero: return "ties_toward_zero";
  }
  return "unknown rounding";
}
const char* scale2_name(Scale2 s) {
  switch (s) {
    case Scale2::kNone: return "none";
    case Scale2::kStatic: return "static";
    case Scale2::kPerToken: return "per_token";
    case Scale2::kOnline: return "online";
  }
  return "unknown";
}

std::string float_text(float f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  return buf;
}

constexpr const char* kSeedScheme =
    "DeepSeek V4 MegaMoE input staging requires symmetric dynamic fp8 per-group quantization "
    "with a group size dividing 128 and E8M0 or fp32 scales, got ";

}  // namespace

bool QuantScheme::operator==(const QuantScheme& o) const noexcept {
  return elem == o.elem && scale == o.scale && group_m == o.group_m && group_k == o.group_k &&
         is_static == o.is_static && symmetric == o.symmetric && scale2 == o.scale2 &&
         rounding == o.rounding && (amax_floor == o.amax_floor || (amax_floor != amax_floor && o.amax_floor != o.amax_floor));
}

std::string to_string(const QuantScheme& q) {
  std::string s = std::string("QuantScheme(") + elem_name(q.elem) + ", scale=" + scale_name(q.scale) +
                  ", group=" + std::to_string(q.group_m) + "x" + std::to_string(q.group_k) + ", " +
                  (q.is_static ? "static" : "dynamic") + ", " + (q.symmetric ? "symmetric" : "asymmetric");
  if (q.scale2 != Scale2::kNone) s += std::string(", scale2=") + scale2_name(q.scale2);
  if (q.rounding != Rounding::kDefault) s += std::string(", rounding=") + rounding_name(q.rounding);
  if (!(q.amax_floor == 1e-4f)) s += ", amax_floor=" + float_text(q.amax_floor);
  return s + ")";
}

namespace detail {

namespace {
/// The format of @p q's codecs, group and second-level scale, with a finite floor that is 0
/// or positive (resolve_format adds the format's own bound on positive floors).
bool resolve_shape(const QuantScheme& q, core::Format* out) {
  const bool common = q.group_m == 1 && q.symmetric && !q.is_static && std::isfinite(q.amax_floor) &&
                      q.amax_floor >= 0.0f;
  if (!common) return false;
  // The first registry row whose codecs, second-level scale, group and tie rule the scheme
  // names (rows that accept Rounding::kDefault come before their other-rule siblings). A
  // row without scales has no groups: group_k 0.
  for (const core::FormatRow& r : core::kFormatRows) {
    const bool group = core::passthrough(r.format) ? q.group_k == 0
                       : q.group_k <= 0            ? false
                       : r.group == 0              ? 128 % q.group_k == 0
                                                   : q.group_k == r.group;
    if (r.qelem == q.elem && r.scale == q.scale && r.s2 == q.scale2 && group &&
        (r.rounds & core::round_bit(q.rounding)) != 0) {
      return *out = r.format, true;
    }
  }
  return false;
}
}  // namespace

bool resolve_format(const QuantScheme& q, core::Format* out) {
  core::Format f;
  // 0 (either sign: the same scheme, the same bytes) selects the unit-scale rule.
  if (!resolve_shape(q, &f) || !(q.amax_floor == 0.0f || q.amax_floor >= core::min_amax_floor(f))) return false;
  return *out = f, true;
}

core::Format format_of(const QuantScheme& q) {
  core::Format f;
  if (resolve_format(q, &f)) return f;
  if (resolve_shape(q, &f)) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("megamoe: hidden_quant: amax_floor: ") + core::format_name(f) +
                    " stores an fp32 scale derived from the floor and needs a floor >= 2^-100 "
                    "(7.88860905e-31), below which a zero group's scale underflows, or a floor of 0 "
                    "(the unit scale); got " +
                    float_text(q.amax_floor) + " in " + to_string(q) + ".");
  }
  if (q.elem == QuantElem::kBFloat16 || q.scale == ScaleType::kNone) {
    throw Error(ErrorCode::kInvalidArgument,
                "megamoe: hidden_quant: bf16 pass-through staging takes bf16 elements without scales "
                "(scale none, group_k 0, group_m 1, scale2 none), dynamic, symmetric, default or "
                "nearest-even rounding, a finite amax_floor that is 0 or positive (ignored); got " +
                    to_string(q) + ".");
  }
  if (q.elem == QuantElem::kFloat4E2M1) {
    throw Error(ErrorCode::kInvalidArgument,
                "megamoe: hidden_quant: fp4 e2m1 staging supports MXFP4 (UE8M0 scales, groups of 1x32) "
                "and NVFP4 (fp8_e4m3 scales, groups of 1x16, ties toward zero, a static or per-token "
                "second-level scale), dynamic, symmetric, with a finite amax_floor that is 0 or positive; got " +
                    to_string(q) + ".");
  }
  throw Error(ErrorCode::kInvalidArgument, kSeedScheme + to_string(q) + ".");
}

}  // namespace detail

std::string scheme_name(const QuantScheme& q) {
  core::Format f;
  if (!detail::resolve_format(q, &f)) return "unsupported";
  // Formats of any group size carry it in the name, but for the OCP MX name of e4m3 with
  // UE8M0 scales over 32 elements.
  std::string n = core::format_name(f);
  if (core::fixed_group_of(f) == 0 && !core::passthrough(f)) {
    const bool mx = core::elem_of(f) == core::Elem::kE4M3 && core::sf_of(f) == core::Sf::kUE8M0x4 && q.group_k == 32;
    n = mx ? "mxfp8" : n + "_g" + std::to_string(q.group_k);
  }
  // Every format but the static second-level scale's and bf16 (no scales) reads the floor.
  if (!(q.amax_floor == 1e-4f) && core::row_of(f).s2 != Scale2::kStatic && !core::passthrough(f)) n += "+floor=" + float_text(q.amax_floor);
  return n;
}

void check_scheme(const QuantScheme& q) { (void)detail::format_of(q); }

std::string TensorSpec::shape_str() const {
  if (ndim == 1) return "(" + std::to_string(shape[0]) + ",)";
  return "(" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + ")";
}

namespace {
TensorSpec spec2(DType dt, int64_t r, int64_t c) {
  TensorSpec s;
  s.dtype = dt;
  s.ndim = 2;
  s.shape[0] = r;
  s.shape[1] = c;
  return s;
}
TensorSpec spec1(DType dt, int64_t n) {
  TensorSpec s;
  s.dtype = dt;
  s.ndim = 1;
  s.shape[0] = n;
  return s;
}
}  // namespace

namespace detail {

OutputShapes output_shapes_of(core::Format f, const QuantScheme& q, int64_t T, int64_t H, int64_t K) {
  OutputShapes o;
  const bool fp4 = core::values_per_byte(f) == 2;
  const DType xq = fp4                                       ? DType::kUInt8
                   : core::elem_of(f) == core::Elem::kE5M2    ? DType::kFloat8E5M2
                   : core::elem_of(f) == core::Elem::kBF16    ? DType::kBFloat16
                                                              : DType::kFloat8E4M3;
  const int64_t G = q.group_k;
  o.x_q = spec2(xq, T, H / core::values_per_byte(f));
  // No scales: x_sf is [T, 0] (the validator also takes no tensor at all).
  o.x_sf = core::passthrough(f)      ? spec2(DType::kFloat32, T, 0)
           : core::packed_scales(f) ? spec2(DType::kInt32, T, H / (4 * G))
                                    : spec2(DType::kFloat32, T, H / G);
  o.topk_idx_out = spec2(DType::kInt64, T, K);
  o.topk_weights_out = spec2(DType::kFloat32, T, K);
  if (core::row_of(f).s2 == Scale2::kPerToken) o.x_scales = spec1(DType::kFloat32, T);
  if (core::global_scaled(f)) o.global_scale = spec1(DType::kFloat32, 1);
  o.global_scale_out = core::online_scaled(f);
  return o;
}

core::Checked shared_sf_rows(int64_t T, int64_t bm) {
  // Checked: a huge bm must not wrap to a small count.
  return T == 0 ? core::Checked(0) : core::ceil_div(T, bm) * core::round_up(bm, 128);
}

}  // namespace detail

OutputShapes output_shapes(int64_t T, int64_t H, int64_t K, const QuantScheme& scheme,
                           std::optional<int64_t> shared_block_m) {
  MEGAMOE_CHECK(T >= 0 && H >= 0 && K >= 0, "output_shapes", "non-negative T, H and K",
                "T=" + std::to_string(T) + " H=" + std::to_string(H) + " K=" + std::to_string(K));
  if (H % 128 != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "DeepSeek V4 MegaMoE input staging requires hidden_size to be a multiple of 128. "
                "(hidden_states: expected hidden_size % 128 == 0, got " + std::to_string(H) + ")");
  }
  const core::Format f = detail::format_of(scheme);
  const int64_t G = scheme.group_k;
  if (core::packed_scales(f)) {
    MEGAMOE_CHECK((H / G) % 4 == 0, "hidden_states",
                  "hidden_size / group_size to be a multiple of 4 (4 scale bytes per int32 word)",
                  std::to_string(H) + " / " + std::to_string(G));
  }
  // Every output's element count must fit in int64 (TensorSpec::numel() multiplies).
  const core::Checked cells = core::Checked(T) * core::Checked(H);
  const core::Checked topk = core::Checked(T) * core::Checked(K);
  if (!cells.ok() || !topk.ok()) {
    throw Error(ErrorCode::kInvalidArgument, "megamoe: output_shapes: T * H and T * K must fit in int64, got T=" +
                                                 std::to_string(T) + " H=" + std::to_string(H) +
                                                 " K=" + std::to_string(K));
  }
  OutputShapes o = detail::output_shapes_of(f, scheme, T, H, K);
  if (shared_block_m) {
    const int64_t bm = *shared_block_m;
    if (core::passthrough(f)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "megamoe: shared_x_sf: bf16 pass-through has no scales to copy for the shared experts "
                  "(they read the bf16 x_q); pass no shared_x_sf / shared_block_m.");
    }
    if (core::sf_of(f) != core::Sf::kUE8M0x4) {
      throw Error(ErrorCode::kInvalidArgument,
                  "DeepSeek V4 MegaMoE shared input staging currently requires UE8M0-packed hidden "
                  "scales. (hidden_quant: expected UE8M0 scales, got " + to_string(scheme) + ")");
    }
    if (bm <= 0) {
      throw Error(ErrorCode::kInvalidArgument, "MegaMoE shared_block_m must be positive. (shared_block_m: expected > 0, got " +
                                                   std::to_string(bm) + ")");
    }
    const core::Checked rows = detail::shared_sf_rows(T, bm);
    if (!rows.ok()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "MegaMoE shared_x_sf has insufficient rows: requires ceil(" + std::to_string(T) + " / " +
                      std::to_string(bm) + ") * align(" + std::to_string(bm) +
                      ", 128) rows, more than int64 can count.");
    }
    if (!(rows * o.x_sf.shape[1]).ok()) {
      throw Error(ErrorCode::kInvalidArgument, "megamoe: output_shapes: shared_x_sf's " + std::to_string(rows.value()) +
                                                   " rows of " + std::to_string(o.x_sf.shape[1]) +
                                                   " words overflow int64");
    }
    o.shared_x_sf = spec2(DType::kInt32, rows.value(), o.x_sf.shape[1]);
  }
  return o;
}

}  // namespace megamoe
