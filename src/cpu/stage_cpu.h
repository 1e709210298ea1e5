// stage_cpu.h: the CPU backend (the embedded default).
#pragma once

#include "megamoe/stage.h"
#include "validate.h"

namespace megamoe {
namespace cpu {

/// Stage validated @p args on the host (any strides; threads for large problems).
void prepare_inputs(const StageArgs& args, const detail::Problem& p);

}  // namespace cpu
}  // namespace megamoe
