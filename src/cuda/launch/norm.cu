// norm.cu: rmsnorm_and_stage on CUDA, as norm_plan() sizes it. Every format but NVFP4
// online runs in one launch (kernels/norm_stage.cuh: the norm's rows staged through the
// device API by the same kernel, the full-buffer tail in blocks of their own). NVFP4 online,
// whose global scale needs every row first, and calls without rows run the norm kernel
// (kernels/norm.cuh), which writes the rows to y (or to stream-ordered scratch when the
// caller asks for no y), then the staging launch (prepare_inputs' own path, so the staged
// bytes are those of prepare_inputs(y)), stream-ordered after it (producer.cuh).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "contract/validate.h"
#include "contract/target.h"
#include "cuda/kernels/norm.cuh"
#include "cuda/kernels/norm_stage.cuh"
#include "cuda/launch/launch_util.cuh"
#include "cuda/launch/producer.cuh"
#include "cuda/policy/plan.h"
#include "megamoe/error.h"
#include "megamoe/norm.h"

namespace megamoe {
namespace cuda {

/// The call runs in one launch (norm_fused): it has rows and a format staged row by row.
bool norm_fuses(const detail::NormProblem& p) { return p.T > 0 && !core::online_scaled(p.stage.fmt); }

namespace {

/// The norm's kernel parameters (y: where the rows go, null for none).
NormParams norm_params(const RmsNormArgs& n, const detail::NormProblem& p, const NormPlan& np, void* y,
                       int64_t y_s0, int64_t y_s1) {
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
  k.y = static_cast<uint16_t*>(y);
  k.y_s0 = y_s0;
  k.y_s1 = y_s1;
  k.H = p.H;
  k.eps = p.eps;
  k.per_thread = np.per_thread;
  k.pdl = np.pdl;
  // 16-byte accesses where every row starts 16-byte aligned and is contiguous.
  auto rows16 = [](const TensorRef& t) {
    return t.strides[1] == 1 && t.strides[0] % 8 == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  };
  k.rows_vec = rows16(n.x) && (!n.residual || rows16(*n.residual)) && (!n.residual_out || rows16(*n.residual_out));
  k.w_vec = n.weight.strides[0] == 1 && reinterpret_cast<uintptr_t>(n.weight.data) % 16 == 0;
  k.y_vec = y != nullptr && y_s1 == 1 && y_s0 % 8 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  return k;
}

/// The norm plan's launch of @p kernel.
template <typename Kernel, typename... Args>
void launch_norm(const NormPlan& np, Stream stream, Kernel kernel, const char* what, const Args&... args) {
  launch_with_smem(kernel, np.grid, np.threads, np.smem, np.pdl, stream, what, args...);
}

/// One launch: the rows normalized and staged by rmsnorm_stage_kernel (T > 0, not NVFP4 online).
void norm_fused(const RmsNormArgs& n, const StageArgs& s, const detail::NormProblem& p, Stream stream) {
  const detail::Problem& sp = p.stage;
  const NormPlan np = norm_plan(p.T, p.H, s.enable_pdl, device_info(n.x.device.index), true,
                                sp.full_buffer ? (sp.M - sp.T) * sp.K : 0);
  const device::StageTarget tg = detail::make_stage_target(detail::staged_args(n.y ? *n.y : n.x, s), sp);
  const NormParams k = n.y ? norm_params(n, p, np, n.y->data, n.y->strides[0], n.y->strides[1])
                           : norm_params(n, p, np, nullptr, 0, 0);
  visit_fused_format(sp.fmt, "rmsnorm_and_stage", [&](auto tag) {
    launch_norm(np, stream, rmsnorm_stage_kernel<decltype(tag)::value>, "cudaLaunchKernelEx(rmsnorm_stage)", k, tg);
  });
}

void norm_aligned(const RmsNormArgs& n, const StageArgs& s, const detail::NormProblem& p, Stream stream) {
  if (norm_fuses(p)) return norm_fused(n, s, p, stream);
  StreamScratch scratch(stream);  // the rows of a call without y
  const TensorRef y = rows_to_stage(n.y, p.T, p.H, n.x.device, n.x, scratch, "rmsnorm_and_stage");
  const NormPlan np = norm_plan(p.T, p.H, s.enable_pdl, device_info(n.x.device.index));
  if (np.grid > 0) {
    launch_norm(np, stream, rmsnorm_kernel, "cudaLaunchKernelEx(rmsnorm)",
                norm_params(n, p, np, y.data, y.strides[0], y.strides[1]));
  }
  stage_rows_after(y, s, p.stage, stream);
}

}  // namespace

std::string explain_norm(const detail::NormProblem& p, bool enable_pdl, int device) {
  const DeviceGuard guard(device);
  const detail::Problem& sp = p.stage;
  return to_string(norm_plan(p.T, p.H, enable_pdl, device_info(device), norm_fuses(p),
                             sp.full_buffer ? (sp.M - sp.T) * sp.K : 0));
}

void rmsnorm_and_stage(const RmsNormArgs& n, const StageArgs& s, const detail::NormProblem& p, Stream stream) {
  if (p.H > kNormMaxH) {
    throw Error(ErrorCode::kUnsupported, "megamoe: rmsnorm_and_stage: x: expected at most " +
                                             std::to_string(kNormMaxH) + " columns on CUDA, got shape " +
                                             n.x.shape_str());
  }
  run_producer(n, s, p, n.x.device.index, stream,
               [&](const RmsNormArgs& a, const StageArgs& b, const detail::NormProblem& q) { norm_aligned(a, b, q, stream); });
}

}  // namespace cuda
}  // namespace megamoe
