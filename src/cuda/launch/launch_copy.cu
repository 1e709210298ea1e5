// launch_copy.cu: the bf16 pass-through kernel's instantiations (copy_bf16.cuh): the three
// input dtypes, vectorized rows or any strides, with and without the non-finite counter.
#include <type_traits>

#include "cuda/kernels/copy_bf16.cuh"
#include "cuda/launch/launch_util.cuh"

namespace megamoe {
namespace cuda {
namespace {

template <int In, bool kVec>
void copy_go(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  const Params64 prm = make_params<int64_t>(a, p, plan);
  if (plan.count_nonfinite) return launch_kernel(stage_copy_kernel<In, kVec, true>, prm, plan, stream);
  launch_kernel(stage_copy_kernel<In, kVec, false>, prm, plan, stream);
}

template <int In>
void copy_by_layout(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  if (plan.vectorized) return copy_go<In, true>(plan, a, p, stream);
  copy_go<In, false>(plan, a, p, stream);
}

}  // namespace

void launch_copy(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  switch (in_kind(plan.in)) {
    case kInBF16: return copy_by_layout<kInBF16>(plan, a, p, stream);
    case kInF16: return copy_by_layout<kInF16>(plan, a, p, stream);
    default: return copy_by_layout<kInF32>(plan, a, p, stream);
  }
}

}  // namespace cuda
}  // namespace megamoe
