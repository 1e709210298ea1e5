// stage_cuda.cu: the CUDA backend's host entry points. prepare_inputs() asks plan() for
// the kernel choice (plan.h) and launch() runs it: one kernel launch per call (a second,
// routing-only one only for a full-buffer tail the plan's shape does not fill; NVFP4 online
// has its amax launch first, online_plan), no
// allocation (but for tensors off their element size: aligned.cuh), no host
// synchronization (CUDA-graph capture safe), optional PDL. The kernels
// are by role in quantize_fast.cuh, quantize_generic.cuh, quantize_rowwise.cuh and
// copy_bf16.cuh (bf16 pass-through), the
// top-k repack in topk.cuh; their instantiations in the launch_*.cu units.
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "core/checked.h"
#include "cuda/launch/aligned.cuh"
#include "cuda/launch/launch_util.cuh"
#include "cuda/policy/plan.h"
#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "contract/validate.h"

namespace megamoe {
namespace cuda {

void stage_routing(const RoutingArgs& args, const detail::Problem& p, Stream stream);

DeviceInfo device_info(int device) {
  // Cached per ordinal (attribute queries cost about a microsecond each); 0 = not yet known.
  constexpr int kCached = 64;
  static std::atomic<int> sms[kCached], archs[kCached];
  const bool cacheable = device >= 0 && device < kCached;
  if (cacheable) {
    const int s = sms[device].load(std::memory_order_relaxed), a = archs[device].load(std::memory_order_relaxed);
    if (s > 0 && a > 0) return DeviceInfo{s, a};
  }
  int s = 0, major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&s, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  const DeviceInfo info{s, major * 10 + minor};
  if (cacheable) {
    sms[device].store(info.sm_count, std::memory_order_relaxed);
    archs[device].store(info.arch, std::memory_order_relaxed);
  }
  return info;
}

namespace {

/// H == 0 without per-token scales: no activation, scale or shared element to write (the
/// per-token format still writes its [T] scales from the floor, which the row kernel does).
bool empty_rows(const detail::Problem& p) { return p.H == 0 && !p.has_x_scales; }

/// Run a plan that check_plan accepts (plans from plan() always do).
void run(const Plan& plan, const StageArgs& a, const detail::Problem& p, Stream stream_handle) {
  DeviceGuard guard(a.hidden_states.device.index);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  switch (plan.role) {
    case Role::kFast:
      if (core::sf_of(plan.fmt) == core::Sf::kUE8M0x4) return launch_fast_ue8m0(plan, a, p, stream);
      return launch_fast_fp32_nvfp4(plan, a, p, stream);
    case Role::kGeneric: return launch_generic(plan, a, p, stream);
    case Role::kRowwise: return launch_rowwise(plan, a, p, stream);
    case Role::kCopy: return launch_copy(plan, a, p, stream);
  }
  throw Error(ErrorCode::kInternal, "megamoe: no kernel for " + to_string(plan));
}

}  // namespace

void launch(const Plan& plan, const StageArgs& a, const detail::Problem& p, Stream stream) {
  check_plan(plan, p, a);
  run(plan, a, p, stream);
}

std::string explain_plan(const StageArgs& a, const detail::Problem& p) {
  const DeviceInfo dev = device_info(a.hidden_states.device.index);
  if (p.T == 0) {
    return p.full_buffer && p.M > 0 ? "cuda backend: " + to_string(routing_plan(p.M, p.K, a.enable_pdl, dev)) +
                                          " (the routing-only kernel fills the full-buffer tail, T == 0)"
                                    : "cuda backend: nothing to launch (T == 0)";
  }
  if (empty_rows(p) && !core::online_scaled(p.fmt)) {
    return "cuda backend: " + to_string(routing_plan(p.M, p.K, a.enable_pdl, dev)) +
           " (the routing-only kernel stages the top-k, H == 0: no activations)";
  }
  std::string head;
  Plan pl;
  if (core::online_scaled(p.fmt)) {
    const OnlinePlan op = online_plan(p, a, dev);
    head = to_string(op);
    if (!op.staging) {
      return "cuda backend: " + head + " ; then " + to_string(routing_plan(p.M, p.K, a.enable_pdl, dev)) +
             " (the routing-only kernel stages the top-k, H == 0: no activations)";
    }
    pl = op.stage;
  } else {
    pl = plan(p, a, dev);
    head = to_string(pl);
  }
  const bool tail_launch = p.full_buffer && p.M > p.T && !pl.fused_tail;
  return "cuda backend: " + head +
         (tail_launch ? " ; then " + to_string(routing_plan(p.M - p.T, p.K, a.enable_pdl, dev)) +
                            " (the routing-only kernel fills the full-buffer tail)"
                      : "");
}

namespace {

/// The routing-only call that stages @p a's top-k: its inputs, outputs and options.
RoutingArgs routing_args_of(const StageArgs& a) {
  RoutingArgs r;
  r.topk_ids = a.topk_ids;
  r.topk_weights = a.topk_weights;
  r.is_padding = a.is_padding;
  r.topk_idx_out = a.topk_idx_out;
  r.topk_weights_out = a.topk_weights_out;
  r.routed_scaling_factor = a.routed_scaling_factor;
  r.expert_scales = a.expert_scales;
  r.full_buffer = a.full_buffer;
  r.enable_pdl = a.enable_pdl;
  return r;
}

/// Rows T..M-1 of the top-k outputs set to -1 / +0.0 by the routing-only kernel, over views
/// that start at row T (no top-k input is read for them).
void fill_tail(const StageArgs& a, const detail::Problem& p, Stream stream) {
  auto from_row = [&](TensorRef t) {
    // Row T lies inside the validated span (M > T), so the offset fits; checked anyway.
    const core::Checked off = core::Checked(p.T) * t.strides[0] * dtype_size(t.dtype);
    if (!off.ok()) throw Error(ErrorCode::kInternal, "megamoe: full-buffer tail: row offset overflows");
    t.data = static_cast<char*>(t.data) + off.value();
    t.shape[0] = p.M - p.T;
    return t;
  };
  RoutingArgs r = routing_args_of(a);
  r.is_padding.reset();  // no input row is read for the tail
  r.routed_scaling_factor.reset();
  r.expert_scales.reset();
  r.topk_idx_out = from_row(a.topk_idx_out);
  r.topk_weights_out = from_row(a.topk_weights_out);
  r.full_buffer = true;
  detail::Problem q = p;
  q.T = 0;
  q.M = p.M - p.T;
  q.has_padding = false;
  q.has_alpha = false;
  q.has_expert_scales = false;
  stage_routing(r, q, stream);
}

/// NVFP4 online: the amax launch writes gs (T > 0), then the call is NVFP4 static's with the
/// plan online_plan made for it (unit_gs where floor 0 needs it).
void prepare_online(const StageArgs& a, const detail::Problem& p, Stream stream) {
  const detail::Problem q = static_problem(p);
  bool tail = q.full_buffer && q.M > q.T;
  if (q.T > 0) {
    const OnlinePlan op = online_plan(p, a, device_info(a.hidden_states.device.index));
    {
      DeviceGuard guard(a.hidden_states.device.index);
      launch_online_amax(op, a, p, static_cast<cudaStream_t>(stream));
    }
    if (!op.staging) return stage_routing(routing_args_of(a), q, stream);  // H == 0
    run(op.stage, a, q, stream);
    tail = tail && !op.stage.fused_tail;
  }
  if (tail) fill_tail(a, q, stream);
}

void prepare_aligned(const StageArgs& a, const detail::Problem& p, Stream stream) {
  if (core::online_scaled(p.fmt)) return prepare_online(a, p, stream);
  if (empty_rows(p)) {
    // The top-k outputs alone (all M rows in full-buffer mode), as the CPU backend stages
    // them: the quantizing kernels repack the top-k inside their loops over the
    // activations, which run zero times here.
    stage_routing(routing_args_of(a), p, stream);
    return;
  }
  bool tail = p.full_buffer && p.M > p.T;
  if (p.T > 0) {
    const Plan pl = plan(p, a, device_info(a.hidden_states.device.index));
    run(pl, a, p, stream);
    tail = tail && !pl.fused_tail;
  }
  if (tail) fill_tail(a, p, stream);
}

}  // namespace

void prepare_inputs(const StageArgs& a, const detail::Problem& p, Stream stream) {
  if (!p.misaligned) return prepare_aligned(a, p, stream);
  detail::Problem q = p;
  q.misaligned = false;  // what the copies are (the routing-only calls inside see it)
  run_on_aligned_copies(
      a, a.hidden_states.device.index, stream, [](const StageArgs& x) { return detail::named_tensors(x); },
      [&](const StageArgs& x) { prepare_aligned(x, q, stream); });
}

}  // namespace cuda
}  // namespace megamoe
