// routing.cu: routing-only staging on CUDA (no activations): the routing-only kernel
// (kernels/routing.cuh) as routing_plan() sizes it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/kernels/routing.cuh"
#include "cuda/launch/aligned.cuh"
#include "cuda/launch/launch_util.cuh"
#include "cuda/policy/plan.h"
#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "contract/validate.h"

namespace megamoe {
namespace cuda {
namespace {

void routing_aligned(const RoutingArgs& a, const detail::Problem& pr, Stream stream) {
  RoutingParams p = {};
  p.ids = a.topk_ids.data;
  p.w = a.topk_weights.data;
  p.pad = a.is_padding ? static_cast<const uint8_t*>(a.is_padding->data) : nullptr;
  p.pad_s0 = a.is_padding ? a.is_padding->strides[0] : 0;
  p.idx_out = static_cast<int64_t*>(a.topk_idx_out.data);
  p.w_out = static_cast<float*>(a.topk_weights_out.data);
  p.ids_s0 = a.topk_ids.strides[0];
  p.ids_s1 = a.topk_ids.strides[1];
  p.w_s0 = a.topk_weights.strides[0];
  p.w_s1 = a.topk_weights.strides[1];
  p.io_s0 = a.topk_idx_out.strides[0];
  p.io_s1 = a.topk_idx_out.strides[1];
  p.wo_s0 = a.topk_weights_out.strides[0];
  p.wo_s1 = a.topk_weights_out.strides[1];
  p.T = pr.T;
  p.M = pr.M;
  p.K = pr.K;
  p.alpha = pr.alpha;
  uint32_t f = a.enable_pdl ? kFlagPdl : 0u;
  if (pr.has_alpha) f |= kFlagAlpha;
  if (pr.has_expert_scales) {
    f |= kFlagExpertScales;
    p.escale = static_cast<const float*>(a.expert_scales->data);
    p.es_s0 = a.expert_scales->strides[0];
    p.n_experts = pr.E;
  }
  if (a.topk_ids.dtype == DType::kInt64) f |= kFlagIdsI64;
  if (a.topk_weights.dtype == DType::kBFloat16) f |= kFlagWBF16;
  if (a.topk_weights.dtype == DType::kFloat16) f |= kFlagWF16;
  p.flags = f;
  if (pr.M * pr.K == 0) return;
  const DeviceGuard guard(a.topk_ids.device.index);
  const RoutingPlan plan = routing_plan(pr.M, pr.K, a.enable_pdl, device_info(a.topk_ids.device.index));
  launch_ex(routing_kernel, plan.grid, plan.threads, 0, a.enable_pdl, static_cast<cudaStream_t>(stream),
            "cudaLaunchKernelEx(routing)", p);
}

}  // namespace

std::string explain_routing(const RoutingArgs& a, const detail::Problem& pr) {
  if (pr.M * pr.K == 0) return "cuda backend: nothing to launch (no top-k entry)";
  return "cuda backend: " + to_string(routing_plan(pr.M, pr.K, a.enable_pdl, device_info(a.topk_ids.device.index)));
}

void stage_routing(const RoutingArgs& a, const detail::Problem& pr, Stream stream) {
  if (!pr.misaligned) return routing_aligned(a, pr, stream);
  run_on_aligned_copies(
      a, a.topk_ids.device.index, stream, [](const RoutingArgs& x) { return detail::named_tensors(x); },
      [&](const RoutingArgs& x) { routing_aligned(x, pr, stream); });
}

}  // namespace cuda
}  // namespace megamoe
