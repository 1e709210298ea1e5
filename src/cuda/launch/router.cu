// router.cu: the fused DeepSeek-V4 router on CUDA (docs/ROUTER.md "CUDA").
//
// route_and_stage with a fast-kernel plan (contiguous, aligned rows; every format but
// NVFP4 per-token): ONE launch of route_stage_kernel (route_fused.cuh, instantiated in
// route_fused_{bf16,f16,f32}.cu), whose grid is router blocks (router.cuh) that route the
// tokens and write the public top-k, the staged top-k buffers and their full-buffer tail,
// followed by the quantizing blocks of the staging plan (plan.h: the same shapes, index
// modes and store policies, the same device code from quantize_fast.cuh, minus its top-k
// repack). The quantization does not depend on the routing, so the two kinds of blocks run
// side by side.
//
// Generic and row-kernel plans (strided or unaligned hidden states, NVFP4 per-token): two
// launches on the stream, the router kernel (public and staged top-k, tail) then the plan's
// staging kernel (which repacks the router's outputs into the same bytes again). Those
// kernels keep their block loops inside their __global__ functions; fusing them needs
// their bodies as device functions of (block, blocks), as stage_chunk / stage_tile are.
//
// route() alone: the router kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda/launch/aligned.cuh"
#include "cuda/launch/launch_util.cuh"
#include "cuda/policy/plan.h"
#include "cuda/launch/route_fused.cuh"
#include "cuda/kernels/router.cuh"
#include "megamoe/error.h"
#include "megamoe/router.h"
#include "contract/validate.h"

namespace megamoe {
namespace cuda {
namespace {

/// The most scores a router thread runs side by side (router_block), what the kernel's
/// registers hold: the router kernel's (no register cap) 3, 4 would spill on sm_90 (the
/// fused kernel's: route_fused.cuh).
constexpr int kRouteChains = 3;

/// The router alone (route(), the two-launch path, a fused call without tokens).
__global__ void __launch_bounds__(256) route_kernel(const __grid_constant__ RouterParams r) {
  if (r.flags & kRoutePdl) pdl_wait_and_trigger();
  router_block_body<kRouteChains, true>(r, blockIdx.x);
}

// ---------------------------------------------------------------------------------------
// Host side.

/// The router blocks' parameters for the plan's router blocks (@p fused: the fused
/// kernel's, whose group is that of its block size).
RouterParams router_params(const RouterArgs& r, const StageArgs* s, const detail::RouterProblem& p,
                           const RouterPlan& plan) {
  RouterParams rp = {};
  rp.logits = r.router_logits.data;
  rp.lg_s0 = r.router_logits.strides[0];
  rp.lg_s1 = r.router_logits.strides[1];
  uint32_t f = r.router_logits.dtype == DType::kBFloat16 ? kRouteLogitsBF16 : 0u;
  if (r.e_score_correction_bias) {
    rp.bias = r.e_score_correction_bias->data;
    rp.bias_s0 = r.e_score_correction_bias->strides[0];
    f |= kRouteBias | (r.e_score_correction_bias->dtype == DType::kBFloat16 ? kRouteBiasBF16 : 0u);
  }
  rp.ids = r.topk_ids.data;
  rp.ids_s0 = r.topk_ids.strides[0];
  rp.ids_s1 = r.topk_ids.strides[1];
  f |= r.topk_ids.dtype == DType::kInt64 ? kRouteIdsI64 : 0u;
  rp.w = static_cast<float*>(r.topk_weights.data);
  rp.w_s0 = r.topk_weights.strides[0];
  rp.w_s1 = r.topk_weights.strides[1];
  if (const TensorRef* pad = detail::router_padding(r, s)) {
    rp.pad = static_cast<const uint8_t*>(pad->data);
    rp.pad_s0 = pad->strides[0];
  }
  if (p.hash) {
    rp.tid2eid = static_cast<const int32_t*>(r.tid2eid->data);
    rp.tab_s0 = r.tid2eid->strides[0];
    rp.tab_s1 = r.tid2eid->strides[1];
    rp.input_ids = r.input_ids->data;
    rp.iid_s0 = r.input_ids->strides[0];
    f |= kRouteHash | (r.input_ids->dtype == DType::kInt64 ? kRouteInputIdsI64 : 0u);
  }
  if (p.eplb) {
    rp.l2p = static_cast<const int32_t*>(r.logical_to_physical_map->data);
    rp.l2p_s0 = r.logical_to_physical_map->strides[0];
    rp.l2p_s1 = r.logical_to_physical_map->strides[1];
    rp.replicas = static_cast<const int32_t*>(r.logical_replica_count->data);
    rp.rc_s0 = r.logical_replica_count->strides[0];
    rp.load = r.expert_load_view->data;
    rp.load_s0 = r.expert_load_view->strides[0];
    rp.record = static_cast<const int32_t*>(r.record_enabled->data);
    f |= kRouteEplb | (r.expert_load_view->dtype == DType::kInt64 ? kRouteLoadI64 : 0u);
  }
  if (p.has_nonfinite) rp.nonfinite = static_cast<unsigned long long*>(r.nonfinite_count->data);
  rp.M = p.T;
  if (s != nullptr) {
    rp.idx_out = static_cast<int64_t*>(s->topk_idx_out.data);
    rp.io_s0 = s->topk_idx_out.strides[0];
    rp.io_s1 = s->topk_idx_out.strides[1];
    rp.w_out = static_cast<float*>(s->topk_weights_out.data);
    rp.wo_s0 = s->topk_weights_out.strides[0];
    rp.wo_s1 = s->topk_weights_out.strides[1];
    rp.M = p.stage.M;
    f |= kRouteStaged;
  }
  rp.flags = f | (plan.pdl ? kRoutePdl : 0u);
  rp.T = p.T;
  rp.E = p.E;
  rp.K = p.K;
  rp.V = p.V;
  rp.R = p.R;
  rp.P = p.P;
  rp.alpha = p.alpha;
  rp.tpb = plan.tokens_per_block;
  rp.group = router_group(static_cast<uint32_t>(plan.threads / 32), rp.tpb, static_cast<uint32_t>(p.E),
                          static_cast<uint32_t>(p.K));
  rp.blocks = static_cast<uint32_t>(plan.router_blocks);  // <= kMaxGridBlocks (router_plan)
  return rp;
}

void launch_router(const RouterParams& rp, const RouterPlan& plan, cudaStream_t stream) {
  Plan pl;
  pl.threads = plan.threads;
  pl.grid = plan.router_blocks;
  pl.pdl = plan.pdl;
  launch_kernel(route_kernel, rp, pl, stream);
}

void route_aligned(const RouterArgs& r, const StageArgs* s, const detail::RouterProblem& p, Stream stream_handle) {
  const int index = r.router_logits.device.index;
  DeviceGuard scope(index);
  const DeviceInfo dev = device_info(index);
  auto stream = static_cast<cudaStream_t>(stream_handle);
  const bool enable_pdl = s != nullptr ? s->enable_pdl : r.enable_pdl;
  std::optional<StageArgs> a;
  if (s != nullptr) a = detail::staged_args(r, *s);
  const RouterPlan plan = router_plan(p, a ? &*a : nullptr, enable_pdl, dev);
  const RouterParams rp = router_params(r, s, p, plan);
  switch (plan.launch) {
    case RouterLaunch::kRouter: return launch_router(rp, plan, stream);
    case RouterLaunch::kRouterThenStage:
      launch_router(rp, plan, stream);
      return launch(plan.stage, *a, p.stage, stream_handle);
    case RouterLaunch::kFused:
      check_plan(plan.stage, p.stage, *a);
      switch (in_kind(plan.fused.in)) {
        case kInBF16: return route_fused_bf16(plan.fused, *a, p.stage, rp, plan.decode, stream);
        case kInF16: return route_fused_f16(plan.fused, *a, p.stage, rp, plan.decode, stream);
        default: return route_fused_f32(plan.fused, *a, p.stage, rp, plan.decode, stream);
      }
  }
}

/// A router call's arguments: the router's, and the staging's when fused.
struct RouterCall {
  RouterArgs r;
  std::optional<StageArgs> s;
};

/// A router call's tensors (detail::named_tensors).
std::vector<detail::NamedTensor> call_tensors(const RouterCall& c) {
  return detail::named_tensors(c.r, c.s ? &*c.s : nullptr);
}

}  // namespace

std::string explain_router(const RouterArgs& r, const StageArgs* s, const detail::RouterProblem& p) {
  const DeviceInfo dev = device_info(r.router_logits.device.index);
  std::optional<StageArgs> a;
  if (s != nullptr) a = detail::staged_args(r, *s);
  return "cuda backend: " +
         to_string(router_plan(p, a ? &*a : nullptr, s != nullptr ? s->enable_pdl : r.enable_pdl, dev));
}

void route(const RouterArgs& r, const StageArgs* s, const detail::RouterProblem& p, Stream stream) {
  if (!p.misaligned) return route_aligned(r, s, p, stream);
  run_on_aligned_copies(RouterCall{r, s != nullptr ? std::optional<StageArgs>(*s) : std::nullopt},
                        r.router_logits.device.index, stream, call_tensors,
                        [&](const RouterCall& c) { route_aligned(c.r, c.s ? &*c.s : nullptr, p, stream); });
}

}  // namespace cuda
}  // namespace megamoe
