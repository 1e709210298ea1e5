// contract/validate.h: the one argument validator behind both backends.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/format_list.h"
#include "megamoe/gate.h"
#include "megamoe/mhc.h"
#include "megamoe/norm.h"
#include "megamoe/router.h"
#include "megamoe/stage.h"

namespace megamoe {
namespace detail {

/// Sizes and options resolved from validated StageArgs.
struct Problem {
  int64_t T = 0;        ///< tokens
  int64_t H = 0;        ///< hidden size
  int64_t K = 0;        ///< top-k
  int64_t G = 0;        ///< group size
  int64_t sf_cols = 0;  ///< scale-row width of x_sf (words or floats)
  int64_t xq_cols = 0;  ///< row width of x_q in bytes (H, or H/2 for fp4)
  core::Format fmt = core::Format::kFp8Ue8m0;  ///< launch-table row
  QuantScheme scheme;   ///< the scheme staged (after the MXFP4 drop-in rule)
  float floor = 1e-4f;  ///< amax floor
  bool ue8m0 = true;    ///< UE8M0 scales
  bool has_global = false;     ///< global_scale given (NVFP4 static)
  bool has_x_scales = false;   ///< x_scales given (NVFP4 per-token)
  bool has_nonfinite = false;  ///< nonfinite_count given
  int64_t M = 0;               ///< rows of the top-k outputs (T, or max_tokens in full-buffer mode)
  bool full_buffer = false;    ///< rows T..M-1 of the top-k outputs are filled with -1 / +0.0
  bool has_alpha = false;      ///< kept weights are multiplied by alpha (one fp32 rounding)
  float alpha = 1.0f;          ///< routed scaling factor
  bool has_expert_scales = false;  ///< kept weights of ids in [0, E) times expert_scales[id]
  int64_t E = 0;                   ///< expert_scales' length
  bool routing_only = false;   ///< no activations: only the top-k repack runs
  bool has_padding = false;
  bool has_shared = false;
  int64_t shared_bm = 1;
  bool misaligned = false;  ///< a tensor's data pointer is off its element size (cuda/aligned.cuh)
};

/// Check everything the contract (docs/CONTRACT.md) requires; throws megamoe::Error before anything is written.
/// Returns the resolved problem (T == 0 is valid and means "nothing to do").
/// @p rows_described: hidden_states only describes rows a producer holds (shape, dtype,
/// device); its memory is neither required nor checked (device::stage_target).
Problem validate_args(const StageArgs& args, bool rows_described = false);
/// The same for a routing-only call.
Problem validate_routing(const RoutingArgs& args);
/// True when the call has work (T > 0, or a full-buffer tail to fill).
inline bool has_work(const Problem& p) { return p.T > 0 || (p.full_buffer && p.M > 0); }
/// The contract's early return, the one place it is stated: a call without tokens returns
/// before any further check unless a full-buffer tail is still to be filled (the
/// reference's behaviour; prepare_inputs, stage_routing and route_and_stage alike).
constexpr bool returns_at_once(int64_t T, bool full_buffer) { return T == 0 && !full_buffer; }

/// Sizes and options resolved from validated RouterArgs (route, or route_and_stage).
struct RouterProblem {
  int64_t T = 0;  ///< tokens (router_logits rows)
  int64_t E = 0;  ///< experts (router_logits columns)
  int64_t K = 0;  ///< top_k
  int64_t V = 0;  ///< tid2eid rows (hash layers)
  int64_t R = 0;  ///< logical_to_physical_map slots per expert (EPLB)
  int64_t P = 0;  ///< expert_load_view length (EPLB)
  bool hash = false;           ///< ids from tid2eid[input_ids]
  bool eplb = false;           ///< map to physical ids (and record when the flag says so)
  bool has_bias = false;       ///< e_score_correction_bias given
  bool has_padding = false;    ///< a padding mask (RouterArgs's for route, StageArgs's fused)
  bool has_nonfinite = false;  ///< RouterArgs::nonfinite_count given
  float alpha = 1.0f;          ///< routed scaling factor; 1 when absent (core::router_weight)
  bool fused = false;          ///< route_and_stage: stage below is the staging of the call
  bool misaligned = false;     ///< a tensor of the call off its element size (cuda/aligned.cuh)
  Problem stage;               ///< fused: the staging problem of staged_args(router, stage)
};

/// Check a router call (@p stage non-null: route_and_stage) and return its problem.
/// Throws megamoe::Error before anything is written; T == 0 returns at once unless the
/// fused call fills a full-buffer tail.
RouterProblem validate_router(const RouterArgs& r, const StageArgs* stage);
/// The staging a fused call performs: @p s with the router's outputs as its top-k inputs.
StageArgs staged_args(const RouterArgs& r, const StageArgs& s);
/// The router's padding mask: RouterArgs::is_padding for route, StageArgs::is_padding fused
/// (null when absent).
const TensorRef* router_padding(const RouterArgs& r, const StageArgs* stage);
/// True when a router call has work (tokens, or a fused full-buffer tail).
inline bool has_work(const RouterProblem& p) { return p.T > 0 || (p.fused && has_work(p.stage)); }

/// Sizes and options resolved from validated RmsNormArgs (rmsnorm_and_stage).
struct NormProblem {
  int64_t T = 0;               ///< rows of x
  int64_t H = 0;               ///< columns of x
  float eps = 0.0f;            ///< the norm's epsilon
  bool has_residual = false;   ///< residual given: z = bf16(x + residual)
  bool weight_f32 = false;     ///< fp32 weight (else bf16)
  bool misaligned = false;     ///< a tensor of the call off its element size
  Problem stage;               ///< the staging of staged_args(norm, stage)
};
/// Check an rmsnorm_and_stage call; throws megamoe::Error before anything is written.
NormProblem validate_norm(const RmsNormArgs& n, const StageArgs& s);
/// The staging the call performs: @p s with the normalized rows (@p y, a [T, H] bf16
/// tensor) as its hidden states.
StageArgs staged_args(const TensorRef& y, const StageArgs& s);
/// True when a norm call has work (rows, or a full-buffer tail).
inline bool has_work(const NormProblem& p) { return p.T > 0 || has_work(p.stage); }

/// Sizes and options resolved from validated GateArgs (gate_route_and_stage, gate_and_route).
struct GateProblem {
  int64_t T = 0;           ///< rows of y
  int64_t H = 0;           ///< columns of y and weight
  int64_t E = 0;           ///< rows of weight (experts)
  bool weight_f32 = false; ///< fp32 weight (else bf16)
  RouterProblem router;    ///< the router (and staging) on the gate's logits; its misaligned covers the gate's tensors
};
/// Check a gate call (@p stage non-null: gate_route_and_stage); throws megamoe::Error
/// before anything is written. T == 0 returns at once unless a full-buffer tail is filled.
GateProblem validate_gate(const GateArgs& g, const RouterArgs& r, const StageArgs* stage);
/// The router call a gate call makes: @p r with @p logits (a [T, E] fp32 tensor) as its
/// router_logits.
RouterArgs gated_router_args(const RouterArgs& r, const TensorRef& logits);
/// True when a gate call has work (tokens, or a fused full-buffer tail).
inline bool has_work(const GateProblem& p) { return has_work(p.router); }

/// Sizes and options resolved from validated MhcPreArgs (mhc_pre_and_stage).
struct MhcProblem {
  int64_t T = 0;               ///< tokens (rows of residual)
  int64_t H = 0;               ///< hidden size (norm_weight's length)
  int hc = 0;                  ///< streams (post_mix's width), 1..core::kMhcMaxStreams
  int64_t K = 0;               ///< hc * H: the mixed row's length (<= 2^24)
  int M = 0;                   ///< hc * (hc + 2): the mixes
  bool weight_f32 = false;     ///< fp32 norm weight (else bf16)
  bool misaligned = false;     ///< a tensor of the call off its element size
  Problem stage;               ///< the staging of staged_args(y, stage)
};
/// Check an mhc_pre_and_stage call; throws megamoe::Error before anything is written.
MhcProblem validate_mhc(const MhcPreArgs& m, const StageArgs& s);
/// True when an mHC call has work (tokens, or a full-buffer tail).
inline bool has_work(const MhcProblem& p) { return p.T > 0 || has_work(p.stage); }

/// Element offsets, relative to the data pointer, of a tensor's first and last elements in
/// address order: lo <= 0 <= hi (both 0 for an empty tensor).
struct Extent {
  int64_t lo = 0;
  int64_t hi = 0;
};
/// False when an offset does not fit in int64 (the validator rejects such tensors).
bool try_element_extent(const TensorRef& t, Extent* out);
/// For validated tensors (the validator has proven that the extent fits).
Extent element_extent(const TensorRef& t);

/// Every tensor of a call (optional ones when present), with its argument name.
struct NamedTensor {
  const TensorRef* t;
  const char* name;
  bool output;
  /// An output that may be this input given as the very same view (in place: the norm's y
  /// and x, residual_out and residual); any other overlap is rejected.
  const TensorRef* in_place_of = nullptr;
};
/// A non-empty tensor whose data pointer is not a multiple of its element size.
bool element_misaligned(const TensorRef& t);
/// @p t as its dense copy at @p data: the same shape, row-major strides (the CUDA backend's
/// copy of a tensor off its element size).
inline void move_to_dense(TensorRef& t, void* data) {
  t.data = data;
  if (t.ndim == 2) {
    t.strides[0] = t.shape[1];
    t.strides[1] = 1;
  } else if (t.ndim == 1) {
    t.strides[0] = 1;
  }
}
/// Every tensor of @p all off its element size redirected to a dense copy at place(n)
/// (move_to_dense; place sees the tensor as it was). @p all lists members of an argument
/// struct the caller owns and may change. Returns how many moved.
template <typename Place>
int move_misaligned_to_dense(const std::vector<NamedTensor>& all, Place place) {
  int moved = 0;
  for (const NamedTensor& n : all) {
    if (!element_misaligned(*n.t)) continue;
    void* at = place(n);
    move_to_dense(*const_cast<TensorRef*>(n.t), at);
    ++moved;
  }
  return moved;
}

std::vector<NamedTensor> named_tensors(const StageArgs& args);
std::vector<NamedTensor> named_tensors(const RoutingArgs& args);
/// An rmsnorm_and_stage call's tensors: the norm's and the staging's but its hidden states.
std::vector<NamedTensor> named_tensors(const RmsNormArgs& n, const StageArgs& s);
/// An mhc_pre_and_stage call's tensors: mHC's and the staging's but its hidden states.
std::vector<NamedTensor> named_tensors(const MhcPreArgs& m, const StageArgs& s);
/// A router call's tensors: the router's (outputs: the public top-k, the load, the counter)
/// and, for route_and_stage (@p stage non-null), the staging's but its top-k inputs.
std::vector<NamedTensor> named_tensors(const RouterArgs& args, const StageArgs* stage);

/// A gate call's tensors: y, weight, logits_out, then the router call's but its logits.
std::vector<NamedTensor> named_tensors(const GateArgs& g, const RouterArgs& r, const StageArgs* stage);

/// Byte address range [lo, hi) touched by a tensor (empty tensors: lo == hi).
struct Span {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
};
/// False when the span wraps around the address space or its byte offsets overflow.
bool try_byte_span(const TensorRef& t, Span* out);
/// For validated tensors.
Span byte_span(const TensorRef& t);

}  // namespace detail
}  // namespace megamoe
