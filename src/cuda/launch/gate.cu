// gate.cu: gate_route_and_stage / gate_and_route on CUDA, as gate_plan() sizes it: one
// stream-ordered scratch allocation (the shares' partial sums, the [T, E] logits, the
// arrival counters), a memset node zeroing the counters, the gate launches
// (kernels/gate.cuh; one at decode, one per kGateTokens tokens above), then the router
// call on the scratch logits through the router's own entry point (router.cu: its plan,
// its staging, its bytes), stream-ordered after them. No host sync and no allocation
// outside the stream's pool: a CUDA graph captures the call as allocation, memset, kernel
// and free nodes. enable_pdl sets the PDL attribute on the first gate launch, whose kernel
// waits on the previous grid (griddepcontrol.wait) before any load; the memset node before
// it is an ordinary stream dependency. The router launch is never PDL-chained to the gate
// kernel, whose last blocks write the logits it reads.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "contract/validate.h"
#include "cuda/kernels/gate.cuh"
#include "cuda/launch/aligned.cuh"
#include "cuda/launch/launch_util.cuh"
#include "cuda/policy/plan.h"
#include "megamoe/error.h"
#include "megamoe/gate.h"

namespace megamoe {
namespace cuda {

void route(const RouterArgs& r, const StageArgs* stage, const detail::RouterProblem& p, Stream stream);

namespace {

/// Rows contiguous and every row 16-byte aligned (one row: its start).
bool rows16(const TensorRef& t) {
  const int64_t es = dtype_size(t.dtype);
  return t.strides[1] == 1 && ((t.strides[0] * es) % 16 == 0 || t.shape[0] == 1) &&
         reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

/// The kernel parameters of gate launch @p launch of @p gp.
GateParams gate_params(const GateArgs& g, const detail::GateProblem& p, const GatePlan& gp, char* scratch,
                       int64_t launch) {
  GateParams k = {};
  k.y = static_cast<const uint16_t*>(g.y.data);
  k.y_s0 = g.y.strides[0];
  k.y_s1 = g.y.strides[1];
  k.w = g.weight.data;
  k.w_s0 = g.weight.strides[0];
  k.w_s1 = g.weight.strides[1];
  k.partial = reinterpret_cast<float*>(scratch);
  k.logits = reinterpret_cast<float*>(scratch + gp.logits_at);
  k.counters = reinterpret_cast<unsigned int*>(scratch + gp.counters_at) + launch * gp.tiles;
  if (g.logits_out) {
    k.out = static_cast<float*>(g.logits_out->data);
    k.out_s0 = g.logits_out->strides[0];
    k.out_s1 = g.logits_out->strides[1];
  }
  k.t0 = launch * gp.token_block;
  k.tb = std::min(gp.token_block, p.T - k.t0);
  k.E = p.E;
  k.H = p.H;
  k.n = gp.chunks;
  k.S = gp.shares;
  k.tiles = gp.tiles;
  k.M = static_cast<int>(gp.share_chunks);
  k.fold = static_cast<int>(gp.fold_per_lane);
  const bool pdl = gp.pdl && launch == 0;
  // Under PDL the loads follow griddepcontrol.wait on the previous grid's writes: the
  // coherent path, which a wait orders; later launches follow a kernel boundary.
  k.flags = (p.weight_f32 ? kGateWF32 : 0u) | (rows16(g.y) ? kGateYVec : 0u) | (rows16(g.weight) ? kGateWVec : 0u) |
            (pdl ? kGatePdl : 0u) | (pdl ? 0u : kGateNc);
  return k;
}

struct GateCall {
  GateArgs g;
  RouterArgs r;
  std::optional<StageArgs> s;
};

void gate_aligned(const GateArgs& g, const RouterArgs& r, const StageArgs* s, const detail::GateProblem& p,
                  Stream stream) {
  const int device = g.y.device.index;
  const bool enable_pdl = s != nullptr ? s->enable_pdl : r.enable_pdl;
  StreamScratch scratch(stream);
  // T == 0 (a fused full-buffer tail only): no logits; the router reads none.
  TensorRef logits(nullptr, DType::kFloat32, {p.T, p.E}, g.y.device);
  if (p.T > 0) {
    const GatePlan gp = gate_plan(p.T, p.E, p.H, enable_pdl, device_info(device));
    char* base = scratch.get(static_cast<size_t>(gp.scratch_bytes), "cudaMallocAsync (gate scratch)");
    const auto st = static_cast<cudaStream_t>(stream);
    check_cuda(cudaMemsetAsync(base + gp.counters_at, 0, static_cast<size_t>(gp.counter_bytes), st),
               "cudaMemsetAsync (gate counters)");
    for (int64_t l = 0; l < gp.launches; ++l) {
      launch_ex(gate_kernel, gp.grid, gp.threads, 0, gp.pdl && l == 0, st, "cudaLaunchKernelEx(gate)",
                gate_params(g, p, gp, base, l));
    }
    logits = TensorRef(base + gp.logits_at, DType::kFloat32, {p.T, p.E}, g.y.device);
  }
  // The router's own path on the logits, stream-ordered after the gate kernel (its plain
  // loads see the last blocks' stores at the kernel boundary).
  RouterArgs rr = detail::gated_router_args(r, logits);
  rr.enable_pdl = false;
  std::optional<StageArgs> ss;
  if (s != nullptr) {
    ss = *s;
    ss->enable_pdl = false;
  }
  detail::RouterProblem rp = p.router;
  rp.misaligned = false;  // the gate's copies cover the router's tensors too
  rp.stage.misaligned = false;
  route(rr, ss ? &*ss : nullptr, rp, stream);
}

}  // namespace

std::string explain_gate(const detail::GateProblem& p, bool enable_pdl, int device) {
  const DeviceGuard guard(device);
  return to_string(gate_plan(p.T, p.E, p.H, enable_pdl, device_info(device)));
}

void gate_route(const GateArgs& g, const RouterArgs& r, const StageArgs* s, const detail::GateProblem& p,
                Stream stream) {
  if (p.T > 0 && p.H > kGateMaxH) {
    throw Error(ErrorCode::kUnsupported, "megamoe: gate: y: expected at most " + std::to_string(kGateMaxH) +
                                             " columns on CUDA, got shape " + g.y.shape_str());
  }
  const DeviceGuard guard(g.y.device.index);
  if (!p.router.misaligned) return gate_aligned(g, r, s, p, stream);
  // Every tensor of the call off its element size runs on an aligned copy (gather before,
  // outputs scattered after); the launches inside see only aligned tensors.
  run_on_aligned_copies(
      GateCall{g, r, s != nullptr ? std::optional<StageArgs>(*s) : std::nullopt}, g.y.device.index, stream,
      [](const GateCall& c) { return detail::named_tensors(c.g, c.r, c.s ? &*c.s : nullptr); },
      [&](const GateCall& c) { gate_aligned(c.g, c.r, c.s ? &*c.s : nullptr, p, stream); });
}

}  // namespace cuda
}  // namespace megamoe
