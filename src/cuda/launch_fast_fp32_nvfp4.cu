// launch_fast_fp32_nvfp4.cu: the fast kernel's instantiations for fp8 with fp32 scales
// (G 32 and 128) and NVFP4 static (G 16).
#include "cuda/launch_fast.cuh"

namespace megamoe {
namespace cuda {

void launch_fast_fp32_nvfp4(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  using core::Format;
  if (plan.fmt == Format::kNvfp4Static) return fast_by_input<Format::kNvfp4Static, 16>(plan, a, p, stream);
  if (plan.G == 32) return fast_by_input<Format::kFp8Fp32, 32>(plan, a, p, stream);
  fast_by_input<Format::kFp8Fp32, 128>(plan, a, p, stream);
}

}  // namespace cuda
}  // namespace megamoe
