/// @file shapes.h
/// @brief The one shape rule of the staging outputs. The validator, the CLI, the Python
/// package (megamoe.output_shapes) and the tests all ask it, so a format's layout is
/// declared once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "megamoe/quant.h"
#include "megamoe/tensor.h"

namespace megamoe {

/// @brief Shape and canonical dtype of one output (ndim 1 or 2).
struct TensorSpec {
  DType dtype = DType::kUInt8;   ///< the dtype allocators should use
  int ndim = 2;                  ///< 1 or 2
  int64_t shape[2] = {0, 0};     ///< sizes (shape[1] unused when ndim == 1)
  /// @brief Number of elements.
  int64_t numel() const noexcept { return ndim == 1 ? shape[0] : shape[0] * shape[1]; }
  /// @brief Shape as text, e.g. "(4096, 56)".
  std::string shape_str() const;
};

/// @brief What a staging call with these sizes and scheme writes.
struct OutputShapes {
  TensorSpec x_q;               ///< [T, H] fp8 (also uint8), [T, H/2] uint8 (also int8) for fp4, [T, H] bf16 for bf16
  TensorSpec x_sf;              ///< [T, H/(4G)] int32 (packed UE8M0 / e4m3), [T, H/G] float32, or [T, 0] (bf16: no scales)
  TensorSpec topk_idx_out;      ///< [T, K] int64
  TensorSpec topk_weights_out;  ///< [T, K] float32
  std::optional<TensorSpec> shared_x_sf;  ///< [ceil(T/bm)*align(bm,128), H/(4G)] int32, the minimum rows
  std::optional<TensorSpec> x_scales;     ///< [T] float32 (NVFP4 per-token only)
  std::optional<TensorSpec> global_scale;  ///< [1] float32: NVFP4 static's input, NVFP4 online's output
  bool global_scale_out = false;           ///< global_scale is written (NVFP4 online), not read
};

/// @brief The outputs of staging T tokens of hidden size H with top-k K under @p scheme
/// (and a shared-expert copy for block M @p shared_block_m when given). Full-buffer mode
/// (StageArgs::full_buffer): pass the buffers' row count M as T; the outputs then have the
/// M rows the call takes (shared_x_sf at least the rows it needs): the tokens' rows are
/// written, the top-k tail filled.
/// Every size is computed with checked arithmetic.
/// @throws megamoe::Error (kInvalidArgument) for a rejected scheme, H not a multiple of 128,
///   negative sizes, shared staging with non-UE8M0 scales or shared_block_m <= 0, or sizes
///   that overflow int64.
OutputShapes output_shapes(int64_t T, int64_t H, int64_t K, const QuantScheme& scheme,
                           std::optional<int64_t> shared_block_m = std::nullopt);

}  // namespace megamoe
