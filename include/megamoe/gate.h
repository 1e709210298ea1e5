/// @file gate.h
/// @brief The gate producer: the router logits computed in the call from the hidden states
/// and the gate weight, then the fused router (router.h) and, for gate_route_and_stage,
/// the staging (stage.h), in one call.
///
/// Semantics (docs/CONTRACT.md "Gate, route and stage"; every rounding point fixed, so that
/// any backend and any split of the work gives the same bits):
///   logit[t, e] = the fp32 dot product of y[t, :] and weight[e, :] in this order:
///     the row is cut into n = ceil(H / 16) chunks of 16 columns (the last may be shorter);
///     c_j = fma(y, w, ... fma(y_16j+1, w_16j+1, fma(y_16j, w_16j, +0)))   (in column order,
///           each fma one rounding to nearest even, y and w widened exactly to fp32);
///     c_j = +0 for n <= j < N, N the power of two >= n; then for h = N/2, N/4, ..., 1:
///     c_j = fl(c_j + c_{j+h}) for j < h (the halves folded, highest first); logit = c_0.
/// The logits then take the place of RouterArgs::router_logits: scores, bias, hash layers,
/// EPLB, scaling, padding and the router's non-finite counter (which counts the NaN and
/// +-Inf logits, those that NaN or Inf in y or the weight give included) are the router's,
/// bit for bit; gate_route_and_stage stages as route_and_stage does.
#pragma once

#include <optional>

#include "megamoe/error.h"
#include "megamoe/router.h"
#include "megamoe/stage.h"
#include "megamoe/tensor.h"

namespace megamoe {

/// @brief The gate's inputs and its optional output. T and H come from y, E from weight.
struct GateArgs {
  TensorRef y;                          ///< [T, H] bf16: the gate's input rows (may be StageArgs::hidden_states itself)
  TensorRef weight;                     ///< [E, H] bf16 or fp32: the gate weight (E <= 512), row e = expert e
  std::optional<TensorRef> logits_out;  ///< optional out [T, E] fp32: the logits the router used
};

/// @brief Gate, route and stage in one call: logits from GateArgs, the router of
/// route_and_stage on them, then its staging. RouterArgs::router_logits must be empty (a
/// default TensorRef): the gate computes the logits. Everything else in RouterArgs and
/// StageArgs is used exactly as route_and_stage uses it (StageArgs::hidden_states has T
/// rows; its top-k inputs are ignored, its is_padding is the mask of both). The bytes equal
/// those of route_and_stage with router_logits = the logits of the contract.
/// Backends: the CPU and CUDA (the same bytes; on CUDA H <= 65536, else kUnsupported; graph
/// safe; StageArgs::enable_pdl, RouterArgs::enable_pdl for gate_and_route, applies to the gate
/// launch). Decode sizes (T <= 64) are its range: above, a GEMM then route_and_stage is faster.
/// A build without the CUDA backend refuses CUDA tensors (kUnsupported) before anything is written.
/// @throws megamoe::Error on any invalid argument, before anything is written.
void gate_route_and_stage(const GateArgs& gate, const RouterArgs& router, const StageArgs& stage,
                          Stream stream = nullptr);

/// @brief Gate and route without staging: route() on the gate's logits (RouterArgs::is_padding
/// is the padding mask, as for route()).
/// @throws megamoe::Error on any invalid argument, before anything is written.
void gate_and_route(const GateArgs& gate, const RouterArgs& router, Stream stream = nullptr);

/// @brief Only the argument checks of gate_route_and_stage (@p stage non-null) or gate_and_route.
void validate_gate(const GateArgs& gate, const RouterArgs& router, const StageArgs* stage = nullptr);

/// @brief gate_route_and_stage without exceptions.
Status try_gate_route_and_stage(const GateArgs& gate, const RouterArgs& router, const StageArgs& stage,
                                Stream stream = nullptr) noexcept;
/// @brief gate_and_route without exceptions.
Status try_gate_and_route(const GateArgs& gate, const RouterArgs& router, Stream stream = nullptr) noexcept;

}  // namespace megamoe
