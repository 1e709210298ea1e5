// api.cpp: the public entry points. Each validates once, then dispatches on the tensors'
// device; nothing but megamoe::Error leaves them (a server must be able to rely on one
// exception type: std::bad_alloc from a scratch buffer or std::system_error from a thread
// start become Error too).
#include <new>
#include <vector>
#include <string>
#include <system_error>

#include "check.h"
#include "cpu/fp_env.h"
#include "cpu/gate_cpu.h"
#include "cpu/stage_cpu.h"
#include "megamoe/error.h"
#include "megamoe/gate.h"
#include "megamoe/mhc.h"
#include "megamoe/norm.h"
#include "megamoe/router.h"
#include "megamoe/stage.h"
#include "contract/target.h"
#include "contract/validate.h"

namespace megamoe {

#if MEGAMOE_WITH_CUDA
namespace cuda {
void prepare_inputs(const StageArgs& args, const detail::Problem& p, Stream stream);
void stage_routing(const RoutingArgs& args, const detail::Problem& p, Stream stream);
void route(const RouterArgs& r, const StageArgs* stage, const detail::RouterProblem& p, Stream stream);
void rmsnorm_and_stage(const RmsNormArgs& n, const StageArgs& s, const detail::NormProblem& p, Stream stream);
void mhc_pre_and_stage(const MhcPreArgs& m, const StageArgs& s, const detail::MhcProblem& p, Stream stream);
void gate_route(const GateArgs& g, const RouterArgs& r, const StageArgs* s, const detail::GateProblem& p,
                Stream stream);
}
bool has_cuda_backend() noexcept { return true; }
#else
bool has_cuda_backend() noexcept { return false; }
#endif

namespace cpu {
void route(const RouterArgs& r, const detail::RouterProblem& p, const TensorRef* pad);
}

namespace {

using detail::guarded;

void dispatch(const StageArgs& args, const detail::Problem& p, Stream stream) {
  if (!detail::has_work(p)) return;
  if (args.hidden_states.device.type == Device::Type::kCPU) {
    cpu::prepare_inputs(args, p);
    return;
  }
#if MEGAMOE_WITH_CUDA
  cuda::prepare_inputs(args, p, stream);
#else
  (void)stream;
  throw Error(ErrorCode::kUnsupported,
              "megamoe: hidden_states: expected a CPU tensor (this build has no CUDA backend), "
              "got device " + to_string(args.hidden_states.device));
#endif
}

void dispatch_routing(const RoutingArgs& args, const detail::Problem& p, Stream stream) {
  if (!detail::has_work(p)) return;
  if (args.topk_ids.device.type == Device::Type::kCPU) {
    const cpu::DefaultFpEnv fp_env;  // the scaling's product, whatever the caller's rounding / FTZ / traps
    cpu::repack_topk(cpu::topk_io(args), p);
    return;
  }
#if MEGAMOE_WITH_CUDA
  cuda::stage_routing(args, p, stream);
#else
  (void)stream;
  throw Error(ErrorCode::kUnsupported,
              "megamoe: topk_ids: expected a CPU tensor (this build has no CUDA backend), got device " +
                  to_string(args.topk_ids.device));
#endif
}

/// route / route_and_stage (stage non-null) on the tensors' device.
void dispatch_router(const RouterArgs& r, const StageArgs* stage, const detail::RouterProblem& p, Stream stream) {
  if (!detail::has_work(p)) return;
  if (r.router_logits.device.type == Device::Type::kCPU) {
    if (p.T > 0) cpu::route(r, p, detail::router_padding(r, stage));
    // The staging reads the router's outputs as its top-k inputs (T == 0: only the tail).
    if (stage != nullptr && detail::has_work(p.stage)) cpu::prepare_inputs(detail::staged_args(r, *stage), p.stage);
    return;
  }
#if MEGAMOE_WITH_CUDA
  cuda::route(r, stage, p, stream);
#else
  (void)stream;
  throw Error(ErrorCode::kUnsupported,
              "megamoe: router_logits: expected a CPU tensor (this build has no CUDA backend), got device " +
                  to_string(r.router_logits.device));
#endif
}

/// rmsnorm_and_stage on the tensors' device.
void dispatch_norm(const RmsNormArgs& n, const StageArgs& s, const detail::NormProblem& p, Stream stream) {
  if (!detail::has_work(p)) return;
  if (n.x.device.type == Device::Type::kCPU) {
    cpu::rmsnorm_and_stage(n, s, p);
    return;
  }
#if MEGAMOE_WITH_CUDA
  cuda::rmsnorm_and_stage(n, s, p, stream);
#else
  (void)stream;
  throw Error(ErrorCode::kUnsupported,
              "megamoe: x: expected a CPU tensor (this build has no CUDA backend), got device " + to_string(n.x.device));
#endif
}

/// gate_route_and_stage / gate_and_route (stage non-null or not) on the tensors' device:
/// the logits into logits_out or scratch, then the router call of those logits, by the
/// router's own dispatch (its rules, its staging).
void dispatch_gate(const GateArgs& g, const RouterArgs& r, const StageArgs* stage, const detail::GateProblem& p,
                   Stream stream) {
  if (!detail::has_work(p)) return;
  if (g.y.device.type != Device::Type::kCPU) {
#if MEGAMOE_WITH_CUDA
    cuda::gate_route(g, r, stage, p, stream);
    return;
#else
    throw Error(ErrorCode::kUnsupported,
                "megamoe: y: expected a CPU tensor (this build has no CUDA backend), got device " +
                    to_string(g.y.device));
#endif
  }
  std::vector<float> scratch;
  TensorRef logits;
  if (g.logits_out) {
    logits = *g.logits_out;
  } else {
    // validate_gate proved that T * E * 4 bytes fit.
    scratch.resize(static_cast<size_t>(p.T * p.E));
    logits = TensorRef(scratch.data(), DType::kFloat32, {p.T, p.E}, g.y.device);
  }
  if (p.T > 0) cpu::gate_logits(g, p, logits);
  dispatch_router(detail::gated_router_args(r, logits), stage, p.router, stream);
}

/// mhc_pre_and_stage on the tensors' device.
void dispatch_mhc(const MhcPreArgs& m, const StageArgs& s, const detail::MhcProblem& p, Stream stream) {
  if (!detail::has_work(p)) return;
  if (m.residual.device.type == Device::Type::kCPU) {
    cpu::mhc_pre_and_stage(m, s, p);
    return;
  }
#if MEGAMOE_WITH_CUDA
  cuda::mhc_pre_and_stage(m, s, p, stream);
#else
  (void)stream;
  throw Error(ErrorCode::kUnsupported,
              "megamoe: mhc_pre_and_stage: residual: expected a CPU tensor (this build has no CUDA backend), got "
              "device " + to_string(m.residual.device));
#endif
}

}  // namespace

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCuda: return "cuda";
    case ErrorCode::kOutOfMemory: return "out_of_memory";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

namespace {
/// Status of @p f: ok, or the megamoe::Error it threw (nothing else can escape guarded()).
template <typename F>
Status status_of(F&& f) noexcept {
  Status s;
  try {
    f();
  } catch (const Error& e) {
    s.ok = false;
    s.code = e.code();
    try {
      s.message = e.what();
    } catch (...) {  // no memory even for the message: the code still tells
    }
  } catch (...) {
    s.ok = false;
    s.code = ErrorCode::kInternal;
  }
  return s;
}
}  // namespace

Status try_prepare_inputs(const StageArgs& args, Stream stream) noexcept {
  return status_of([&] { prepare_inputs(args, stream); });
}
Status try_validate(const StageArgs& args) noexcept {
  return status_of([&] { validate(args); });
}
Status try_stage_routing(const RoutingArgs& args, Stream stream) noexcept {
  return status_of([&] { stage_routing(args, stream); });
}
Status try_route_and_stage(const RouterArgs& router, const StageArgs& stage, Stream stream) noexcept {
  return status_of([&] { route_and_stage(router, stage, stream); });
}
Status try_rmsnorm_and_stage(const RmsNormArgs& norm, const StageArgs& stage, Stream stream) noexcept {
  return status_of([&] { rmsnorm_and_stage(norm, stage, stream); });
}
Status try_gate_route_and_stage(const GateArgs& gate, const RouterArgs& router, const StageArgs& stage,
                                Stream stream) noexcept {
  return status_of([&] { gate_route_and_stage(gate, router, stage, stream); });
}
Status try_gate_and_route(const GateArgs& gate, const RouterArgs& router, Stream stream) noexcept {
  return status_of([&] { gate_and_route(gate, router, stream); });
}
Status try_mhc_pre_and_stage(const MhcPreArgs& mhc, const StageArgs& stage, Stream stream) noexcept {
  return status_of([&] { mhc_pre_and_stage(mhc, stage, stream); });
}
Status try_route(const RouterArgs& router, Stream stream) noexcept {
  return status_of([&] { route(router, stream); });
}

void stage_routing(const RoutingArgs& args, Stream stream) {
  guarded("stage_routing", [&] { dispatch_routing(args, detail::validate_routing(args), stream); });
}

void prepare_inputs(const StageArgs& args, Stream stream) {
  guarded("prepare_inputs", [&] { dispatch(args, detail::validate_args(args), stream); });
}

void validate(const StageArgs& args) {
  guarded("validate", [&] { (void)detail::validate_args(args); });
}

void route_and_stage(const RouterArgs& router, const StageArgs& stage, Stream stream) {
  guarded("route_and_stage", [&] { dispatch_router(router, &stage, detail::validate_router(router, &stage), stream); });
}

void route(const RouterArgs& router, Stream stream) {
  guarded("route", [&] { dispatch_router(router, nullptr, detail::validate_router(router, nullptr), stream); });
}

void rmsnorm_and_stage(const RmsNormArgs& norm, const StageArgs& stage, Stream stream) {
  guarded("rmsnorm_and_stage", [&] { dispatch_norm(norm, stage, detail::validate_norm(norm, stage), stream); });
}
void validate_rmsnorm(const RmsNormArgs& norm, const StageArgs& stage) {
  guarded("validate_rmsnorm", [&] { (void)detail::validate_norm(norm, stage); });
}
device::StageTarget device::stage_target(const StageArgs& args) {
  device::StageTarget tg;
  guarded("stage_target", [&] { tg = detail::stage_target(args); });
  return tg;
}
void gate_route_and_stage(const GateArgs& gate, const RouterArgs& router, const StageArgs& stage, Stream stream) {
  guarded("gate_route_and_stage",
          [&] { dispatch_gate(gate, router, &stage, detail::validate_gate(gate, router, &stage), stream); });
}
void gate_and_route(const GateArgs& gate, const RouterArgs& router, Stream stream) {
  guarded("gate_and_route",
          [&] { dispatch_gate(gate, router, nullptr, detail::validate_gate(gate, router, nullptr), stream); });
}
void validate_gate(const GateArgs& gate, const RouterArgs& router, const StageArgs* stage) {
  guarded("validate_gate", [&] { (void)detail::validate_gate(gate, router, stage); });
}
void mhc_pre_and_stage(const MhcPreArgs& mhc, const StageArgs& stage, Stream stream) {
  guarded("mhc_pre_and_stage", [&] { dispatch_mhc(mhc, stage, detail::validate_mhc(mhc, stage), stream); });
}
void validate_mhc_pre(const MhcPreArgs& mhc, const StageArgs& stage) {
  guarded("validate_mhc_pre", [&] { (void)detail::validate_mhc(mhc, stage); });
}
void validate_router(const RouterArgs& router, const StageArgs* stage) {
  guarded("validate_router", [&] { (void)detail::validate_router(router, stage); });
}

}  // namespace megamoe
