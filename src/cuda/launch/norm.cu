// norm.cu: rmsnorm_and_stage on CUDA: the norm kernel (kernels/norm.cuh) as norm_plan()
// sizes it writes the normalized rows to y (or to stream-ordered scratch when the caller
// asks for no y), then the staging launch stages them (prepare_inputs' own path, so the
// staged bytes are those of prepare_inputs(y)). Two launches: the norm kernel PDL-launched
// when asked, the staging stream-ordered after it (see below).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "contract/validate.h"
#include "core/checked.h"
#include "cuda/kernels/norm.cuh"
#include "cuda/launch/aligned.cuh"
#include "cuda/launch/launch_util.cuh"
#include "cuda/policy/plan.h"
#include "megamoe/error.h"
#include "megamoe/norm.h"

namespace megamoe {
namespace cuda {

void prepare_inputs(const StageArgs& args, const detail::Problem& p, Stream stream);

namespace {

/// The scratch rows of a call without y, freed on the stream when the call ends (or
/// fails: then nothing reads them).
class ScratchRows {
 public:
  explicit ScratchRows(Stream s) : stream_(static_cast<cudaStream_t>(s)) {}
  ScratchRows(const ScratchRows&) = delete;
  ScratchRows& operator=(const ScratchRows&) = delete;
  ~ScratchRows() {
    if (ptr_ != nullptr && cudaFreeAsync(ptr_, stream_) != cudaSuccess) (void)cudaGetLastError();
  }
  void* get(size_t bytes) {
    check_cuda(cudaMallocAsync(&ptr_, bytes, stream_), "cudaMallocAsync (rmsnorm_and_stage rows)");
    return ptr_;
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

struct NormCall {
  RmsNormArgs n;
  StageArgs s;
};

void norm_aligned(const RmsNormArgs& n, const StageArgs& s, const detail::NormProblem& p, Stream stream) {
  ScratchRows scratch(stream);
  TensorRef y;
  if (n.y) {
    y = *n.y;
  } else if (p.T > 0 && p.H > 0) {
    const core::Checked bytes = core::Checked(p.T) * p.H * 2;  // x's element count fits (validated)
    if (!bytes.ok()) throw Error(ErrorCode::kInternal, "megamoe: rmsnorm_and_stage: scratch size overflows");
    y = TensorRef(scratch.get(static_cast<size_t>(bytes.value())), DType::kBFloat16, {p.T, p.H}, n.x.device);
  } else {
    y = n.x;  // no rows to write: the staging reads none
  }
  const NormPlan np = norm_plan(p.T, p.H, s.enable_pdl, device_info(n.x.device.index));
  if (np.grid > 0) {
    NormParams k = {};
    k.x = static_cast<const uint16_t*>(n.x.data);
    k.x_s0 = n.x.strides[0];
    k.x_s1 = n.x.strides[1];
    if (n.residual) {
      k.res = static_cast<const uint16_t*>(n.residual->data);
      k.r_s0 = n.residual->strides[0];
      k.r_s1 = n.residual->strides[1];
    }
    if (n.residual_out) {
      k.res_out = static_cast<uint16_t*>(n.residual_out->data);
      k.ro_s0 = n.residual_out->strides[0];
      k.ro_s1 = n.residual_out->strides[1];
    }
    k.w = n.weight.data;
    k.w_s0 = n.weight.strides[0];
    k.w_f32 = p.weight_f32;
    k.y = static_cast<uint16_t*>(y.data);
    k.y_s0 = y.strides[0];
    k.y_s1 = y.strides[1];
    k.H = p.H;
    k.eps = p.eps;
    k.per_thread = np.per_thread;
    k.pdl = np.pdl;
    check_cuda(cudaFuncSetAttribute(rmsnorm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(np.smem)),
               "cudaFuncSetAttribute(rmsnorm)");
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(np.grid));
    cfg.blockDim = dim3(static_cast<unsigned>(np.threads));
    cfg.dynamicSmemBytes = static_cast<size_t>(np.smem);
    cfg.stream = static_cast<cudaStream_t>(stream);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = np.pdl ? 1 : 0;
    check_cuda(cudaLaunchKernelEx(&cfg, rmsnorm_kernel, k), "cudaLaunchKernelEx(rmsnorm)");
  }
  // The staging launch is stream-ordered after the norm kernel, never PDL-chained to it:
  // its vectorized loads of the rows take the non-coherent read-only path, which only a
  // kernel boundary makes see the norm kernel's writes.
  StageArgs staged = detail::staged_args(y, s);
  staged.enable_pdl = false;
  prepare_inputs(staged, p.stage, stream);
}

}  // namespace

std::string explain_norm(const detail::NormProblem& p, bool enable_pdl, int device) {
  const DeviceGuard guard(device);
  return to_string(norm_plan(p.T, p.H, enable_pdl, device_info(device)));
}

void rmsnorm_and_stage(const RmsNormArgs& n, const StageArgs& s, const detail::NormProblem& p, Stream stream) {
  if (p.H > kNormMaxH) {
    throw Error(ErrorCode::kUnsupported, "megamoe: rmsnorm_and_stage: x: expected at most " +
                                             std::to_string(kNormMaxH) + " columns on CUDA, got shape " +
                                             n.x.shape_str());
  }
  const DeviceGuard guard(n.x.device.index);
  if (!p.misaligned) return norm_aligned(n, s, p, stream);
  // Every tensor of both argument sets off its element size runs on an aligned copy; the
  // staging inside then sees only aligned tensors.
  detail::NormProblem q = p;
  q.misaligned = false;
  q.stage.misaligned = false;
  run_on_aligned_copies(
      NormCall{n, s}, n.x.device.index, stream, [](const NormCall& c) { return detail::named_tensors(c.n, c.s); },
      [&](const NormCall& c) { norm_aligned(c.n, c.s, q, stream); });
}

}  // namespace cuda
}  // namespace megamoe
