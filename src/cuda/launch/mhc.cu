// mhc.cu: mhc_pre_and_stage on CUDA, as mhc_plan() sizes it. Every format but NVFP4 online
// runs in one launch (kernels/mhc_stage.cuh mhc_stage_kernel: mHC pre, the norm, and the
// staging of y through the device API, the full-buffer tail in blocks of their own). NVFP4
// online, whose global scale needs every row first, runs mhc_kernel, which writes y (or
// stream-ordered scratch when the caller asks for no y), then the staging launch
// (prepare_inputs' own path, producer.cuh); a call without tokens runs the staging launch
// alone (the full-buffer tail).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "contract/target.h"
#include "contract/validate.h"
#include "cuda/kernels/mhc_stage.cuh"
#include "cuda/launch/launch_util.cuh"
#include "cuda/launch/producer.cuh"
#include "cuda/policy/plan.h"
#include "megamoe/error.h"
#include "megamoe/mhc.h"

namespace megamoe {
namespace cuda {

/// The call runs in one launch: it has tokens and a format staged row by row.
bool mhc_fuses(const detail::MhcProblem& p) { return p.T > 0 && !core::online_scaled(p.stage.fmt); }

namespace {

/// Rows of 16-bit (es = 2) or 32-bit (es = 4) elements that start 16-byte aligned and are
/// contiguous.
bool rows16(const TensorRef& t, int64_t es) {
  return t.strides[1] == 1 && (t.strides[0] * es) % 16 == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

/// The plan of a validated call with tokens.
MhcPlan plan_of(const detail::MhcProblem& p, bool enable_pdl, int device, bool fused) {
  const detail::Problem& sp = p.stage;
  return mhc_plan(p.T, p.H, p.hc, enable_pdl, device_info(device), fused,
                  fused && sp.full_buffer ? (sp.M - sp.T) * sp.K : 0);
}

/// The kernel's parameters (y: where the normalized rows go, null for none).
MhcKernelParams mhc_params(const MhcPreArgs& m, const detail::MhcProblem& p, const MhcPlan& mp, void* y,
                           int64_t y_s0, int64_t y_s1) {
  MhcKernelParams k = {};
  k.x = static_cast<const uint16_t*>(m.residual.data);
  k.x_s0 = m.residual.strides[0];
  k.x_s1 = m.residual.strides[1];
  k.fn = static_cast<const float*>(m.fn.data);
  k.fn_s0 = m.fn.strides[0];
  k.fn_s1 = m.fn.strides[1];
  k.scale = static_cast<const float*>(m.hc_scale.data);
  k.scale_s0 = m.hc_scale.strides[0];
  k.base = static_cast<const float*>(m.hc_base.data);
  k.base_s0 = m.hc_base.strides[0];
  if (m.pre_mix_in) {
    k.pre_in = static_cast<const float*>(m.pre_mix_in->data);
    k.pi_s0 = m.pre_mix_in->strides[0];
    k.pi_s1 = m.pre_mix_in->strides[1];
  }
  k.post = static_cast<float*>(m.post_mix.data);
  k.post_s0 = m.post_mix.strides[0];
  k.post_s1 = m.post_mix.strides[1];
  k.comb = static_cast<float*>(m.comb_mix.data);
  k.comb_s0 = m.comb_mix.strides[0];
  k.comb_s1 = m.comb_mix.strides[1];
  if (m.pre_mix) {
    k.pre = static_cast<float*>(m.pre_mix->data);
    k.pre_s0 = m.pre_mix->strides[0];
    k.pre_s1 = m.pre_mix->strides[1];
  }
  if (m.layer_input) {
    k.li = static_cast<uint16_t*>(m.layer_input->data);
    k.li_s0 = m.layer_input->strides[0];
    k.li_s1 = m.layer_input->strides[1];
    k.li_vec = rows16(*m.layer_input, 2);
  }
  k.K = p.K;
  k.hc = p.hc;
  k.M = p.M;
  k.per_thread_k = mp.per_thread_k;
  k.lanes_k = mp.lanes_k;
  k.per_thread_h = mp.per_thread_h;
  k.lanes_h = mp.lanes_h;
  k.prm = core::MhcParams{m.rms_eps, m.hc_pre_eps, m.hc_sinkhorn_eps, m.hc_post_mult_value, m.sinkhorn_repeat};
  k.x_vec = rows16(m.residual, 2);
  k.fn_vec = rows16(m.fn, 4);
  NormParams& n = k.norm;
  n.w = m.norm_weight.data;
  n.w_s0 = m.norm_weight.strides[0];
  n.w_f32 = p.weight_f32;
  n.w_vec = n.w_s0 == 1 && reinterpret_cast<uintptr_t>(n.w) % 16 == 0;
  n.y = static_cast<uint16_t*>(y);
  n.y_s0 = y_s0;
  n.y_s1 = y_s1;
  n.y_vec = y != nullptr && y_s1 == 1 && y_s0 % 8 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  n.H = p.H;
  n.eps = m.norm_eps;
  n.per_thread = mp.per_thread_h;
  n.pdl = mp.pdl;
  return k;
}

/// The mHC plan's launch of @p kernel.
template <typename Kernel, typename... Args>
void launch_mhc(const MhcPlan& mp, Stream stream, Kernel kernel, const char* what, const Args&... args) {
  launch_with_smem(kernel, mp.grid, mp.threads, mp.smem, mp.pdl, stream, what, args...);
}

/// A [T, H] bf16 view of the residual's first stream: the validator's stand-in for the
/// staged rows of a call without y (their shape; nothing reads it).
TensorRef first_stream(const MhcPreArgs& m, const detail::MhcProblem& p) {
  return TensorRef(m.residual.data, DType::kBFloat16, {p.T, p.H}, {m.residual.strides[0], m.residual.strides[1]},
                   m.residual.device);
}

/// One launch: mhc_stage_kernel (T > 0, not NVFP4 online).
void mhc_fused(const MhcPreArgs& m, const StageArgs& s, const detail::MhcProblem& p, Stream stream) {
  const detail::Problem& sp = p.stage;
  const MhcPlan mp = plan_of(p, s.enable_pdl, m.residual.device.index, true);
  const device::StageTarget tg = detail::make_stage_target(detail::staged_args(m.y ? *m.y : first_stream(m, p), s), sp);
  const MhcKernelParams k = m.y ? mhc_params(m, p, mp, m.y->data, m.y->strides[0], m.y->strides[1])
                                : mhc_params(m, p, mp, nullptr, 0, 0);
  visit_fused_format(sp.fmt, "mhc_pre_and_stage", [&](auto tag) {
    launch_mhc(mp, stream, mhc_stage_kernel<decltype(tag)::value>, "cudaLaunchKernelEx(mhc_stage)", k, tg);
  });
}

/// Two launches (NVFP4 online), or the staging alone (no tokens: the full-buffer tail).
void mhc_aligned(const MhcPreArgs& m, const StageArgs& s, const detail::MhcProblem& p, Stream stream) {
  if (mhc_fuses(p)) return mhc_fused(m, s, p, stream);
  StreamScratch scratch(stream);  // the rows of a call without y
  const TensorRef y = rows_to_stage(m.y, p.T, p.H, m.residual.device, first_stream(m, p), scratch, "mhc_pre_and_stage");
  if (p.T > 0) {
    const MhcPlan mp = plan_of(p, s.enable_pdl, m.residual.device.index, false);
    launch_mhc(mp, stream, mhc_kernel, "cudaLaunchKernelEx(mhc)", mhc_params(m, p, mp, y.data, y.strides[0], y.strides[1]));
  }
  stage_rows_after(y, s, p.stage, stream);
}

}  // namespace

std::string explain_mhc(const detail::MhcProblem& p, bool enable_pdl, int device) {
  const DeviceGuard guard(device);
  return to_string(plan_of(p, enable_pdl, device, mhc_fuses(p)));
}

void mhc_pre_and_stage(const MhcPreArgs& m, const StageArgs& s, const detail::MhcProblem& p, Stream stream) {
  if (p.T > 0 && p.K > kMhcMaxK) {  // (a call without tokens only fills the full-buffer tail)
    throw Error(ErrorCode::kUnsupported, "megamoe: mhc_pre_and_stage: residual: expected at most " +
                                             std::to_string(kMhcMaxK) + " columns (hc_mult * H) on CUDA, got shape " +
                                             m.residual.shape_str());
  }
  run_producer(m, s, p, m.residual.device.index, stream,
               [&](const MhcPreArgs& a, const StageArgs& b, const detail::MhcProblem& q) { mhc_aligned(a, b, q, stream); });
}

}  // namespace cuda
}  // namespace megamoe
