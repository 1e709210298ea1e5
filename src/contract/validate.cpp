// contract/validate.cpp: every argument check of the contract (docs/CONTRACT.md), run before any backend writes a byte.
#include "contract/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/checked.h"
#include "core/layout.h"
#include "core/mhc.h"
#include "core/router.h"
#include "check.h"
#include "megamoe/error.h"
#include "megamoe/gate.h"
#include "megamoe/mhc.h"
#include "megamoe/norm.h"
#include "scheme.h"

namespace megamoe {
namespace detail {
namespace {

constexpr const char* kSeedTopkShape =
    "DeepSeek V4 MegaMoE input staging requires topk_weights and topk_ids to have the same "
    "shape.";
constexpr const char* kSeedSharedPair =
    "DeepSeek V4 MegaMoE shared input staging requires both shared_x_sf and shared_block_m.";

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

/// An output as the shape rule (output_shapes) declares it: its shape, then its dtype
/// (@p also: the one other dtype the contract accepts for its bytes, if any).
void check_spec(const TensorRef& t, const char* name, const TensorSpec& spec,
                std::optional<DType> also = std::nullopt) {
  if (spec.ndim == 2) {
    check_shape2(t, name, spec.shape[0], spec.shape[1]);
  } else {
    check_rank(t, name, 1);
    MEGAMOE_CHECK(t.shape[0] == spec.shape[0], name, "shape " + spec.shape_str(), "shape " + t.shape_str());
  }
  if (also) {
    check_dtype(t, name, {spec.dtype, *also});
  } else {
    check_dtype(t, name, {spec.dtype});
  }
}

/// A one-element tensor: 0-D, [1] or [1, 1].
void check_scalar(const TensorRef& t, const char* name) {
  const bool ok = t.ndim >= 0 && t.ndim <= 2 && (t.ndim < 1 || t.shape[0] == 1) && (t.ndim < 2 || t.shape[1] == 1);
  MEGAMOE_CHECK(ok, name, "a one-element tensor (0-D, [1] or [1, 1])",
                t.ndim >= 0 && t.ndim <= 2 ? "shape " + t.shape_str() : std::to_string(t.ndim) + "-D tensor");
}

void check_data(const TensorRef& t, const char* name) {
  MEGAMOE_CHECK(t.numel() == 0 || t.data != nullptr, name, "a non-null data pointer", "nullptr");
}

/// The element count, the element offsets and the byte span of @p t all fit: nothing that
/// follows (overlap checks, backends, kernels) can overflow on this tensor.
void check_fits(const TensorRef& t, const char* name) {
  core::Checked n = 1;
  for (int d = 0; d < t.ndim; ++d) n = n * t.shape[d];
  MEGAMOE_CHECK(n.ok(), name, "a shape whose element count fits in int64", t.shape_str());
  Extent e;
  const std::string strides = "strides " + dims(t.strides[0], t.ndim > 1 ? t.strides[1] : 0);
  MEGAMOE_CHECK(try_element_extent(t, &e), name,
                "strides whose element offsets fit in int64", strides + " for shape " + t.shape_str());
  Span s;
  MEGAMOE_CHECK(try_byte_span(t, &s), name, "a byte span inside the address space [0, 2^57)",
                strides + " for shape " + t.shape_str());
}

/// Outputs: distinct elements must have distinct addresses (no zero or aliasing strides).
/// Empty tensors have no elements, hence no overlap, whatever their strides.
void check_no_self_overlap(const TensorRef& t, const char* name) {
  if (t.numel() == 0) return;
  std::vector<std::pair<uint64_t, uint64_t>> d;  // (|stride|, size) of dims with size > 1
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] > 1) {
      const uint64_t st = t.strides[i] < 0 ? uint64_t{0} - static_cast<uint64_t>(t.strides[i])
                                           : static_cast<uint64_t>(t.strides[i]);
      d.emplace_back(st, static_cast<uint64_t>(t.shape[i]));
    }
  }
  std::sort(d.begin(), d.end());
  unsigned __int128 need = 1;  // |stride| * size of a fitting tensor fits in 65 bits
  for (const auto& [st, n] : d) {
    MEGAMOE_CHECK(st >= need, name, "strides that give every element its own address",
                  "overlapping strides " + dims(t.strides[0], t.ndim > 1 ? t.strides[1] : 0));
    need = static_cast<unsigned __int128>(st) * n;
  }
}

void check_device(const TensorRef& t, const char* name) {
  const Device& d = t.device;
  const bool ok = (d.type == Device::Type::kCPU && d.index == 0) ||
                  (d.type == Device::Type::kCUDA && d.index >= 0);
  MEGAMOE_CHECK(ok, name, "a CPU device (index 0) or a CUDA device (index >= 0)",
                "device " + to_string(d));
}

bool overlaps(const Span& a, const Span& b) { return a.lo < b.hi && b.lo < a.hi; }

/// The same elements at the same addresses: data, dtype, shape and strides (of each
/// dimension with more than one element) equal.
bool same_view(const TensorRef& a, const TensorRef& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  }
  return true;
}

/// The top-k tensors of a staging or routing-only call.
struct TopkRefs {
  const TensorRef& w;
  const TensorRef& ids;
  const std::optional<TensorRef>& pad;
  const TensorRef& idx_out;
  const TensorRef& w_out;
  const std::optional<TensorRef>& expert_scales;
};
TopkRefs topk_refs(const StageArgs& a) {
  return {a.topk_weights, a.topk_ids, a.is_padding, a.topk_idx_out, a.topk_weights_out, a.expert_scales};
}
TopkRefs topk_refs(const RoutingArgs& a) {
  return {a.topk_weights, a.topk_ids, a.is_padding, a.topk_idx_out, a.topk_weights_out, a.expert_scales};
}

/// Ranks of the top-k inputs, K, and the reference's same-shape rule.
void check_topk_pair(const TopkRefs& k, Problem& p) {
  check_rank(k.ids, "topk_ids", 2);
  check_rank(k.w, "topk_weights", 2);
  p.K = k.ids.shape[1];
  if (k.w.shape[0] != k.ids.shape[0] || k.w.shape[1] != k.ids.shape[1]) {
    fail(kSeedTopkShape, "topk_weights", "shape " + k.ids.shape_str(), k.w.shape_str());
  }
}

/// The top-k inputs' rows and dtypes, the padding mask, and the outputs' row count M (T,
/// or the buffer's row count in full-buffer mode).
void check_topk_inputs(const TopkRefs& k, bool full_buffer, Problem& p) {
  MEGAMOE_CHECK(k.ids.shape[0] == p.T, "topk_ids", "shape " + dims(p.T, p.K), "shape " + k.ids.shape_str());
  check_dtype(k.ids, "topk_ids", {DType::kInt32, DType::kInt64});
  check_dtype(k.w, "topk_weights", {DType::kFloat32, DType::kBFloat16, DType::kFloat16});
  p.has_padding = k.pad.has_value();
  if (p.has_padding) {
    check_rank(*k.pad, "is_padding", 1);
    MEGAMOE_CHECK(k.pad->shape[0] == p.T, "is_padding", "shape (" + std::to_string(p.T) + ",)",
                  "shape " + k.pad->shape_str());
    check_dtype(*k.pad, "is_padding", {DType::kBool, DType::kUInt8});
  }
  p.full_buffer = full_buffer;
  p.M = p.T;
  if (full_buffer) {
    check_rank(k.idx_out, "topk_idx_out", 2);
    p.M = k.idx_out.shape[0];
    MEGAMOE_CHECK(p.M >= p.T, "topk_idx_out",
                  "at least " + std::to_string(p.T) + " rows (full-buffer mode: max_tokens >= num_tokens)",
                  std::to_string(p.M) + " rows");
  }
}

/// The top-k outputs as the shape rule declares them for the call's M rows (@p out), the
/// routed scaling factor and the per-expert scales (a [E] fp32 table, any E and stride).
void check_topk_outputs(const TopkRefs& k, const OutputShapes& out, const std::optional<float>& alpha, Problem& p) {
  check_spec(k.idx_out, "topk_idx_out", out.topk_idx_out);
  check_spec(k.w_out, "topk_weights_out", out.topk_weights_out);
  p.has_alpha = alpha.has_value();
  if (p.has_alpha) {
    MEGAMOE_CHECK(std::isfinite(*alpha), "routed_scaling_factor", "a finite value", *alpha);
    p.alpha = *alpha;
  }
  p.has_expert_scales = k.expert_scales.has_value();
  if (p.has_expert_scales) {
    check_rank(*k.expert_scales, "expert_scales", 1);
    check_dtype(*k.expert_scales, "expert_scales", {DType::kFloat32});
    p.E = k.expert_scales->shape[0];
  }
}

}  // namespace

bool element_misaligned(const TensorRef& t) {
  const int64_t es = dtype_size(t.dtype);
  return t.numel() > 0 && es > 1 && reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(es) != 0;
}

namespace {

/// Devices, data pointers, sizes that fit, self-overlap of outputs, overlap between
/// tensors: the checks every call ends with. Returns whether a tensor's data pointer is off
/// its element size (valid; the CUDA backend then runs on aligned copies).
bool check_memory(const std::vector<NamedTensor>& all, const Device& dev) {
  bool misaligned = false;
  for (const NamedTensor& n : all) {
    check_device(*n.t, n.name);
    check_fits(*n.t, n.name);
    MEGAMOE_CHECK(n.t->device == dev, n.name, "device " + to_string(dev), "device " + to_string(n.t->device));
    check_data(*n.t, n.name);
    if (n.output) check_no_self_overlap(*n.t, n.name);
    misaligned = misaligned || element_misaligned(*n.t);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].output) continue;
    const Span si = byte_span(*all[i].t);
    for (size_t j = 0; j < all.size(); ++j) {
      if (j == i || (all[j].output && j < i)) continue;
      if (all[i].in_place_of == all[j].t && same_view(*all[i].t, *all[j].t)) continue;
      if (overlaps(si, byte_span(*all[j].t))) {
        fail(nullptr, all[i].name, std::string("memory disjoint from ") + all[j].name, "overlapping memory");
      }
    }
  }
  return misaligned;
}

}  // namespace

bool try_element_extent(const TensorRef& t, Extent* out) {
  *out = Extent{};
  if (t.ndim < 0 || t.ndim > TensorRef::kMaxRank) return false;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return true;  // no elements: empty extent
  }
  core::Checked lo = 0, hi = 0;
  for (int d = 0; d < t.ndim; ++d) {
    const core::Checked ext = core::Checked(t.shape[d] - 1) * t.strides[d];
    if (!ext.ok()) return false;
    if (ext.value() < 0) lo = lo + ext;
    else hi = hi + ext;
  }
  if (!lo.ok() || !hi.ok()) return false;
  *out = Extent{lo.value(), hi.value()};
  return true;
}

Extent element_extent(const TensorRef& t) {
  Extent e;
  (void)try_element_extent(t, &e);
  return e;
}

std::vector<NamedTensor> named_tensors(const StageArgs& a) {
  std::vector<NamedTensor> all = {{&a.hidden_states, "hidden_states", false},
                                  {&a.topk_weights, "topk_weights", false},
                                  {&a.topk_ids, "topk_ids", false},
                                  {&a.x_q, "x_q", true},
                                  {&a.topk_idx_out, "topk_idx_out", true},
                                  {&a.topk_weights_out, "topk_weights_out", true}};
  // x_sf may be absent (a default TensorRef: rank 0, no data) only where the format has no
  // scales (bf16); the validator's check_spec rejects a rank-0 x_sf for every other format
  // before the memory checks that use this list.
  if (!(a.x_sf.ndim == 0 && a.x_sf.data == nullptr)) all.insert(all.begin() + 4, {&a.x_sf, "x_sf", true});
  if (a.is_padding) all.push_back({&*a.is_padding, "is_padding", false});
  if (a.shared_x_sf) all.push_back({&*a.shared_x_sf, "shared_x_sf", true});
  if (a.global_scale) {
    // NVFP4 online writes its global scale; NVFP4 static reads it.
    core::Format f;
    const bool written = resolve_format(a.hidden_quant, &f) && core::online_scaled(f);
    all.push_back({&*a.global_scale, "global_scale", written});
  }
  if (a.x_scales) all.push_back({&*a.x_scales, "x_scales", true});
  if (a.nonfinite_count) all.push_back({&*a.nonfinite_count, "nonfinite_count", true});
  if (a.expert_scales) all.push_back({&*a.expert_scales, "expert_scales", false});
  return all;
}

std::vector<NamedTensor> named_tensors(const RoutingArgs& a) {
  std::vector<NamedTensor> all = {{&a.topk_weights, "topk_weights", false},
                                  {&a.topk_ids, "topk_ids", false},
                                  {&a.topk_idx_out, "topk_idx_out", true},
                                  {&a.topk_weights_out, "topk_weights_out", true}};
  if (a.is_padding) all.push_back({&*a.is_padding, "is_padding", false});
  if (a.expert_scales) all.push_back({&*a.expert_scales, "expert_scales", false});
  return all;
}

std::vector<NamedTensor> named_tensors(const RmsNormArgs& n, const StageArgs& s) {
  std::vector<NamedTensor> all = {{&n.x, "x", false}, {&n.weight, "weight", false}};
  if (n.residual) all.push_back({&*n.residual, "residual", false});
  if (n.y) all.push_back({&*n.y, "y", true, &n.x});
  if (n.residual_out) all.push_back({&*n.residual_out, "residual_out", true, n.residual ? &*n.residual : nullptr});
  // The staging's hidden states are the norm's rows (x, or y when written), listed above.
  for (const NamedTensor& t : named_tensors(s)) {
    if (t.t != &s.hidden_states) all.push_back(t);
  }
  return all;
}

std::vector<NamedTensor> named_tensors(const MhcPreArgs& m, const StageArgs& s) {
  std::vector<NamedTensor> all = {{&m.residual, "residual", false}, {&m.fn, "fn", false},
                                  {&m.hc_scale, "hc_scale", false}, {&m.hc_base, "hc_base", false},
                                  {&m.norm_weight, "norm_weight", false}, {&m.post_mix, "post_mix", true},
                                  {&m.comb_mix, "comb_mix", true}};
  if (m.pre_mix_in) all.push_back({&*m.pre_mix_in, "pre_mix_in", false});
  if (m.pre_mix) all.push_back({&*m.pre_mix, "pre_mix", true});
  if (m.layer_input) all.push_back({&*m.layer_input, "layer_input", true});
  if (m.y) all.push_back({&*m.y, "y", true});
  // The staging's hidden states are the normalized rows (y when written, listed above).
  for (const NamedTensor& t : named_tensors(s)) {
    if (t.t != &s.hidden_states) all.push_back(t);
  }
  return all;
}

std::vector<NamedTensor> named_tensors(const RouterArgs& r, const StageArgs* stage) {
  std::vector<NamedTensor> all = {{&r.router_logits, "router_logits", false},
                                  {&r.topk_ids, "topk_ids", true},
                                  {&r.topk_weights, "topk_weights", true}};
  const std::pair<const std::optional<TensorRef>*, NamedTensor> opt[] = {
      {&r.e_score_correction_bias, {nullptr, "e_score_correction_bias", false}},
      {&r.tid2eid, {nullptr, "tid2eid", false}},
      {&r.input_ids, {nullptr, "input_ids", false}},
      {&r.logical_to_physical_map, {nullptr, "logical_to_physical_map", false}},
      {&r.logical_replica_count, {nullptr, "logical_replica_count", false}},
      {&r.expert_load_view, {nullptr, "expert_load_view", true}},
      {&r.record_enabled, {nullptr, "record_enabled", false}},
      {&r.nonfinite_count, {nullptr, "nonfinite_count (router)", true}},
      {&r.is_padding, {nullptr, "is_padding", false}}};
  for (const auto& [t, n] : opt) {
    if (t->has_value()) all.push_back({&**t, n.name, n.output});
  }
  // The staging's top-k inputs are the router's outputs (staged_args), already listed.
  if (stage != nullptr) {
    for (const NamedTensor& n : named_tensors(*stage)) {
      if (n.t != &stage->topk_ids && n.t != &stage->topk_weights) all.push_back(n);
    }
  }
  return all;
}

std::vector<NamedTensor> named_tensors(const GateArgs& g, const RouterArgs& r, const StageArgs* stage) {
  std::vector<NamedTensor> all = {{&g.y, "y", false}, {&g.weight, "weight", false}};
  if (g.logits_out) all.push_back({&*g.logits_out, "logits_out", true});
  // The router's logits are the gate's (above); the rest of the router's and staging's.
  for (const NamedTensor& t : named_tensors(r, stage)) {
    if (t.t != &r.router_logits) all.push_back(t);
  }
  return all;
}

bool try_byte_span(const TensorRef& t, Span* out) {
  *out = Span{};
  Extent e;
  if (!try_element_extent(t, &e)) return false;
  if (t.numel() == 0) return true;
  const int64_t es = dtype_size(t.dtype);
  const core::Checked lo = core::Checked(e.lo) * es;
  const core::Checked hi = (core::Checked(e.hi) + 1) * es;
  if (!lo.ok() || !hi.ok()) return false;
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  const uint64_t below = uint64_t{0} - static_cast<uint64_t>(lo.value());  // lo <= 0
  const uint64_t above = static_cast<uint64_t>(hi.value());
  // Inside [0, 2^57): the largest user address space of 64-bit Linux (5-level paging) and
  // of CUDA's unified addressing. A span reaching beyond cannot be memory the caller owns
  // (e.g. NumPy's as_strided with a stride of 2^62 bytes), so it is rejected, not written.
  constexpr uint64_t kAddressLimit = uint64_t{1} << 57;
  if (base > kAddressLimit || below > base || above > kAddressLimit - base) return false;
  *out = Span{base - below, base + above};
  return true;
}

Span byte_span(const TensorRef& t) {
  Span s;
  (void)try_byte_span(t, &s);
  return s;
}

Problem validate_args(const StageArgs& a, bool rows_described) {
  Problem p;
  const TensorRef& hs = a.hidden_states;
  check_rank(hs, "hidden_states", 2);
  p.T = hs.shape[0];
  p.H = hs.shape[1];
  if (returns_at_once(p.T, a.full_buffer)) return p;
  check_dtype(hs, "hidden_states", {DType::kBFloat16, DType::kFloat16, DType::kFloat32});

  // vLLM's MXFP4 path passes the default scheme with a packed int8/uint8 x_q as wide as
  // MXFP4's. The shape rule checks H first (a multiple of 128), as the reference does.
  const TensorSpec mxfp4_xq = output_shapes(0, p.H, 0, QuantScheme::mxfp4()).x_q;
  QuantScheme q = a.hidden_quant;
  if (q == QuantScheme::mxfp8().with_amax_floor(q.amax_floor) && a.x_q.ndim == 2 &&
      a.x_q.shape[1] == mxfp4_xq.shape[1] && (a.x_q.dtype == mxfp4_xq.dtype || a.x_q.dtype == DType::kInt8)) {
    q = QuantScheme::mxfp4().with_amax_floor(q.amax_floor);
  }
  // The scheme, whole scale words and T * H, as output_shapes rejects them.
  const OutputShapes widths = output_shapes(p.T, p.H, 0, q);
  p.fmt = format_of(q);
  p.scheme = q;
  p.G = q.group_k;
  p.floor = q.amax_floor;
  p.ue8m0 = core::sf_of(p.fmt) == core::Sf::kUE8M0x4;
  p.sf_cols = widths.x_sf.shape[1];
  p.xq_cols = widths.x_q.shape[1];

  const TopkRefs topk = topk_refs(a);
  check_topk_pair(topk, p);

  if (core::passthrough(p.fmt) && (a.shared_x_sf || a.shared_block_m)) {
    fail(nullptr, a.shared_x_sf ? "shared_x_sf" : "shared_block_m",
         "none (bf16 has no scales to copy: the shared experts read x_q)", "a value");
  }
  if (a.shared_x_sf.has_value() != a.shared_block_m.has_value()) {
    fail(kSeedSharedPair, a.shared_x_sf ? "shared_block_m" : "shared_x_sf", "a value", "none");
  }
  p.has_shared = a.shared_x_sf.has_value();
  if (p.has_shared) {
    // The shape rule rejects non-UE8M0 scales, then bm <= 0, and gives the width.
    const int64_t bm = *a.shared_block_m;
    const int64_t cols = output_shapes(0, p.H, 0, q, bm).shared_x_sf->shape[1];
    const TensorRef& s = *a.shared_x_sf;
    if (s.ndim != 2 || s.shape[1] != cols) {
      std::string got = s.ndim >= 0 && s.ndim <= 2 ? s.shape_str() : std::string("(?)");
      throw Error(ErrorCode::kInvalidArgument, "MegaMoE shared_x_sf must have shape (*, " +
                                                   std::to_string(cols) + "), got " + got + ".");
    }
    // The rows the tokens need (full-buffer mode too: the tail has no shared rows); a
    // count past int64 (a huge bm) is named with the rows given.
    const core::Checked req = shared_sf_rows(p.T, bm);
    if (!req.ok()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "MegaMoE shared_x_sf has insufficient rows: requires ceil(" + std::to_string(p.T) +
                      " / " + std::to_string(bm) + ") * align(" + std::to_string(bm) +
                      ", 128) rows, more than int64 can count; got " + std::to_string(s.shape[0]) + ".");
    }
    const int64_t required = req.value();
    if (s.shape[0] < required) {
      throw Error(ErrorCode::kInvalidArgument, "MegaMoE shared_x_sf has insufficient rows: requires " +
                                                   std::to_string(required) + ", got " +
                                                   std::to_string(s.shape[0]) + ".");
    }
    check_dtype(s, "shared_x_sf", {DType::kInt32});
    p.shared_bm = bm;
  }

  check_topk_inputs(topk, a.full_buffer, p);
  // Every output as the shape rule declares it for the call's M rows (unchecked form: a
  // size past int64 is named by the tensor that has it, check_fits below).
  const OutputShapes out = output_shapes_of(p.fmt, q, p.M, p.H, p.K);
  check_topk_outputs(topk, out, a.routed_scaling_factor, p);
  // x_q's bytes may also come as uint8 (fp8: NumPy has no fp8) or int8 (packed fp4); bf16
  // elements have no other dtype of their size in the contract.
  if (dtype_size(out.x_q.dtype) == 1) {
    check_spec(a.x_q, "x_q", out.x_q, out.x_q.dtype == DType::kUInt8 ? DType::kInt8 : DType::kUInt8);
  } else {
    check_spec(a.x_q, "x_q", out.x_q);
  }
  if (core::passthrough(p.fmt)) {
    // No scales: no tensor at all (a default TensorRef), or an empty one of any dtype.
    const TensorRef& sf = a.x_sf;
    const bool absent = sf.ndim == 0 && sf.data == nullptr;
    const bool empty = sf.ndim == 2 && sf.shape[0] >= 0 && sf.shape[1] == 0;
    MEGAMOE_CHECK(absent || empty, "x_sf",
                  "no tensor or an empty (" + std::to_string(p.M) + ", 0) tensor (" + core::format_name(p.fmt) +
                      " has no scales)",
                  sf.ndim >= 0 && sf.ndim <= 2 ? "shape " + sf.shape_str() : std::to_string(sf.ndim) + "-D tensor");
    if (empty) check_spec(sf, "x_sf", out.x_sf, sf.dtype);
  } else {
    // None in Python: no tensor, which only a format without scales takes.
    if (a.x_sf.ndim == 0 && a.x_sf.data == nullptr) {
      fail(nullptr, "x_sf", "a " + out.x_sf.shape_str() + " tensor (" + core::format_name(p.fmt) + " writes scales)",
           "none");
    }
    check_spec(a.x_sf, "x_sf", out.x_sf);
  }
  // Second-level scales: present exactly when the format has them.
  const std::string fmt_name = scheme_name(q);
  p.has_global = a.global_scale.has_value();
  if (out.global_scale.has_value() != p.has_global) {
    fail(nullptr, "global_scale", p.has_global ? "none (" + fmt_name + " has no static global scale)"
                                               : "a [1] float32 tensor (" + fmt_name +
                                                     (out.global_scale_out ? " writes one)" : " needs one)"),
         p.has_global ? "a tensor" : "none");
  }
  if (p.has_global) {
    check_scalar(*a.global_scale, "global_scale");  // 0-D, [1] or [1, 1]
    check_dtype(*a.global_scale, "global_scale", {out.global_scale->dtype});
  }
  p.has_x_scales = a.x_scales.has_value();
  if (out.x_scales.has_value() != p.has_x_scales) {
    fail(nullptr, "x_scales", p.has_x_scales ? "none (" + fmt_name + " has no per-token scales)"
                                             : "a [T] float32 output (" + fmt_name + " writes one)",
         p.has_x_scales ? "a tensor" : "none");
  }
  if (p.has_x_scales) check_spec(*a.x_scales, "x_scales", *out.x_scales);
  p.has_nonfinite = a.nonfinite_count.has_value();
  if (p.has_nonfinite) {
    check_scalar(*a.nonfinite_count, "nonfinite_count");
    check_dtype(*a.nonfinite_count, "nonfinite_count", {DType::kInt64});
  }

  std::vector<NamedTensor> all = named_tensors(a);
  // A producer's rows (device::stage_target) have a shape, a dtype and a device but no
  // memory that anything reads: only the outputs are checked against them.
  if (rows_described) all.erase(all.begin());
  p.misaligned = check_memory(all, hs.device);
  return p;
}

Problem validate_routing(const RoutingArgs& a) {
  Problem p;
  p.routing_only = true;
  check_rank(a.topk_ids, "topk_ids", 2);
  p.T = a.topk_ids.shape[0];
  if (returns_at_once(p.T, a.full_buffer)) return p;
  const TopkRefs topk = topk_refs(a);
  check_topk_pair(topk, p);
  check_topk_inputs(topk, a.full_buffer, p);
  // No activations: the shape rule's top-k outputs, at H = 0 under any scheme.
  const QuantScheme any = QuantScheme::mxfp8();
  check_topk_outputs(topk, output_shapes_of(format_of(any), any, p.M, 0, p.K), a.routed_scaling_factor, p);
  p.misaligned = check_memory(named_tensors(a), a.topk_ids.device);
  return p;
}

// ---------------------------------------------------------------------------------------
// The fused router (include/megamoe/router.h).

namespace {

/// A [n] tensor of one of the dtypes @p ok.
void check_vector(const TensorRef& t, const char* name, int64_t n, std::initializer_list<DType> ok) {
  check_rank(t, name, 1);
  MEGAMOE_CHECK(t.shape[0] == n, name, "shape (" + std::to_string(n) + ",)", "shape " + t.shape_str());
  check_dtype(t, name, ok);
}

/// Hash layers: tid2eid [V, K] int32 and input_ids [T], together; no bias.
void check_router_hash(const RouterArgs& r, RouterProblem& p) {
  if (r.tid2eid.has_value() != r.input_ids.has_value()) {
    fail(nullptr, r.tid2eid ? "input_ids" : "tid2eid", "a tensor (a hash layer needs tid2eid and input_ids together)",
         "none");
  }
  p.hash = r.tid2eid.has_value();
  if (!p.hash) return;
  if (r.e_score_correction_bias) {
    fail(nullptr, "e_score_correction_bias", "none (a hash layer, tid2eid given, has no selection bias)", "a tensor");
  }
  const TensorRef& tab = *r.tid2eid;
  check_rank(tab, "tid2eid", 2);
  MEGAMOE_CHECK(tab.shape[0] >= 1 && tab.shape[1] == p.K, "tid2eid", "shape (V >= 1, top_k = " + std::to_string(p.K) + ")",
                "shape " + tab.shape_str());
  check_dtype(tab, "tid2eid", {DType::kInt32});
  p.V = tab.shape[0];
  check_vector(*r.input_ids, "input_ids", p.T, {DType::kInt32, DType::kInt64});
}

/// EPLB: the map, the replica counts, the load and the record flag, all four or none.
void check_router_eplb(const RouterArgs& r, RouterProblem& p) {
  const std::pair<const std::optional<TensorRef>*, const char*> parts[] = {
      {&r.logical_to_physical_map, "logical_to_physical_map"},
      {&r.logical_replica_count, "logical_replica_count"},
      {&r.expert_load_view, "expert_load_view"},
      {&r.record_enabled, "record_enabled"}};
  int given = 0;
  for (const auto& [t, name] : parts) given += t->has_value() ? 1 : 0;
  if (given == 0) return;
  for (const auto& [t, name] : parts) {
    if (!t->has_value()) {
      fail(nullptr, name,
           "a tensor (EPLB needs logical_to_physical_map, logical_replica_count, expert_load_view and "
           "record_enabled together)",
           "none");
    }
  }
  p.eplb = true;
  const TensorRef& map = *r.logical_to_physical_map;
  check_rank(map, "logical_to_physical_map", 2);
  MEGAMOE_CHECK(map.shape[0] == p.E && map.shape[1] >= 1, "logical_to_physical_map",
                "shape (E = " + std::to_string(p.E) + ", R >= 1)", "shape " + map.shape_str());
  check_dtype(map, "logical_to_physical_map", {DType::kInt32});
  p.R = map.shape[1];
  check_vector(*r.logical_replica_count, "logical_replica_count", p.E, {DType::kInt32});
  check_rank(*r.expert_load_view, "expert_load_view", 1);
  check_dtype(*r.expert_load_view, "expert_load_view", {DType::kInt32, DType::kInt64});
  p.P = r.expert_load_view->shape[0];
  check_scalar(*r.record_enabled, "record_enabled");
  check_dtype(*r.record_enabled, "record_enabled", {DType::kInt32});
}

}  // namespace

StageArgs staged_args(const RouterArgs& r, const StageArgs& s) {
  StageArgs a = s;
  a.topk_ids = r.topk_ids;
  a.topk_weights = r.topk_weights;
  return a;
}

const TensorRef* router_padding(const RouterArgs& r, const StageArgs* stage) {
  if (stage != nullptr) return stage->is_padding ? &*stage->is_padding : nullptr;
  return r.is_padding ? &*r.is_padding : nullptr;
}

namespace {

/// route_and_stage: the token count is the logits' (@p rows names them) and the hidden
/// states' alike, checked before the T == 0 return so that [0, E] logits never hide a
/// non-empty batch.
void check_hidden_rows(const StageArgs* stage, int64_t T, const char* rows) {
  if (stage == nullptr) return;
  check_rank(stage->hidden_states, "hidden_states", 2);
  MEGAMOE_CHECK(stage->hidden_states.shape[0] == T, "hidden_states",
                std::to_string(T) + " tokens (the rows of " + rows + ")", "shape " + stage->hidden_states.shape_str());
}

/// Every router rule past the logits' own (p.T, p.E and p.fused set): top_k, the scaling,
/// the outputs, hash layers, bias, EPLB, the counter, the padding mask and, fused, the
/// staging. The memory checks are the caller's (its tensor list).
void check_router_rest(const RouterArgs& r, const StageArgs* stage, RouterProblem& p) {
  MEGAMOE_CHECK(r.top_k >= 1 && r.top_k <= core::kMaxRouterTopk && r.top_k <= p.E, "top_k",
                "1 <= top_k <= min(16, E = " + std::to_string(p.E) + ")", r.top_k);
  p.K = r.top_k;
  if (r.routed_scaling_factor) {
    MEGAMOE_CHECK(std::isfinite(*r.routed_scaling_factor), "routed_scaling_factor", "a finite value",
                  *r.routed_scaling_factor);
    p.alpha = *r.routed_scaling_factor;
  }
  check_shape2(r.topk_ids, "topk_ids", p.T, p.K);
  check_dtype(r.topk_ids, "topk_ids", {DType::kInt32, DType::kInt64});
  check_shape2(r.topk_weights, "topk_weights", p.T, p.K);
  check_dtype(r.topk_weights, "topk_weights", {DType::kFloat32});
  check_router_hash(r, p);
  p.has_bias = r.e_score_correction_bias.has_value();
  if (p.has_bias) {
    check_vector(*r.e_score_correction_bias, "e_score_correction_bias", p.E, {DType::kFloat32, DType::kBFloat16});
  }
  check_router_eplb(r, p);
  p.has_nonfinite = r.nonfinite_count.has_value();
  if (p.has_nonfinite) {
    check_scalar(*r.nonfinite_count, "nonfinite_count (router)");
    check_dtype(*r.nonfinite_count, "nonfinite_count (router)", {DType::kInt64});
  }

  if (!p.fused) {
    p.has_padding = r.is_padding.has_value();
    if (p.has_padding) check_vector(*r.is_padding, "is_padding", p.T, {DType::kBool, DType::kUInt8});
    return;
  }
  if (r.is_padding) {
    fail(nullptr, "is_padding (router)", "none (route_and_stage takes the mask from StageArgs::is_padding)",
         "a tensor");
  }
  if (stage->routed_scaling_factor) {
    fail(nullptr, "routed_scaling_factor (staging)",
         "none (route_and_stage scales by RouterArgs::routed_scaling_factor)", *stage->routed_scaling_factor);
  }
  if (stage->expert_scales) {
    fail(nullptr, "expert_scales (staging)",
         "none (route_and_stage does not fold per-expert scales; stage with prepare_inputs or stage_routing)",
         "a tensor");
  }
  // The staging, with the router's outputs as its top-k inputs: every staging rule applies.
  const StageArgs a = staged_args(r, *stage);
  p.stage = validate_args(a);
  // NVFP4 online's global scale needs the whole tensor's amax before any group: a launch
  // of its own before the staging, which the fused router kernel does not have.
  if (core::online_scaled(p.stage.fmt)) {
    throw Error(ErrorCode::kUnsupported, "megamoe: route_and_stage: hidden_quant: nvfp4_online is not supported "
                                         "(route, then prepare_inputs with it)");
  }
  p.has_padding = p.stage.has_padding;
}

}  // namespace

RouterProblem validate_router(const RouterArgs& r, const StageArgs* stage) {
  RouterProblem p;
  p.fused = stage != nullptr;
  const TensorRef& lg = r.router_logits;
  check_rank(lg, "router_logits", 2);
  p.T = lg.shape[0];
  p.E = lg.shape[1];
  check_hidden_rows(stage, p.T, "router_logits");
  if (returns_at_once(p.T, p.fused && stage->full_buffer)) return p;
  check_dtype(lg, "router_logits", {DType::kFloat32, DType::kBFloat16});
  MEGAMOE_CHECK(p.E >= 1 && p.E <= core::kMaxRouterExperts, "router_logits", "1 to 512 experts (shape[1])",
                "shape " + lg.shape_str());
  check_router_rest(r, stage, p);
  // Overlaps across both argument sets.
  p.misaligned = check_memory(named_tensors(r, stage), lg.device);
  return p;
}

// ---------------------------------------------------------------------------------------
// The gate producer (include/megamoe/gate.h).

RouterArgs gated_router_args(const RouterArgs& r, const TensorRef& logits) {
  RouterArgs a = r;
  a.router_logits = logits;
  return a;
}

GateProblem validate_gate(const GateArgs& g, const RouterArgs& r, const StageArgs* stage) {
  GateProblem p;
  RouterProblem& rp = p.router;
  rp.fused = stage != nullptr;
  // The logits are the gate's: a caller's router_logits would be ignored silently.
  const TensorRef& lg = r.router_logits;
  if (!(lg.data == nullptr && lg.ndim == 0)) {
    fail(nullptr, "router_logits", "none (an empty TensorRef: the gate computes the logits; logits_out receives them)",
         "a tensor");
  }
  check_rank(g.y, "y", 2);
  check_rank(g.weight, "weight", 2);
  rp.T = p.T = g.y.shape[0];
  p.H = g.y.shape[1];
  rp.E = p.E = g.weight.shape[0];
  check_hidden_rows(stage, p.T, "y");
  if (returns_at_once(p.T, rp.fused && stage->full_buffer)) return p;
  check_dtype(g.y, "y", {DType::kBFloat16});
  check_dtype(g.weight, "weight", {DType::kBFloat16, DType::kFloat32});
  p.weight_f32 = g.weight.dtype == DType::kFloat32;
  MEGAMOE_CHECK(p.E >= 1 && p.E <= core::kMaxRouterExperts, "weight", "1 to 512 experts (shape[0])",
                "shape " + g.weight.shape_str());
  MEGAMOE_CHECK(p.H >= 1 && g.weight.shape[1] == p.H, "weight",
                "shape (E, H) with H = y.shape[1] >= 1 (" + std::to_string(p.H) + ")", "shape " + g.weight.shape_str());
  if (g.logits_out) {
    check_shape2(*g.logits_out, "logits_out", p.T, p.E);
    check_dtype(*g.logits_out, "logits_out", {DType::kFloat32});
  }
  check_router_rest(r, stage, rp);
  // The backends keep T x E logits (logits_out or scratch) and a row's tree of chunk sums.
  const core::Checked logits = core::Checked(p.T) * p.E * int64_t{sizeof(float)};
  MEGAMOE_CHECK(logits.ok(), "y", "T * E fp32 logits whose byte count fits in int64", "shape " + g.y.shape_str());
  rp.misaligned = check_memory(named_tensors(g, r, stage), g.y.device);
  return p;
}

// ---------------------------------------------------------------------------------------
// The RMSNorm producer (include/megamoe/norm.h).

StageArgs staged_args(const TensorRef& y, const StageArgs& s) {
  StageArgs a = s;
  a.hidden_states = y;
  return a;
}

namespace {
/// The staging of a producer's rows (@p rows stands in as the hidden states: the rows
/// themselves, or a tensor of their shape and dtype); its messages name them @p name.
Problem validate_staged_rows(const TensorRef& rows, const char* name, const StageArgs& s) {
  try {
    return validate_args(staged_args(rows, s));
  } catch (const Error& e) {
    std::string m = e.what();
    const std::string from = "hidden_states";
    for (size_t at = m.find(from); at != std::string::npos; at = m.find(from, at + 1)) m.replace(at, from.size(), name);
    throw Error(e.code(), m);
  }
}
}  // namespace

NormProblem validate_norm(const RmsNormArgs& n, const StageArgs& s) {
  NormProblem p;
  check_rank(n.x, "x", 2);
  p.T = n.x.shape[0];
  p.H = n.x.shape[1];
  if (returns_at_once(p.T, s.full_buffer)) return p;
  check_dtype(n.x, "x", {DType::kBFloat16});
  // The mean divides by H as an fp32, exact up to 2^24 (staging needs H % 128 == 0).
  MEGAMOE_CHECK(p.H <= (int64_t{1} << 24), "x", "at most 2^24 columns", "shape " + n.x.shape_str());
  p.has_residual = n.residual.has_value();
  if (p.has_residual) {
    check_shape2(*n.residual, "residual", p.T, p.H);
    check_dtype(*n.residual, "residual", {DType::kBFloat16});
  }
  check_rank(n.weight, "weight", 1);
  MEGAMOE_CHECK(n.weight.shape[0] == p.H, "weight", "shape (" + std::to_string(p.H) + ",)",
                "shape " + n.weight.shape_str());
  check_dtype(n.weight, "weight", {DType::kBFloat16, DType::kFloat32});
  p.weight_f32 = n.weight.dtype == DType::kFloat32;
  MEGAMOE_CHECK(std::isfinite(n.eps) && n.eps >= 0.0f, "eps", "a finite value >= 0", n.eps);
  p.eps = n.eps;
  if (n.y) {
    check_shape2(*n.y, "y", p.T, p.H);
    check_dtype(*n.y, "y", {DType::kBFloat16});
  }
  if (n.residual_out) {
    if (!p.has_residual) fail(nullptr, "residual_out", "none (the call has no residual)", "a tensor");
    check_shape2(*n.residual_out, "residual_out", p.T, p.H);
    check_dtype(*n.residual_out, "residual_out", {DType::kBFloat16});
  }
  // The staging of the normalized rows: every staging rule applies (the rows stand in as
  // its hidden states: y when written, else x, which has their shape and dtype; the
  // staging's messages name them as the caller does).
  p.stage = validate_staged_rows(n.y ? *n.y : n.x, n.y ? "y" : "x", s);
  p.misaligned = check_memory(named_tensors(n, s), n.x.device);
  return p;
}

// ---------------------------------------------------------------------------------------
// The mHC pre producer (include/megamoe/mhc.h).

MhcProblem validate_mhc(const MhcPreArgs& m, const StageArgs& s) {
  MhcProblem p;
  check_rank(m.residual, "residual", 2);
  p.T = m.residual.shape[0];
  if (returns_at_once(p.T, s.full_buffer)) return p;
  check_dtype(m.residual, "residual", {DType::kBFloat16});
  // hc is post_mix's width, H norm_weight's length; everything else is checked against them.
  check_rank(m.post_mix, "post_mix", 2);
  MEGAMOE_CHECK(m.post_mix.shape[1] >= 1 && m.post_mix.shape[1] <= core::kMhcMaxStreams, "post_mix",
                "shape (T, hc_mult) with 1 <= hc_mult <= " + std::to_string(core::kMhcMaxStreams),
                "shape " + m.post_mix.shape_str());
  p.hc = static_cast<int>(m.post_mix.shape[1]);
  p.M = core::mhc_mixes(p.hc);
  check_rank(m.norm_weight, "norm_weight", 1);
  p.H = m.norm_weight.shape[0];
  MEGAMOE_CHECK(p.H >= 1, "norm_weight", "shape (H,) with H >= 1", "shape " + m.norm_weight.shape_str());
  const core::Checked K = core::Checked(p.hc) * p.H;
  // The mixes' mean divides by hc * H as an fp32, exact up to 2^24.
  MEGAMOE_CHECK(K.ok() && K.value() <= (int64_t{1} << 24), "norm_weight",
                "hc_mult * H <= 2^24 (hc_mult = " + std::to_string(p.hc) + ")", "shape " + m.norm_weight.shape_str());
  p.K = K.value();
  check_dtype(m.norm_weight, "norm_weight", {DType::kBFloat16, DType::kFloat32});
  p.weight_f32 = m.norm_weight.dtype == DType::kFloat32;
  check_shape2(m.residual, "residual", p.T, p.K);
  check_shape2(m.fn, "fn", p.M, p.K);
  check_dtype(m.fn, "fn", {DType::kFloat32});
  check_vector(m.hc_scale, "hc_scale", 3, {DType::kFloat32});
  check_vector(m.hc_base, "hc_base", p.M, {DType::kFloat32});
  auto finite = [](float v, const char* name, bool nonneg) {
    MEGAMOE_CHECK(std::isfinite(v) && (!nonneg || v >= 0.0f), name, nonneg ? "a finite value >= 0" : "a finite value", v);
  };
  finite(m.rms_eps, "rms_eps", true);
  finite(m.hc_pre_eps, "hc_pre_eps", false);
  finite(m.hc_sinkhorn_eps, "hc_sinkhorn_eps", true);
  finite(m.hc_post_mult_value, "hc_post_mult_value", false);
  finite(m.norm_eps, "norm_eps", true);
  MEGAMOE_CHECK(m.sinkhorn_repeat >= 1 && m.sinkhorn_repeat <= 65536, "sinkhorn_repeat", "1 to 65536 rounds",
                m.sinkhorn_repeat);
  if (m.pre_mix_in) {
    check_shape2(*m.pre_mix_in, "pre_mix_in", p.T, p.hc);
    check_dtype(*m.pre_mix_in, "pre_mix_in", {DType::kFloat32});
  }
  check_shape2(m.post_mix, "post_mix", p.T, p.hc);
  check_dtype(m.post_mix, "post_mix", {DType::kFloat32});
  check_shape2(m.comb_mix, "comb_mix", p.T, int64_t{p.hc} * p.hc);
  check_dtype(m.comb_mix, "comb_mix", {DType::kFloat32});
  if (m.pre_mix) {
    check_shape2(*m.pre_mix, "pre_mix", p.T, p.hc);
    check_dtype(*m.pre_mix, "pre_mix", {DType::kFloat32});
  }
  if (m.layer_input) {
    check_shape2(*m.layer_input, "layer_input", p.T, p.H);
    check_dtype(*m.layer_input, "layer_input", {DType::kBFloat16});
  }
  if (m.y) {
    check_shape2(*m.y, "y", p.T, p.H);
    check_dtype(*m.y, "y", {DType::kBFloat16});
  }
  // The staging of the normalized rows: y when written, else a [T, H] bf16 view of the
  // residual's first stream stands in (their shape and dtype, memory of the call).
  const TensorRef first(m.residual.data, DType::kBFloat16, {p.T, p.H}, {m.residual.strides[0], m.residual.strides[1]},
                        m.residual.device);
  p.stage = validate_staged_rows(m.y ? *m.y : first, m.y ? "y" : "residual", s);
  p.misaligned = check_memory(named_tensors(m, s), m.residual.device);
  return p;
}

}  // namespace detail


}  // namespace megamoe
