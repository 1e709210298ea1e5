// launch_fast_ue8m0.cu: the fast kernel's instantiations for the formats with UE8M0
// scales (fp8 with G 32 and 128, MXFP4 with both tie rules). Split from
// launch_fast_fp32_nvfp4.cu so that the two compile in parallel.
#include "cuda/launch_fast.cuh"

namespace megamoe {
namespace cuda {

void launch_fast_ue8m0(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  using core::Format;
  switch (plan.fmt) {
    case Format::kMxfp4: return fast_by_input<Format::kMxfp4, 32>(plan, a, p, stream);
    case Format::kMxfp4Rne: return fast_by_input<Format::kMxfp4Rne, 32>(plan, a, p, stream);
    default:
      if (plan.G == 32) return fast_by_input<Format::kFp8Ue8m0, 32>(plan, a, p, stream);
      return fast_by_input<Format::kFp8Ue8m0, 128>(plan, a, p, stream);
  }
}

}  // namespace cuda
}  // namespace megamoe
