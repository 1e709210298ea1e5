// explain.cpp: megamoe::explain (include/megamoe/plan.h). Backend-independent: the CUDA
// part comes from the CUDA backend's plan (src/cuda/policy/plan.h) when the build has one.
#include <cstdint>
#include <optional>
#include <string>

#include "check.h"
#include "megamoe/error.h"
#include "megamoe/plan.h"
#include "megamoe/quant.h"
#include "contract/validate.h"
#if MEGAMOE_WITH_CUDA
#include "cuda/policy/plan.h"  // kGateTokens
#endif

namespace megamoe {

#if MEGAMOE_WITH_CUDA
namespace cuda {
std::string explain_plan(const StageArgs& a, const detail::Problem& p);
std::string explain_routing(const RoutingArgs& a, const detail::Problem& p);
std::string explain_router(const RouterArgs& r, const StageArgs* s, const detail::RouterProblem& p);
std::string explain_norm(const detail::NormProblem& p, bool enable_pdl, int device);
bool norm_fuses(const detail::NormProblem& p);
std::string explain_mhc(const detail::MhcProblem& p, bool enable_pdl, int device);
bool mhc_fuses(const detail::MhcProblem& p);
std::string explain_gate(const detail::GateProblem& p, bool enable_pdl, int device);
}  // namespace cuda
#endif

namespace {

/// Stands in for scratch memory (a dense copy, the rows of a producer): explain reads
/// nothing from it.
void* scratch_address(const detail::NamedTensor&) { return reinterpret_cast<void*>(uintptr_t{1} << 40); }

std::string describe(const StageArgs& args) {
  const detail::Problem p = detail::validate_args(args);
  const std::string sizes = "T=" + std::to_string(p.T) + " H=" + std::to_string(p.H) + " K=" + std::to_string(p.K);
  if (args.hidden_states.device.type == Device::Type::kCPU) {
    if (p.T == 0) {
      return detail::has_work(p) ? "cpu backend: the top-k repack fills the full-buffer tail (T == 0)"
                                 : "cpu backend: nothing to do (T == 0)";
    }
    return "cpu backend: " + scheme_name(p.scheme) + " " + sizes + " in=" + dtype_name(args.hidden_states.dtype) +
           ": " + (core::online_scaled(p.fmt) ? "the tensor's amax to global_scale, then " : "") +
           "strided loops over token rows (worker threads for large problems)" +
           (p.has_nonfinite ? ", non-finite count" : "");
  }
#if MEGAMOE_WITH_CUDA
  if (p.misaligned) {
    // The call runs on dense copies of the tensors off their element size, at 256-byte
    // aligned scratch (src/cuda/launch/aligned.cuh): the plan of those (the address stands in for
    // the scratch; nothing is read from it).
    StageArgs b = args;
    const int moved = detail::move_misaligned_to_dense(detail::named_tensors(b), scratch_address);
    return cuda::explain_plan(b, p) + " (" + scheme_name(p.scheme) + " " + sizes + "), on dense copies of " +
           std::to_string(moved) + " tensor(s) off their element size: gathered before, outputs scattered after";
  }
  return cuda::explain_plan(args, p) + " (" + scheme_name(p.scheme) + " " + sizes + ")";
#else
  if (!detail::has_work(p)) return "nothing to do (T == 0)";
  return "this build has no CUDA backend: hidden_states is on " + to_string(args.hidden_states.device) +
         " and prepare_inputs would throw (kUnsupported)";
#endif
}

std::string describe(const RoutingArgs& args) {
  const detail::Problem p = detail::validate_routing(args);
  if (args.topk_ids.device.type == Device::Type::kCPU) {
    return detail::has_work(p) ? "cpu backend: top-k repack of " + std::to_string(p.M) + " x " + std::to_string(p.K) +
                                     " entries on the calling thread"
                               : "cpu backend: nothing to do (T == 0)";
  }
#if MEGAMOE_WITH_CUDA
  if (!detail::has_work(p)) return "cuda backend: nothing to launch (T == 0)";
  const std::string plan = cuda::explain_routing(args, p);
  return p.misaligned ? plan + ", on dense copies of the tensors off their element size" : plan;
#else
  if (!detail::has_work(p)) return "nothing to do (T == 0)";
  return "this build has no CUDA backend: topk_ids is on " + to_string(args.topk_ids.device) +
         " and stage_routing would throw (kUnsupported)";
#endif
}

std::string describe(const RouterArgs& r, const StageArgs* stage) {
  const detail::RouterProblem p = detail::validate_router(r, stage);
  const std::string sizes = "T=" + std::to_string(p.T) + " E=" + std::to_string(p.E) + " K=" + std::to_string(p.K);
  const char* what = stage != nullptr ? "route_and_stage" : "route";
  if (r.router_logits.device.type == Device::Type::kCPU) {
    if (!detail::has_work(p)) return "cpu backend: nothing to do (T == 0)";
    std::string s = "cpu backend: " + std::string(what) + " " + sizes + ": the router over token rows (worker threads for large calls)";
    if (stage != nullptr) s += ", then the staging of its outputs (" + scheme_name(p.stage.scheme) + ")";
    return s;
  }
#if MEGAMOE_WITH_CUDA
  if (!detail::has_work(p)) return "cuda backend: nothing to launch (T == 0)";
  if (p.misaligned) {
    // As prepare_inputs: the call runs on dense copies at aligned scratch.
    RouterArgs rb = r;
    std::optional<StageArgs> sb;
    if (stage != nullptr) sb = *stage;
    const int moved = detail::move_misaligned_to_dense(detail::named_tensors(rb, sb ? &*sb : nullptr), scratch_address);
    return cuda::explain_router(rb, sb ? &*sb : nullptr, p) + " (" + what + " " + sizes + "), on dense copies of " +
           std::to_string(moved) + " tensor(s) off their element size";
  }
  return cuda::explain_router(r, stage, p) + " (" + what + " " + sizes + ")";
#else
  if (!detail::has_work(p)) return "nothing to do (T == 0)";
  return "this build has no CUDA backend: router_logits is on " + to_string(r.router_logits.device) + " and " + what +
         " would throw (kUnsupported)";
#endif
}

std::string describe(const RmsNormArgs& n, const StageArgs& s) {
  const detail::NormProblem p = detail::validate_norm(n, s);
  if (!detail::has_work(p)) return (n.x.device.type == Device::Type::kCPU ? "cpu" : "cuda") + std::string(" backend: nothing to do (T == 0)");
  const std::string sizes = "T=" + std::to_string(p.T) + " H=" + std::to_string(p.H);
  if (n.x.device.type == Device::Type::kCPU) {
    return "cpu backend: rmsnorm " + sizes + (p.has_residual ? " with residual" : "") +
           " over token rows (worker threads for large problems), then " + describe(detail::staged_args(n.y ? *n.y : n.x, s));
  }
#if MEGAMOE_WITH_CUDA
  if (cuda::norm_fuses(p)) {
    return "cuda backend: one launch: " + cuda::explain_norm(p, s.enable_pdl, n.x.device.index) + " (" + sizes +
           (p.has_residual ? ", residual" : "") + (n.y ? ", rows to y" : ", no y") + "; " +
           core::format_name(p.stage.fmt) + " staged by the same kernel through the device API" +
           (p.stage.full_buffer ? ", full-buffer tail in its tail blocks" : "") + ")";
  }
  // Without y the rows go to dense stream-ordered scratch: the staging plan is that of a
  // dense [T, H] bf16 tensor (at a stand-in address; nothing is read).
  TensorRef rows = n.y ? *n.y : TensorRef(scratch_address({}), DType::kBFloat16, {p.T, p.H}, n.x.device);
  StageArgs staged = detail::staged_args(rows, s);
  staged.enable_pdl = false;  // stream-ordered after the norm kernel (cuda/launch/norm.cu)
  return "cuda backend: launch 1: " + cuda::explain_norm(p, s.enable_pdl, n.x.device.index) + " (" + sizes +
         (p.has_residual ? ", residual" : "") + (n.y ? ", rows to y" : ", rows to scratch") + "); launch 2: " +
         describe(staged);
#else
  return "this build has no CUDA backend: x is on " + to_string(n.x.device) + " and rmsnorm_and_stage would throw (kUnsupported)";
#endif
}

std::string describe(const GateArgs& g, const RouterArgs& r, const StageArgs* stage) {
  const detail::GateProblem p = detail::validate_gate(g, r, stage);
  const bool cpu = g.y.device.type == Device::Type::kCPU;
  const char* what = stage != nullptr ? "gate_route_and_stage" : "gate_and_route";
  if (!detail::has_work(p)) return std::string(cpu ? "cpu" : "cuda") + " backend: nothing to do (T == 0)";
  const std::string gate = std::string(what) + ": the logits are computed in the call from y [" + std::to_string(p.T) +
                           ", " + std::to_string(p.H) + "] and weight [" + std::to_string(p.E) + ", " +
                           std::to_string(p.H) + "] (" + (p.weight_f32 ? "fp32" : "bf16") +
                           "), fp32 fused multiply-add chains of 16 columns folded in the contract's tree" +
                           (g.logits_out ? ", written to logits_out" : "");
  if (cpu) {
    // The router's text for logits_out, or a stand-in of the scratch (an address nothing reads).
    const TensorRef logits = g.logits_out ? *g.logits_out
                                          : TensorRef(reinterpret_cast<void*>(uintptr_t{1} << 40), DType::kFloat32,
                                                      {p.T, p.E}, g.y.device);
    return "cpu backend: " + gate +
           " (tiles of 16 experts over blocks of 64 tokens, worker threads for large calls); then " +
           describe(detail::gated_router_args(r, logits), stage);
  }
#if MEGAMOE_WITH_CUDA
  // The router call runs on the scratch logits (a dense [T, E] fp32 tensor at a stand-in
  // address: nothing is read), never PDL-chained to the gate kernel (cuda/launch/gate.cu);
  // tensors off their element size run on dense copies, the router's among them.
  GateArgs gb = g;
  RouterArgs rb = r;
  std::optional<StageArgs> sb;
  if (stage != nullptr) sb = *stage;
  const int moved =
      p.router.misaligned ? detail::move_misaligned_to_dense(detail::named_tensors(gb, rb, sb ? &*sb : nullptr),
                                                              scratch_address)
                          : 0;
  const bool enable_pdl = stage != nullptr ? stage->enable_pdl : r.enable_pdl;
  const TensorRef logits(scratch_address({}), DType::kFloat32, {p.T, p.E}, g.y.device);
  RouterArgs routed = detail::gated_router_args(rb, logits);
  routed.enable_pdl = false;
  if (sb) sb->enable_pdl = false;
  const std::string gate_launch = p.T > 0 ? "launch 1: memset of the counters + " +
                                                 cuda::explain_gate(p, enable_pdl, g.y.device.index) + "; launch 2: "
                                           : std::string("no gate launch (T == 0); ");
  std::string s = "cuda backend: " + gate + "; " + gate_launch +
                  cuda::explain_router(routed, sb ? &*sb : nullptr, p.router) + " (" +
                  (stage != nullptr ? "route_and_stage" : "route") + " T=" + std::to_string(p.T) +
                  " E=" + std::to_string(p.E) + " K=" + std::to_string(p.router.K) + ")";
  if (moved > 0) s += ", on dense copies of " + std::to_string(moved) + " tensor(s) off their element size";
  if (p.T > cuda::kGateTokens) {
    s += "; above the decode range (T > " + std::to_string(cuda::kGateTokens) +
         ") the gate runs one launch per " + std::to_string(cuda::kGateTokens) +
         " tokens and is slow: a GEMM (y @ weight.T) then route_and_stage is the faster path";
  }
  return s;
#else
  return "this build has no CUDA backend: y is on " + to_string(g.y.device) + " and " + what +
         " would throw (kUnsupported)";
#endif
}

std::string describe(const MhcPreArgs& m, const StageArgs& s) {
  const detail::MhcProblem p = detail::validate_mhc(m, s);
  const bool cpu = m.residual.device.type == Device::Type::kCPU;
  if (!detail::has_work(p)) return (cpu ? "cpu" : "cuda") + std::string(" backend: nothing to do (T == 0)");
  if (!cpu) {
#if MEGAMOE_WITH_CUDA
    const std::string sizes = "T=" + std::to_string(p.T) + " H=" + std::to_string(p.H) +
                              " hc_mult=" + std::to_string(p.hc) + " sinkhorn_repeat=" +
                              std::to_string(m.sinkhorn_repeat) + (m.pre_mix_in ? ", pre_mix_in" : "");
    if (cuda::mhc_fuses(p)) {
      return "cuda backend: one launch: " + cuda::explain_mhc(p, s.enable_pdl, m.residual.device.index) + " (" +
             sizes + (m.y ? ", rows to y" : ", no y") + "; " + core::format_name(p.stage.fmt) +
             " staged by the same kernel through the device API" +
             (p.stage.full_buffer ? ", full-buffer tail in its tail blocks" : "") + ")";
    }
    // Without y the rows go to dense stream-ordered scratch: the staging plan is that of a
    // dense [T, H] bf16 tensor (at a stand-in address; nothing is read).
    const TensorRef rows = m.y ? *m.y : TensorRef(scratch_address({}), DType::kBFloat16, {p.T, p.H}, m.residual.device);
    StageArgs staged = detail::staged_args(rows, s);
    staged.enable_pdl = false;  // stream-ordered after the mHC kernel (cuda/launch/mhc.cu)
    if (p.T == 0) return "cuda backend: no tokens: " + describe(staged);
    return "cuda backend: launch 1: " + cuda::explain_mhc(p, s.enable_pdl, m.residual.device.index) + " (" + sizes +
           (m.y ? ", rows to y" : ", rows to scratch") + "); launch 2: " + describe(staged);
#else
    return "this build has no CUDA backend: residual is on " + to_string(m.residual.device) +
           " and mhc_pre_and_stage would throw (kUnsupported)";
#endif
  }
  // Without y the rows go to host scratch: the staging plan is that of a dense [T, H] bf16
  // tensor (at a stand-in address; nothing is read).
  const TensorRef rows = m.y ? *m.y : TensorRef(scratch_address({}), DType::kBFloat16, {p.T, p.H}, m.residual.device);
  return "cpu backend: mhc_pre T=" + std::to_string(p.T) + " H=" + std::to_string(p.H) + " hc_mult=" +
         std::to_string(p.hc) + " sinkhorn_repeat=" + std::to_string(m.sinkhorn_repeat) +
         (m.pre_mix_in ? " with pre_mix_in" : "") + " then rmsnorm over token rows (worker threads for large problems)" +
         (m.y ? ", rows to y" : ", rows to scratch") + ", then " + describe(detail::staged_args(rows, s));
}

}  // namespace

std::string explain(const GateArgs& gate, const RouterArgs& router, const StageArgs* stage) {
  return detail::guarded("explain", [&] { return describe(gate, router, stage); });
}

std::string explain(const MhcPreArgs& mhc, const StageArgs& stage) {
  return detail::guarded("explain", [&] { return describe(mhc, stage); });
}

std::string explain(const RmsNormArgs& norm, const StageArgs& stage) {
  return detail::guarded("explain", [&] { return describe(norm, stage); });
}

std::string explain(const StageArgs& args) {
  return detail::guarded("explain", [&] { return describe(args); });
}

std::string explain(const RoutingArgs& args) {
  return detail::guarded("explain", [&] { return describe(args); });
}

std::string explain(const RouterArgs& router) {
  return detail::guarded("explain", [&] { return describe(router, nullptr); });
}

std::string explain(const RouterArgs& router, const StageArgs& stage) {
  return detail::guarded("explain", [&] { return describe(router, &stage); });
}

}  // namespace megamoe
