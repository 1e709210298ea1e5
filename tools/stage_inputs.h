// stage_inputs.h: the staging inputs of megamoe-stage: generated (DeepSeek-V4 shaped) or
// read from a safetensors file, and written back out with --save-inputs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "safetensors.h"

namespace megamoe_cli {

/// hidden_states [T, H], topk_ids [T, K], topk_weights [T, K], is_padding [T] (optional).
struct StageInputs {
  Tensor hidden_states;
  Tensor topk_ids;
  Tensor topk_weights;
  std::optional<Tensor> is_padding;
  std::map<std::string, std::string> metadata;  ///< the file's __metadata__ (--input), else empty
  /// The file's other tensors (--input), by name: the norm form's --rmsnorm-weight and
  /// --residual may name one of them.
  std::map<std::string, Tensor> others;

  int64_t T() const { return hidden_states.shape[0]; }
  int64_t H() const { return hidden_states.shape[1]; }
  int64_t K() const { return topk_ids.shape[1]; }
};

/// fp32 -> bf16 bits, round to nearest even (for the generated values, which are finite).
uint16_t float_to_bf16(float f);

/// What to generate.
struct GenOptions {
  int64_t tokens = 4096;
  int64_t hidden = 7168;
  int64_t topk = 8;
  int64_t experts = 256;
  int64_t pad_every = 5;
  uint32_t seed = 0;
};

/// hidden = bf16(randn * 17) (std::mt19937 seeded with seed + std::normal_distribution, row-major order),
/// topk_ids = K distinct int32 experts in [0, experts) per token, topk_weights = fp32 uniform
/// in [0.01, 1), is_padding = BOOL, token t padded when (t + 1) % pad_every == 0 (absent when
/// pad_every == 0). Throws CliError when topk > experts, or when a tensor's byte count does
/// not fit in int64 or cannot be allocated.
StageInputs generate_inputs(const GenOptions& o);

/// Read hidden_states (BF16/F16/F32), topk_ids (I32/I64), topk_weights (F32/BF16/F16) and
/// optional is_padding (BOOL/U8) from @p path; throws CliError naming the file and tensor on
/// a missing tensor, wrong dtype, wrong rank or shape, or inconsistent token counts.
StageInputs load_inputs(const std::string& path);

/// The fused router's generated inputs (megamoe-stage --router).
struct RouterInputs {
  Tensor logits;  ///< [T, E] F32 or BF16: randn * 2
  Tensor bias;    ///< [E] F32: randn * 0.5 (the selection bias)
};

/// logits [T, E] (bf16: rounded to nearest even) and bias [E], from a std::mt19937 seeded
/// with seed + 1 (the staging inputs use seed itself), row-major order, logits first.
RouterInputs generate_router_inputs(const GenOptions& o, bool bf16_logits);

/// Write the inputs to @p path in the layout load_inputs reads, then the tensors of
/// @p extra (the norm form's weight and residual, under the names its options take).
/// @p metadata goes to the file's __metadata__.
void save_inputs(const std::string& path, const StageInputs& in,
                 const std::map<std::string, std::string>& metadata = {},
                 const std::vector<std::pair<std::string, const Tensor*>>& extra = {});

}  // namespace megamoe_cli
