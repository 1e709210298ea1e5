// launch_fast_fp8.cu: the fast kernel's fp8 instantiations (UE8M0 and fp32 scales, G 32
// and 128).
#include "cuda/launch_fast.cuh"

namespace megamoe {
namespace cuda {

void launch_fast_fp8(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  using core::Format;
  if (plan.fmt == Format::kFp8Ue8m0) {
    if (plan.G == 32) return fast_by_input<Format::kFp8Ue8m0, 32>(plan, a, p, stream);
    return fast_by_input<Format::kFp8Ue8m0, 128>(plan, a, p, stream);
  }
  if (plan.G == 32) return fast_by_input<Format::kFp8Fp32, 32>(plan, a, p, stream);
  fast_by_input<Format::kFp8Fp32, 128>(plan, a, p, stream);
}

}  // namespace cuda
}  // namespace megamoe
