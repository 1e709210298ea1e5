// launch_other.cu: the general and row kernels' instantiations (every format of each, the
// three input dtypes, with and without the non-finite counter).
#include "cuda/launch/launch_util.cuh"
#include "cuda/kernels/quantize_generic.cuh"
#include "cuda/kernels/quantize_rowwise.cuh"
#include "formats/visit.h"

namespace megamoe {
namespace cuda {
namespace {

template <int In, core::Format F>
void generic_go(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  const Params64 prm = make_params<int64_t>(a, p, plan);
  if (plan.count_nonfinite) return launch_kernel(stage_generic_kernel<In, F, true>, prm, plan, stream);
  launch_kernel(stage_generic_kernel<In, F, false>, prm, plan, stream);
}

template <int In>
void generic_by_format(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  core::visit_format(plan.fmt, [&](auto f) {
    constexpr core::Format F = decltype(f)::value;
    // A row-scaled format (a whole row's amax before its groups) runs the row kernel only;
    // NVFP4 online runs as NVFP4 static (online_plan).
    if constexpr (core::row_scaled(F) || core::online_scaled(F)) {
      throw Error(ErrorCode::kInternal, "megamoe: no generic kernel for " + to_string(plan));  // (check_plan)
    } else {
      generic_go<In, F>(plan, a, p, stream);
    }
  });
}

template <int In, bool kCount>
void rowwise_split_go(const Plan& plan, const Params64& prm, cudaStream_t stream) {
  if (plan.row_split == 4) return launch_kernel(stage_rowwise_split_kernel<In, kCount, 4>, prm, plan, stream);
  launch_kernel(stage_rowwise_split_kernel<In, kCount, 2>, prm, plan, stream);
}

template <int In, bool kVec>
void rowwise_go(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  const Params64 prm = make_params<int64_t>(a, p, plan);
  if (kVec && plan.row_split > 1) {
    if (plan.count_nonfinite) return rowwise_split_go<In, true>(plan, prm, stream);
    return rowwise_split_go<In, false>(plan, prm, stream);
  }
  if constexpr (kVec && In != kInF32) {
    if (plan.row_wide) {
      if (plan.count_nonfinite) return launch_kernel(stage_rowwise_wide_kernel<In, true>, prm, plan, stream);
      return launch_kernel(stage_rowwise_wide_kernel<In, false>, prm, plan, stream);
    }
  }
  if (plan.count_nonfinite) return launch_kernel(stage_rowwise_kernel<In, kVec, true>, prm, plan, stream);
  launch_kernel(stage_rowwise_kernel<In, kVec, false>, prm, plan, stream);
}

template <int In>
void rowwise_by_layout(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  if (plan.vectorized) return rowwise_go<In, true>(plan, a, p, stream);
  rowwise_go<In, false>(plan, a, p, stream);
}

}  // namespace

void launch_generic(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  switch (in_kind(plan.in)) {
    case kInBF16: return generic_by_format<kInBF16>(plan, a, p, stream);
    case kInF16: return generic_by_format<kInF16>(plan, a, p, stream);
    default: return generic_by_format<kInF32>(plan, a, p, stream);
  }
}

void launch_rowwise(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  switch (in_kind(plan.in)) {
    case kInBF16: return rowwise_by_layout<kInBF16>(plan, a, p, stream);
    case kInF16: return rowwise_by_layout<kInF16>(plan, a, p, stream);
    default: return rowwise_by_layout<kInF32>(plan, a, p, stream);
  }
}

}  // namespace cuda
}  // namespace megamoe
