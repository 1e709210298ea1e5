/// @file plan.h
/// @brief What a staging call would launch, as text: for logs, bug reports and tuning.
#pragma once

#include <string>

#include "megamoe/stage.h"

namespace megamoe {

/// @brief Validate @p args (as prepare_inputs would) and describe what staging them runs,
/// without running it.
///
/// CUDA tensors: "cuda backend: kernel=... format=... in=... G=... index=... shape=...
/// threads=... grid=... quant_blocks=... stores=... pdl=... nonfinite=... vectorized=..."
/// (the kernel choice, made from the tensors' layout and the device's SM count and
/// compute capability). CPU tensors: "cpu backend: ...". A build without the CUDA backend
/// says so for CUDA tensors. The text is for people: its wording may change between versions.
/// @throws megamoe::Error for invalid arguments (the same checks as prepare_inputs) or a
///   failing CUDA device query.
std::string explain(const StageArgs& args);

}  // namespace megamoe
