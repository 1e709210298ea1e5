// launch_fast_fp32_nvfp4.cu: the fast kernel's instantiations for the formats without
// UE8M0 scales (fp32 and e4m3 scale rows with fast group sizes: fp8 with fp32 scales,
// NVFP4 static).
#include "cuda/launch/launch_fast.cuh"

namespace megamoe {
namespace cuda {

void launch_fast_fp32_nvfp4(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  launch_fast_unit<false>(plan, a, p, stream);
}

}  // namespace cuda
}  // namespace megamoe
