/// @file mhc.h
/// @brief The mHC pre producer: DeepSeek-V4's manifold-constrained hyper-connection "pre"
/// step (hc_mult residual streams mixed into one layer input), RMSNorm of that input with
/// the layer's weight, then the staging of the normalized rows (every format), in one call.
///
/// Semantics (docs/CONTRACT.md "mHC pre and stage"; vLLM's mhc_pre_torch followed by the
/// layer's rms_norm, with every rounding point fixed so that backends agree bit for bit).
/// Per token, x = its hc streams side by side (hc H values), fp32 throughout:
///   r        = 1 / sqrt(mean(x^2) + rms_eps)        (sums in the contract's fixed order)
///   mix      = (fn x) * r                            (hc (hc + 2) dot products)
///   pre_j    = sigmoid(mix_j scale0 + base_j) + hc_pre_eps
///   post_j   = sigmoid(mix_hc+j scale1 + base_hc+j) * hc_post_mult_value
///   comb     = Sinkhorn(mix_2hc.. scale2 + base_2hc..)   (hc x hc, sinkhorn_repeat rounds)
///   z        = bf16(sum_j q_j x_j)                  (q = pre, or pre_mix_in when given)
///   y        = RMSNorm(z, norm_weight, norm_eps)     (rmsnorm_and_stage's rounding points)
/// then y is staged exactly as prepare_inputs would stage it (the bytes are equal).
#pragma once

#include <cstdint>
#include <optional>

#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "megamoe/tensor.h"

namespace megamoe {

/// @brief mHC pre's inputs, parameters and outputs. hc (hc_mult, 1..16; DeepSeek-V4 uses 4)
/// is post_mix's width; H is norm_weight's length (H % 128 == 0, as staging requires;
/// hc * H <= 2^24). Any strides; outputs may not overlap inputs or each other.
struct MhcPreArgs {
  /// [T, hc * H] bf16: each token's hc residual streams side by side (stream j in columns
  /// [j H, (j + 1) H)): vLLM's [T, hc, H] residual flattened, the row the mix GEMM reads.
  TensorRef residual;
  TensorRef fn;           ///< [hc (hc + 2), hc * H] fp32: the mix weight (vLLM's hc_fn)
  TensorRef hc_scale;     ///< [3] fp32: scales of the pre, post and comb logits
  TensorRef hc_base;      ///< [hc (hc + 2)] fp32: biases of the logits
  TensorRef norm_weight;  ///< [H] bf16 or fp32: the layer's RMSNorm weight
  float rms_eps = 1e-6f;             ///< finite, >= 0: the mixes' RMS epsilon
  float hc_pre_eps = 1e-6f;          ///< finite: added to the pre gates
  float hc_sinkhorn_eps = 1e-6f;     ///< finite, >= 0: Sinkhorn's epsilon
  float hc_post_mult_value = 2.0f;   ///< finite: the post gates' multiplier
  int64_t sinkhorn_repeat = 20;      ///< 1..65536 Sinkhorn rounds
  float norm_eps = 1e-6f;            ///< finite, >= 0: the RMSNorm's epsilon
  /// optional [T, hc] fp32: the weighted sum's coefficients instead of this step's pre gates
  /// (DeepSeek-V4.1's delayed form: the pre-mix computed by the previous sublayer).
  std::optional<TensorRef> pre_mix_in;
  TensorRef post_mix;                     ///< out [T, hc] fp32: the post gates
  TensorRef comb_mix;                     ///< out [T, hc * hc] fp32: the Sinkhorn matrix, row-major
  std::optional<TensorRef> pre_mix;       ///< optional out [T, hc] fp32: this step's pre gates
  std::optional<TensorRef> layer_input;   ///< optional out [T, H] bf16: z, before the norm
  std::optional<TensorRef> y;             ///< optional out [T, H] bf16: the normalized rows
};

/// @brief mHC pre, RMSNorm and staging in one call. StageArgs is used as for
/// prepare_inputs, except that its hidden_states is ignored (leave it empty): the
/// normalized rows y take its place (T comes from residual). Every format, the top-k
/// repack, padding, full-buffer mode, shared_x_sf, the non-finite counter (of y) and the
/// routed scaling factor apply as in stage.h. CPU and CUDA backends (the same bytes); on
/// CUDA one launch (two for NVFP4 online), hc * H <= 65536 (larger rows:
/// ErrorCode::kUnsupported), graph safe, stage.enable_pdl honoured. A build without the
/// CUDA backend refuses CUDA tensors (ErrorCode::kUnsupported).
/// @throws megamoe::Error on any invalid argument, before anything is written.
void mhc_pre_and_stage(const MhcPreArgs& mhc, const StageArgs& stage, Stream stream = nullptr);

/// @brief Only the argument checks of mhc_pre_and_stage.
void validate_mhc_pre(const MhcPreArgs& mhc, const StageArgs& stage);

/// @brief mhc_pre_and_stage without exceptions.
Status try_mhc_pre_and_stage(const MhcPreArgs& mhc, const StageArgs& stage, Stream stream = nullptr) noexcept;

}  // namespace megamoe
