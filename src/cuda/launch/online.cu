// online.cu: NVFP4 online's amax launch (kernels/online_amax.cuh) from its plan: a memset
// of global_scale when several blocks accumulate into it, then the kernel. The staging
// launch after it is NVFP4 static's (stage_cuda.cu).
#include "cuda/kernels/online_amax.cuh"
#include "cuda/launch/launch_util.cuh"

namespace megamoe {
namespace cuda {
namespace {

template <int In>
void online_go(const OnlinePlan& op, const OnlineParams& prm, cudaStream_t stream) {
  Plan shape;  // launch_kernel's grid, block and PDL fields
  shape.grid = op.grid;
  shape.threads = op.threads;
  shape.pdl = op.pdl;
  if (op.vectorized) return launch_kernel(online_amax_kernel<In, true, kOnlineVecsPerThread>, prm, shape, stream);
  launch_kernel(online_amax_kernel<In, false, kOnlineVecsPerThread>, prm, shape, stream);
}

}  // namespace

void launch_online_amax(const OnlinePlan& op, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  const uint32_t flags = (op.pdl ? kOnlinePdl : 0u) | (op.memset ? kOnlineAtomic : 0u);
  const TensorRef& hs = a.hidden_states;
  const OnlineParams prm{hs.data, hs.strides[0], hs.strides[1], p.T, p.H, op.row_units, p.floor,
                         static_cast<float*>(a.global_scale->data), flags};
  if (op.memset) check_cuda(cudaMemsetAsync(prm.gs, 0, sizeof(float), stream), "cudaMemsetAsync(global_scale)");
  switch (in_kind(a.hidden_states.dtype)) {
    case kInBF16: return online_go<kInBF16>(op, prm, stream);
    case kInF16: return online_go<kInF16>(op, prm, stream);
    default: return online_go<kInF32>(op, prm, stream);
  }
}

}  // namespace cuda
}  // namespace megamoe
