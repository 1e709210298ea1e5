/// @file router.h
/// @brief The fused DeepSeek-V4 router: from router logits to the public top-k and to the
/// MegaMoE staging buffers in one call (on CUDA: one kernel launch).
///
/// T = tokens, E = routed experts (1..512), K = top_k (1..16, K <= E), V = vocabulary rows
/// of a hash table, R = replica slots of the EPLB map, P = physical experts.
///
/// Per token t (docs/ROUTER.md has every rule and its reasons):
///  1. s_e = sqrt(softplus(logit_e)) in fp32, softplus(x) = x for x > 20, else
///     log1p(exp(x)). exp and log1p are the library's own (correctly rounded for every
///     fp32 input, verified exhaustively: bench/router_accuracy.cpp), sqrt is IEEE; a NaN
///     logit gives s = NaN.
///  2. Selection (not for hash layers): the K largest b_e = fl(s_e + bias_e), ties to the
///     lowest expert id, +0 == -0, a NaN b never chosen while a number remains (NaNs last,
///     among themselves by id). k = 0..K-1 is the selection order (descending b).
///     Hash layers (tid2eid given): id_k = tid2eid[input_ids[t], k], no selection.
///  3. Weights: sum = s_0 + s_1 + ... + s_{K-1} (fp32, in k order), d = max(sum, 1e-20)
///     (a NaN sum stays NaN, like torch.clamp), w_k = fl(s_k / d), and with a
///     routed_scaling_factor alpha w_k = fl(fl(s_k / d) * alpha).
///     Every NaN weight is written as the quiet NaN 0x7FC00000 (CPUs and GPUs propagate
///     NaN payloads differently; the bytes must not differ).
///  4. EPLB (optional): the logical id l at flat position p = t*K + k becomes
///     logical_to_physical_map[l, p % c] with c = logical_replica_count[l] clamped to
///     [1, R]; when *record_enabled != 0, expert_load_view[physical] += 1 for every kept
///     entry whose physical id is in [0, P) (device atomics on CUDA, no host sync).
///  5. Padded tokens (is_padding nonzero): ids -1, weights +0.0, not mapped, not recorded.
///
/// Device data the host cannot check (it is never read on the host for CUDA tensors):
///  - logical_replica_count values outside [1, R] are clamped to [1, R];
///  - physical ids read from logical_to_physical_map are written as they are (vLLM uses -1
///    for unused slots); those outside [0, P) are not recorded;
///  - a hash layer's input_ids[t] outside [0, V) makes the whole token behave as padded
///    (ids -1, weights +0.0, nothing recorded); a tid2eid entry outside [0, E) gives id -1
///    and weight +0.0 for that entry and adds nothing to the sum.
/// Nothing is ever read or written out of bounds, whatever those values are.
///
/// Non-finite detection: with nonfinite_count given, the number of NaN and +-Inf logits
/// (all T x E, padded tokens included, in every mode) is added to it.
///
/// Tensors may have any strides; outputs must not overlap inputs or each other. A rejected
/// call throws megamoe::Error and writes nothing. T == 0 returns at once (route_and_stage
/// in full-buffer mode still fills the staged top-k buffers' tail).
#pragma once

#include <cstdint>
#include <optional>

#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "megamoe/tensor.h"

namespace megamoe {

/// @brief Every input and output of a router call. The names follow vLLM's DeepSeek-V4 /
/// EPLB code (router_logits, e_score_correction_bias, tid2eid, input_ids,
/// logical_to_physical_map, logical_replica_count, expert_load_view, record_enabled), so
/// a binding can pass the engine's tensors by the same names.
struct RouterArgs {
  /// [T, E] fp32 or bf16: the gate's logits (E <= 512).
  TensorRef router_logits;
  /// Optional [E] fp32 or bf16: the selection bias (DeepSeek's e_score_correction_bias).
  /// Absent: b_e = s_e. Must be absent for hash layers (they have none).
  std::optional<TensorRef> e_score_correction_bias;
  /// K: experts per token, 1..16 and <= E (and == tid2eid.shape[1] for hash layers).
  int64_t top_k = 0;
  /// Optional routed scaling factor alpha (finite), as StageArgs::routed_scaling_factor:
  /// kept weights become fl(w * alpha). Absent: no scaling (the bytes of alpha = 1, which
  /// changes no weight). DeepSeek-V4: 1.5.
  std::optional<float> routed_scaling_factor;
  /// out [T, K] int32 or int64: the chosen experts, physical ids when EPLB is given, -1
  /// on padded tokens.
  TensorRef topk_ids;
  /// out [T, K] fp32: their weights, +0.0 on padded tokens.
  TensorRef topk_weights;
  /// Hash layers (DeepSeek-V4's first layers): [V, K] int32 table; given together with
  /// input_ids. The ids come from the table, the weights from the logits as above.
  std::optional<TensorRef> tid2eid;
  /// Hash layers: [T] int32 or int64 token ids (rows of tid2eid).
  std::optional<TensorRef> input_ids;
  /// EPLB (all four or none): [E, R] int32, the physical replicas of each logical expert.
  std::optional<TensorRef> logical_to_physical_map;
  /// EPLB: [E] int32, how many of a row's R slots are used (device data; clamped to [1, R]).
  std::optional<TensorRef> logical_replica_count;
  /// EPLB: in/out [P] int32 or int64, per-physical-expert token counts (added to).
  std::optional<TensorRef> expert_load_view;
  /// EPLB: one-element int32 flag on the device (0-D, [1] or [1, 1]), read by the device:
  /// nonzero = record into expert_load_view this call (graph safe: may change between replays).
  std::optional<TensorRef> record_enabled;
  /// Optional in/out one-element int64: the number of NaN and +-Inf logits is added to it.
  /// Distinct from StageArgs::nonfinite_count (that one counts the hidden states).
  std::optional<TensorRef> nonfinite_count;
  /// route() only: optional [T] bool/uint8 padding mask (nonzero = padded). route_and_stage
  /// takes the mask from StageArgs::is_padding and rejects this one.
  std::optional<TensorRef> is_padding;
  /// route() only: CUDA programmatic dependent launch (route_and_stage uses
  /// StageArgs::enable_pdl).
  bool enable_pdl = false;
};

/// @brief Route and stage in one call: validate both argument sets, then compute the router
/// (RouterArgs) and the staging (StageArgs) on the tensors' device; on CUDA one kernel
/// launch quantizes the hidden states and routes the tokens side by side.
///
/// StageArgs is used as for prepare_inputs, except:
///  - its topk_ids / topk_weights inputs are ignored (leave them empty): the router's
///    outputs take their place, so topk_idx_out = the (physical) ids widened to int64 and
///    topk_weights_out = the router's weights (padded and full-buffer tail rows -1 / +0.0);
///  - its routed_scaling_factor must be absent (RouterArgs::routed_scaling_factor applies);
///  - its is_padding is the padding mask of both (RouterArgs::is_padding must be absent);
///  - its nonfinite_count counts the hidden states, RouterArgs::nonfinite_count the logits.
/// Every format, shared_x_sf, full-buffer mode and enable_pdl apply as documented in stage.h.
/// The bytes equal those of route() followed by prepare_inputs() with the router's outputs
/// as topk_ids / topk_weights.
/// @throws megamoe::Error on any invalid argument, before anything is written.
void route_and_stage(const RouterArgs& router, const StageArgs& stage, Stream stream = nullptr);

/// @brief The router alone: writes topk_ids / topk_weights (and the EPLB load, the counter).
/// @throws megamoe::Error on any invalid argument, before anything is written.
void route(const RouterArgs& router, Stream stream = nullptr);

/// @brief Only the argument checks of route_and_stage (@p stage non-null) or route().
void validate_router(const RouterArgs& router, const StageArgs* stage = nullptr);

/// @brief route_and_stage without exceptions: the Status of the call (its message is the
/// Error's text).
Status try_route_and_stage(const RouterArgs& router, const StageArgs& stage, Stream stream = nullptr) noexcept;
/// @brief route without exceptions.
Status try_route(const RouterArgs& router, Stream stream = nullptr) noexcept;

}  // namespace megamoe
