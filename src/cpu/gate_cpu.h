// gate_cpu.h: the gate's logits on the host (gate_cpu.cpp).
#pragma once

#include "contract/validate.h"
#include "megamoe/gate.h"

namespace megamoe {
namespace cpu {

/// The logits of a validated gate call into @p logits ([T, E] fp32, any strides), NaN as
/// 0x7FC00000; T > 0.
void gate_logits(const GateArgs& g, const detail::GateProblem& p, const TensorRef& logits);

/// Tests: run the portable chains even where the vector path exists (both give the same
/// bits; this shows it).
void gate_portable_only(bool on);

}  // namespace cpu
}  // namespace megamoe
