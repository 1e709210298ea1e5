// route_fused_f16.cu: the fused router + staging kernel's variants for f16 hidden states
// (route_fused.cuh).
#include "cuda/launch/route_fused.cuh"

namespace megamoe {
namespace cuda {

void route_fused_f16(const Plan& pl, const StageArgs& a, const detail::Problem& p, const RouterParams& rp,
                     bool decode, cudaStream_t stream) {
  visit_fused_format<FusedLaunch, kInF16>(pl, FusedLaunch{pl, a, p, rp, decode, stream});
}

}  // namespace cuda
}  // namespace megamoe
