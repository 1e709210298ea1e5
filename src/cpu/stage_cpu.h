// stage_cpu.h: the CPU backend (the embedded default).
#pragma once

#include "megamoe/stage.h"
#include "contract/validate.h"

namespace megamoe {
namespace cpu {

/// Stage validated @p args on the host (any strides; threads for large problems).
void prepare_inputs(const StageArgs& args, const detail::Problem& p);
/// rmsnorm_and_stage on the host (norm_cpu.cpp).
void rmsnorm_and_stage(const RmsNormArgs& norm, const StageArgs& stage, const detail::NormProblem& p);
/// mhc_pre_and_stage on the host (mhc_cpu.cpp).
void mhc_pre_and_stage(const MhcPreArgs& mhc, const StageArgs& stage, const detail::MhcProblem& p);

/// The top-k tensors of a call (pad may be null).
struct TopkIO {
  const TensorRef* w;
  const TensorRef* ids;
  const TensorRef* pad;
  const TensorRef* idx_out;
  const TensorRef* w_out;
  const TensorRef* expert_scales;  ///< nullable: [E] fp32 per-expert scales
};
TopkIO topk_io(const StageArgs& a);
TopkIO topk_io(const RoutingArgs& a);

/// Rows 0..M-1 of the top-k outputs: kept rows copied (widened, times alpha when given),
/// padded and tail rows (t >= T) set to -1 / +0.0.
void repack_topk(const TopkIO& io, const detail::Problem& p);

}  // namespace cpu
}  // namespace megamoe
