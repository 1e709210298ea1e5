/// @file stage.h
/// @brief MegaMoE input staging: quantize hidden states to fp8, repack router top-k.
///
/// T = tokens, H = hidden size (multiple of 128), K = top-k, G = group size.
///
/// | tensor            | shape              | dtype                         |
/// |-------------------|--------------------|-------------------------------|
/// | hidden_states     | [T, H]             | bf16, fp16, fp32              |
/// | topk_weights      | [T, K]             | fp32, bf16, fp16              |
/// | topk_ids          | [T, K]             | int32, int64                  |
/// | is_padding (opt.) | [T]                | bool, uint8 (nonzero = pad)   |
/// | x_q (out)         | [T, H] fp8, [T, H/2] fp4 | float8_e4m3fn or uint8; fp4: uint8 or int8 |
/// | x_sf (out)        | [T, H/(4G)] int32 (UE8M0 or e4m3 bytes) or [T, H/G] float32 (fp32) |
/// | topk_idx_out      | [T, K]             | int64                         |
/// | topk_weights_out  | [T, K]             | float32                       |
/// | shared_x_sf (opt.)| [R, H/(4G)]        | int32 (UE8M0 only)            |
///
/// Layouts:
///  - x_sf (UE8M0): byte j (little-endian) of word w of token t = exponent of group 4w+j.
///  - shared_x_sf: with bm = shared_block_m, abm = bm rounded up to 128, m = t % bm, token t
///    goes to row (t/bm)*abm + (m/128)*128 + (m%32)*4 + (m%128)/32 and that row receives a
///    copy of x_sf[t]; unmapped rows are untouched; R >= ceil(T/bm)*abm.
///  - topk_idx_out[t,k] = -1 and topk_weights_out[t,k] = +0.0f for padded tokens, else the
///    input id widened to int64 and the input weight as fp32 (times the routed scaling
///    factor, then the expert's scale, when the call has them).
///
/// All strides are free (any sign, transposed views included); outputs must not overlap
/// inputs or each other. A rejected call throws megamoe::Error and writes nothing.
#pragma once

#include <cstdint>
#include <optional>

#include "megamoe/error.h"
#include "megamoe/quant.h"
#include "megamoe/shapes.h"
#include "megamoe/tensor.h"

namespace megamoe {

/// @brief Opaque CUDA stream handle (a cudaStream_t); nullptr = the legacy default stream.
using Stream = void*;

/// @brief Every input and output of one staging call.
struct StageArgs {
  TensorRef hidden_states;     ///< [T, H] activations to quantize
  TensorRef topk_weights;      ///< [T, K] router weights
  TensorRef topk_ids;          ///< [T, K] router expert ids
  TensorRef x_q;               ///< out: [T, H] fp8 e4m3 values, or [T, H/2] packed e2m1 (fp4)
  TensorRef x_sf;              ///< out: scales, layout per scheme (see file comment)
  TensorRef topk_idx_out;      ///< out: [T, K] int64 ids, -1 on padded tokens
  TensorRef topk_weights_out;  ///< out: [T, K] fp32 weights, 0 on padded tokens
  std::optional<TensorRef> is_padding;    ///< optional [T] mask, nonzero = padded
  std::optional<TensorRef> shared_x_sf;   ///< optional out: shared-expert scale copy
  std::optional<int64_t> shared_block_m;  ///< block M of shared_x_sf; given iff shared_x_sf is
  QuantScheme hidden_quant = QuantScheme::mxfp8();  ///< quantization scheme
  /// NVFP4 static only (required there): a one-element fp32 tensor (0-D, [1] or [1, 1]),
  /// the second-level scale gs, read on
  /// the device (graph safe: the value may change between replays).
  /// NVFP4 online (required there): the same tensor as an output, written with the gs the
  /// call computes from the whole of hidden_states.
  std::optional<TensorRef> global_scale;
  /// NVFP4 per-token only (required there): out [T] fp32 per-token second-level scales.
  std::optional<TensorRef> x_scales;
  /// Optional in/out one-element int64 tensor (0-D, [1] or [1, 1]) on the tensors' device: the number of NaN and
  /// +-Inf elements of hidden_states is added to it (device atomics, no host sync).
  std::optional<TensorRef> nonfinite_count;
  /// Full-buffer mode (symmetric-memory / SM90 consumers): every output has the same
  /// M >= T rows (M = max_tokens = topk_idx_out.shape[0]); in the same launch, rows T..M-1
  /// of topk_idx_out / topk_weights_out become -1 / +0.0 on every call (graph safe), and
  /// rows T..M-1 of x_q / x_sf / x_scales are left untouched. With T == 0 the whole top-k
  /// buffer is filled.
  bool full_buffer = false;
  /// Optional routed scaling factor alpha (finite): kept weights become fl(w * alpha);
  /// padded and tail rows stay +0.0. A NaN weight keeps its bits; the NaN a product makes
  /// (+-Inf times 0) is 0x7FC00000 on every backend.
  std::optional<float> routed_scaling_factor;
  /// Optional per-expert scales (SGLang's DeepGEMM pre-dispatch `expert_scales`): a 1-D
  /// fp32 tensor [E], any stride, on the tensors' device. A kept entry whose id is in
  /// [0, E) gets weight fl(w' * expert_scales[id]), w' the weight after the routed scaling
  /// factor (two fp32 roundings when both are given, in that order); an id outside [0, E)
  /// keeps w' (DeepGEMM skips negative ids; larger ones it would read past the table).
  /// NaN rules as routed_scaling_factor. Padded and tail rows stay +0.0.
  std::optional<TensorRef> expert_scales;
  /// CUDA only: launch with programmatic dependent launch (overlaps the previous kernel's
  /// tail on sm_90+; ignored elsewhere). Safe inside CUDA graphs.
  bool enable_pdl = false;
};

/// @brief A routing-only call (vLLM's stage_megamoe_routing: the activations were already
/// quantized by their producer): top-k repack, padding mask, full-buffer tail, scaling.
struct RoutingArgs {
  TensorRef topk_weights;      ///< [T, K] fp32, bf16, fp16
  TensorRef topk_ids;          ///< [T, K] int32, int64
  TensorRef topk_idx_out;      ///< out: [M, K] int64 (M = T unless full_buffer)
  TensorRef topk_weights_out;  ///< out: [M, K] fp32
  std::optional<TensorRef> is_padding;        ///< optional [T] mask, nonzero = padded
  bool full_buffer = false;                   ///< as StageArgs::full_buffer
  std::optional<float> routed_scaling_factor; ///< as StageArgs::routed_scaling_factor
  std::optional<TensorRef> expert_scales;     ///< as StageArgs::expert_scales
  bool enable_pdl = false;                    ///< as StageArgs::enable_pdl
};

/// @brief Validate @p args and stage them on the tensors' device.
///
/// CPU tensors run synchronously on the calling thread (plus worker threads for large T).
/// CUDA tensors are launched on @p stream of the tensors' device without host
/// synchronization or device allocation (CUDA-graph capture safe). T == 0 returns at once.
/// @param args    inputs, outputs and options.
/// @param stream  CUDA stream (ignored for CPU tensors).
/// @throws megamoe::Error on any invalid argument, before anything is written.
void prepare_inputs(const StageArgs& args, Stream stream = nullptr);

/// @brief Run only the argument checks of prepare_inputs (throws megamoe::Error).
void validate(const StageArgs& args);

/// @brief Routing-only staging: validate @p args, then repack on the tensors' device.
/// @throws megamoe::Error on any invalid argument, before anything is written.
void stage_routing(const RoutingArgs& args, Stream stream = nullptr);

/// @brief Non-throwing forms for callers built without exceptions in their own code: the
/// same work, and a Status (ok, or the code and message of the Error) instead of a throw.
Status try_prepare_inputs(const StageArgs& args, Stream stream = nullptr) noexcept;
/// @brief Non-throwing validate().
Status try_validate(const StageArgs& args) noexcept;
/// @brief Non-throwing stage_routing().
Status try_stage_routing(const RoutingArgs& args, Stream stream = nullptr) noexcept;

/// @brief True when this build contains the CUDA backend.
bool has_cuda_backend() noexcept;

}  // namespace megamoe
