// norm_inputs.h: the norm form's inputs of megamoe-stage (--rmsnorm-weight, --residual):
// generated, or a tensor of the --input file, or a tensor of a safetensors file of its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "stage_inputs.h"

namespace megamoe_cli {

/// The weight and the optional residual of megamoe::rmsnorm_and_stage, with where each came from.
struct NormInputs {
  Tensor weight;                   ///< [H] BF16 or F32
  std::optional<Tensor> residual;  ///< [T, H] BF16
  std::string weight_source;       ///< "generated (ones)", "--input tensor 'w'", "FILE tensor 'w'"
  std::string residual_source;     ///< as weight_source; empty without a residual
};

/// The names --save-inputs gives the weight and the residual (the specs that read them back
/// with --input).
constexpr const char* kSavedWeightName = "rmsnorm_weight";
constexpr const char* kSavedResidualName = "residual";

/// The file a spec names, when it names one: SPEC itself or the FILE of FILE:TENSOR, if that
/// exists; else empty. A word (ones, random) or a tensor of @p in's file names no file.
std::string norm_spec_file(const std::string& spec, const StageInputs& in);

/// Resolve @p weight_spec and @p residual_spec (empty: no residual) for the rows of @p in
/// (whose hidden_states must be BF16: they are the norm's x). A spec is, in this order:
///   ones / random        generated (weight only for ones): ones = 1.0, random = bf16 of
///                        uniform [0.5, 1.5) (weight) or of randn * 17 (residual), from a
///                        std::mt19937 seeded with seed + 2 (weight) or seed + 3 (residual);
///   NAME                 a tensor of the --input file (in.others);
///   FILE or FILE:NAME    a safetensors file: its tensor NAME, or without one its only tensor
///                        or the one named as --save-inputs names it.
/// Throws CliError naming the option, the file and the tensor on anything else: a spec that
/// is none of these, a wrong dtype (weight BF16 or F32, residual BF16), rank or shape.
NormInputs load_norm_inputs(const std::string& weight_spec, const std::string& residual_spec, const StageInputs& in,
                            const std::string& input_path, uint32_t seed);

}  // namespace megamoe_cli
