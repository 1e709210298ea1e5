// validate.cpp: every argument check of SPEC.md, run before any backend writes a byte.
#include "validate.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/layout.h"
#include "megamoe/error.h"

namespace megamoe {
namespace detail {
namespace {

constexpr const char* kSeedHidden128 =
    "DeepSeek V4 MegaMoE input staging requires hidden_size to be a multiple of 128.";
constexpr const char* kSeedTopkShape =
    "DeepSeek V4 MegaMoE input staging requires topk_weights and topk_ids to have the same "
    "shape.";
constexpr const char* kSeedSharedPair =
    "DeepSeek V4 MegaMoE shared input staging requires both shared_x_sf and shared_block_m.";
constexpr const char* kSeedSharedUe8m0 =
    "DeepSeek V4 MegaMoE shared input staging currently requires UE8M0-packed hidden scales.";
constexpr const char* kSeedSharedBm = "MegaMoE shared_block_m must be positive.";

template <typename E, typename A>
[[noreturn]] void fail(const char* context, const char* tensor, const E& e, const A& a) {
  check_failed(ErrorCode::kInvalidArgument, context, tensor, e, a);
}

std::string dims(int64_t a, int64_t b) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

void check_rank(const TensorRef& t, const char* name, int rank) {
  MEGAMOE_CHECK(t.ndim == rank, name, std::to_string(rank) + "-D tensor",
                std::to_string(t.ndim) + "-D tensor");
  for (int d = 0; d < rank; ++d) {
    MEGAMOE_CHECK(t.shape[d] >= 0, name, "non-negative sizes", t.shape_str());
  }
}

void check_dtype(const TensorRef& t, const char* name, std::initializer_list<DType> ok) {
  if (std::find(ok.begin(), ok.end(), t.dtype) != ok.end()) return;
  std::string exp;
  for (DType d : ok) exp += (exp.empty() ? "" : " or ") + std::string(dtype_name(d));
  fail(nullptr, name, "dtype " + exp, std::string("dtype ") + dtype_name(t.dtype));
}

void check_shape2(const TensorRef& t, const char* name, int64_t r, int64_t c) {
  check_rank(t, name, 2);
  MEGAMOE_CHECK(t.shape[0] == r && t.shape[1] == c, name, "shape " + dims(r, c),
                "shape " + t.shape_str());
}

void check_data(const TensorRef& t, const char* name) {
  MEGAMOE_CHECK(t.numel() == 0 || t.data != nullptr, name, "a non-null data pointer", "nullptr");
}

/// Outputs: distinct elements must have distinct addresses (no zero or aliasing strides).
void check_no_self_overlap(const TensorRef& t, const char* name) {
  std::vector<std::pair<int64_t, int64_t>> d;  // (|stride|, size) of dims with size > 1
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] > 1) d.emplace_back(std::llabs(t.strides[i]), t.shape[i]);
  }
  std::sort(d.begin(), d.end());
  int64_t need = 1;
  for (const auto& [st, n] : d) {
    MEGAMOE_CHECK(st >= need, name, "strides that give every element its own address",
                  "overlapping strides " + dims(t.strides[0], t.ndim > 1 ? t.strides[1] : 0));
    need = st * n;
  }
}

bool overlaps(const Span& a, const Span& b) { return a.lo < b.hi && b.lo < a.hi; }

}  // namespace

Extent element_extent(const TensorRef& t) {
  Extent e;
  if (t.numel() == 0) return e;
  for (int d = 0; d < t.ndim; ++d) {
    const int64_t ext = (t.shape[d] - 1) * t.strides[d];
    (ext < 0 ? e.lo : e.hi) += ext;
  }
  return e;
}

std::vector<NamedTensor> named_tensors(const StageArgs& a) {
  std::vector<NamedTensor> all = {{&a.hidden_states, "hidden_states", false},
                                  {&a.topk_weights, "topk_weights", false},
                                  {&a.topk_ids, "topk_ids", false},
                                  {&a.x_fp8, "x_fp8", true},
                                  {&a.x_sf, "x_sf", true},
                                  {&a.topk_idx_out, "topk_idx_out", true},
                                  {&a.topk_weights_out, "topk_weights_out", true}};
  if (a.is_padding) all.push_back({&*a.is_padding, "is_padding", false});
  if (a.shared_x_sf) all.push_back({&*a.shared_x_sf, "shared_x_sf", true});
  return all;
}

Span byte_span(const TensorRef& t) {
  Span s;
  if (t.numel() == 0) return s;
  const int64_t es = dtype_size(t.dtype);
  const Extent e = element_extent(t);
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  s.lo = base + static_cast<uintptr_t>(e.lo * es);  // lo <= 0: wraps to base - |lo|*es
  s.hi = base + static_cast<uintptr_t>(e.hi * es + es);
  return s;
}

Problem validate_args(const StageArgs& a) {
  Problem p;
  const TensorRef& hs = a.hidden_states;
  check_rank(hs, "hidden_states", 2);
  check_dtype(hs, "hidden_states", {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  p.T = hs.shape[0];
  p.H = hs.shape[1];
  if (p.T == 0) return p;  // the reference returns before any other check

  if (p.H % 128 != 0) fail(kSeedHidden128, "hidden_states", "hidden_size % 128 == 0", p.H);

  const QuantScheme& q = a.hidden_quant;
  check_scheme(q);
  p.G = q.group_k;
  p.ue8m0 = q.ue8m0();
  if (p.ue8m0) {
    MEGAMOE_CHECK((p.H / p.G) % 4 == 0, "hidden_states",
                  "hidden_size / group_size to be a multiple of 4 (4 UE8M0 bytes per int32 word)",
                  std::to_string(p.H) + " / " + std::to_string(p.G));
  }
  p.sf_cols = core::sf_width(p.H, p.G, p.ue8m0);

  check_rank(a.topk_ids, "topk_ids", 2);
  check_rank(a.topk_weights, "topk_weights", 2);
  p.K = a.topk_ids.shape[1];
  if (a.topk_weights.shape[0] != a.topk_ids.shape[0] ||
      a.topk_weights.shape[1] != a.topk_ids.shape[1]) {
    fail(kSeedTopkShape, "topk_weights", "shape " + a.topk_ids.shape_str(),
         a.topk_weights.shape_str());
  }

  if (a.shared_x_sf.has_value() != a.shared_block_m.has_value()) {
    fail(kSeedSharedPair, a.shared_x_sf ? "shared_block_m" : "shared_x_sf", "a value", "none");
  }
  p.has_shared = a.shared_x_sf.has_value();
  if (p.has_shared) {
    if (!p.ue8m0) fail(kSeedSharedUe8m0, "hidden_quant", "UE8M0 scales", to_string(q));
    const int64_t bm = *a.shared_block_m;
    if (bm <= 0) fail(kSeedSharedBm, "shared_block_m", "> 0", bm);
    const TensorRef& s = *a.shared_x_sf;
    if (s.ndim != 2 || s.shape[1] != p.sf_cols) {
      std::string got = s.ndim >= 0 && s.ndim <= 2 ? s.shape_str() : std::string("(?)");
      throw Error(ErrorCode::kInvalidArgument, "MegaMoE shared_x_sf must have shape (*, " +
                                                   std::to_string(p.sf_cols) + "), got " + got +
                                                   ".");
    }
    const int64_t required = core::shared_sf_rows_required(p.T, bm);
    if (s.shape[0] < required) {
      throw Error(ErrorCode::kInvalidArgument, "MegaMoE shared_x_sf has insufficient rows: requires " +
                                                   std::to_string(required) + ", got " +
                                                   std::to_string(s.shape[0]) + ".");
    }
    check_dtype(s, "shared_x_sf", {DType::kInt32});
    p.shared_bm = bm;
  }

  // Inputs.
  MEGAMOE_CHECK(a.topk_ids.shape[0] == p.T, "topk_ids", "shape " + dims(p.T, p.K),
                "shape " + a.topk_ids.shape_str());
  check_dtype(a.topk_ids, "topk_ids", {DType::kInt32, DType::kInt64});
  check_dtype(a.topk_weights, "topk_weights", {DType::kFloat32, DType::kBFloat16, DType::kFloat16});
  p.has_padding = a.is_padding.has_value();
  if (p.has_padding) {
    check_rank(*a.is_padding, "is_padding", 1);
    MEGAMOE_CHECK(a.is_padding->shape[0] == p.T, "is_padding", "shape (" + std::to_string(p.T) + ",)",
                  "shape " + a.is_padding->shape_str());
    check_dtype(*a.is_padding, "is_padding", {DType::kBool, DType::kUInt8});
  }

  // Outputs.
  check_shape2(a.x_fp8, "x_fp8", p.T, p.H);
  check_dtype(a.x_fp8, "x_fp8", {DType::kFloat8E4M3, DType::kUInt8});
  check_shape2(a.x_sf, "x_sf", p.T, p.sf_cols);
  if (p.ue8m0) {
    check_dtype(a.x_sf, "x_sf", {DType::kInt32});
  } else {
    check_dtype(a.x_sf, "x_sf", {DType::kFloat32});
  }
  check_shape2(a.topk_idx_out, "topk_idx_out", p.T, p.K);
  check_dtype(a.topk_idx_out, "topk_idx_out", {DType::kInt64});
  check_shape2(a.topk_weights_out, "topk_weights_out", p.T, p.K);
  check_dtype(a.topk_weights_out, "topk_weights_out", {DType::kFloat32});

  // Devices, pointers, overlap.
  const std::vector<NamedTensor> all = named_tensors(a);
  for (const NamedTensor& n : all) {
    MEGAMOE_CHECK(n.t->device == hs.device, n.name, "device " + to_string(hs.device),
                  "device " + to_string(n.t->device));
    check_data(*n.t, n.name);
    if (n.output) check_no_self_overlap(*n.t, n.name);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].output) continue;
    const Span si = byte_span(*all[i].t);
    for (size_t j = 0; j < all.size(); ++j) {
      if (j == i || (all[j].output && j < i)) continue;
      if (overlaps(si, byte_span(*all[j].t))) {
        fail(nullptr, all[i].name, std::string("memory disjoint from ") + all[j].name,
             "overlapping memory");
      }
    }
  }
  return p;
}

}  // namespace detail

void check_scheme(const QuantScheme& q) {
  const bool ok = q.elem == QuantElem::kFloat8E4M3 && q.symmetric && !q.has_scale2 &&
                  !q.is_static && q.group_m == 1 && q.group_k > 0 && 128 % q.group_k == 0 &&
                  (q.scale == ScaleType::kUE8M0 || q.scale == ScaleType::kFloat32);
  if (!ok) {
    throw Error(ErrorCode::kInvalidArgument,
                "DeepSeek V4 MegaMoE input staging requires symmetric dynamic fp8 per-group "
                "quantization with a group size dividing 128 and E8M0 or fp32 scales, got " +
                    to_string(q) + ".");
  }
}

void validate(const StageArgs& args) { (void)detail::validate_args(args); }

}  // namespace megamoe
