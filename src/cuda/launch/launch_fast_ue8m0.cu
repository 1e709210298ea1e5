// launch_fast_ue8m0.cu: the fast kernel's instantiations for the formats with UE8M0
// scales (the registry's rows with sf UE8M0 and fast group sizes). Split from
// launch_fast_fp32_nvfp4.cu so that the two compile in parallel.
#include "cuda/launch/launch_fast.cuh"

namespace megamoe {
namespace cuda {

void launch_fast_ue8m0(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  launch_fast_unit<true>(plan, a, p, stream);
}

}  // namespace cuda
}  // namespace megamoe
