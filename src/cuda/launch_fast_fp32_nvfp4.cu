// launch_fast_fp4.cu: the fast kernel's fp4 instantiations (MXFP4 with both tie rules,
// G 32; NVFP4 static, G 16).
#include "cuda/launch_fast.cuh"

namespace megamoe {
namespace cuda {

void launch_fast_fp4(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  using core::Format;
  switch (plan.fmt) {
    case Format::kMxfp4: return fast_by_input<Format::kMxfp4, 32>(plan, a, p, stream);
    case Format::kMxfp4Rne: return fast_by_input<Format::kMxfp4Rne, 32>(plan, a, p, stream);
    default: return fast_by_input<Format::kNvfp4Static, 16>(plan, a, p, stream);
  }
}

}  // namespace cuda
}  // namespace megamoe
