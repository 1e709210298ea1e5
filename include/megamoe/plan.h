/// @file plan.h
/// @brief What a staging call would launch, as text: for logs, bug reports and tuning.
#pragma once

#include <string>

#include "megamoe/gate.h"
#include "megamoe/mhc.h"
#include "megamoe/norm.h"
#include "megamoe/router.h"
#include "megamoe/stage.h"

namespace megamoe {

/// @brief Validate @p args (as prepare_inputs would) and describe what staging them runs,
/// without running it.
///
/// CUDA tensors: "cuda backend: kernel=... format=... in=... G=... index=... shape=...
/// threads=... grid=... quant_blocks=... stores=... pdl=... nonfinite=... vectorized=..."
/// (the kernel choice, made from the tensors' layout and the device's SM count and
/// compute capability). CPU tensors: "cpu backend: ...". A build without the CUDA backend
/// says so for CUDA tensors. The text is for people: its wording may change between versions.
/// @throws megamoe::Error for invalid arguments (the same checks as prepare_inputs) or a
///   failing CUDA device query.
std::string explain(const StageArgs& args);

/// @brief The same for stage_routing: "cuda backend: kernel=routing threads=... grid=...
/// pdl=..." or "cpu backend: ...".
std::string explain(const RoutingArgs& args);

/// @brief The same for route(): the router kernel's launch ("cuda backend: kernel=router
/// threads=... tokens_per_block=... router_blocks=... pdl=...").
std::string explain(const RouterArgs& router);

/// @brief The same for route_and_stage(): one fused launch ("kernel=router+stage (one
/// launch) ... | quantizing blocks: <the staging plan>"), the router kernel then the staging
/// plan's kernel (generic and row-kernel plans), or the router kernel alone (T == 0, H == 0).
std::string explain(const RouterArgs& router, const StageArgs& stage);

/// @brief The same for rmsnorm_and_stage(): on CUDA two launches, "launch 1: kernel=rmsnorm
/// threads=... grid=... smem=... per_thread=... pdl=... (rows to y | rows to scratch);
/// launch 2: <the staging plan of the normalized rows>".
std::string explain(const RmsNormArgs& norm, const StageArgs& stage);

/// @brief The same for gate_route_and_stage() (@p stage non-null) or gate_and_route(): the
/// logits computed in the call (their fixed order, over which tiles), then the router call
/// on them. CUDA tensors: the gate is not run on CUDA yet, and the text says so.
std::string explain(const GateArgs& gate, const RouterArgs& router, const StageArgs* stage = nullptr);

/// @brief The same for mhc_pre_and_stage(): on the CPU "cpu backend: mhc_pre T=... H=...
/// hc_mult=... sinkhorn_repeat=... then rmsnorm over token rows, then <the staging plan>";
/// CUDA tensors: the call would throw (kUnsupported, no kernel yet).
std::string explain(const MhcPreArgs& mhc, const StageArgs& stage);

}  // namespace megamoe
