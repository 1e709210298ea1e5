/// @file norm.h
/// @brief The RMSNorm producer: optional residual add, RMSNorm with a weight, then the
/// staging of the normalized rows (every format), in one call.
///
/// Semantics (docs/CONTRACT.md "RMSNorm and stage"; vLLM's rms_norm / fused_add_rms_norm
/// with every rounding point fixed, so that the CPU and CUDA backends agree bit for bit):
///   z     = x                                   (no residual)
///   z     = bf16(fl(x + residual))              (with one; written to residual_out)
///   S     = sum of fl(z^2) over the row, in the fixed order of the contract
///   s     = fl(1 / sqrt_rn(fl(fl(S / H) + eps)))
///   y     = bf16(fl(bf16(fl(z * s)) * w))       (w the weight, bf16 or fp32)
/// then y is staged exactly as prepare_inputs would stage it (the bytes are equal).
#pragma once

#include <optional>

#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "megamoe/tensor.h"

namespace megamoe {

/// @brief The norm's inputs and its optional outputs.
struct RmsNormArgs {
  TensorRef x;                            ///< [T, H] bf16: the rows to normalize (vLLM's input)
  std::optional<TensorRef> residual;      ///< optional [T, H] bf16, added to x first
  TensorRef weight;                       ///< [H] bf16 or fp32
  float eps = 1e-6f;                      ///< finite, >= 0
  std::optional<TensorRef> y;             ///< optional out [T, H] bf16: the normalized rows (may be x itself)
  std::optional<TensorRef> residual_out;  ///< optional out [T, H] bf16: z (only with residual; may be residual itself)
};

/// @brief Normalize and stage in one call. StageArgs is used as for prepare_inputs, except
/// that its hidden_states is ignored (leave it empty): the normalized rows y take its place
/// (T and H come from x). Every format, the top-k repack, padding, full-buffer mode,
/// shared_x_sf, the non-finite counter (of y) and the routed scaling factor apply as in
/// stage.h. Outputs may not overlap inputs or each other, except y == x and residual_out
/// == residual given as the very same view (in place, as vLLM's fused_add_rms_norm).
/// @throws megamoe::Error on any invalid argument, before anything is written.
void rmsnorm_and_stage(const RmsNormArgs& norm, const StageArgs& stage, Stream stream = nullptr);

/// @brief Only the argument checks of rmsnorm_and_stage.
void validate_rmsnorm(const RmsNormArgs& norm, const StageArgs& stage);

/// @brief rmsnorm_and_stage without exceptions.
Status try_rmsnorm_and_stage(const RmsNormArgs& norm, const StageArgs& stage, Stream stream = nullptr) noexcept;

}  // namespace megamoe
