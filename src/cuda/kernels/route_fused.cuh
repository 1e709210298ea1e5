// route_fused.cuh: the fused router + staging kernel (router.cu's file comment) and its
// dispatch from a plan to one of its 480 variants (60 of them decode variants). Included
// by the three launch units that instantiate it, one per input dtype (route_fused_bf16.cu,
// route_fused_f16.cu, route_fused_f32.cu), so that they compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_util.cuh"
#include "cuda/plan.h"
#include "cuda/quantize_fast.cuh"
#include "cuda/router.cuh"
#include "formats/visit.h"
#include "megamoe/error.h"

namespace megamoe {
namespace cuda {

/// The fused kernel of plan @p pl (a fast plan with pl.grid = its quantizing blocks plus
/// rp.blocks router blocks) for hidden states of input kind bf16 / f16 / f32.
/// @p decode: use the decode variant where the plan has one (kFusedDecodeBlocksPerSm).
void route_fused_bf16(const Plan& pl, const StageArgs& a, const detail::Problem& p, const RouterParams& rp,
                      bool decode, cudaStream_t stream);
void route_fused_f16(const Plan& pl, const StageArgs& a, const detail::Problem& p, const RouterParams& rp,
                     bool decode, cudaStream_t stream);
void route_fused_f32(const Plan& pl, const StageArgs& a, const detail::Problem& p, const RouterParams& rp,
                     bool decode, cudaStream_t stream);

namespace {

/// The fused kernel's parameters: the staging block's, then the router's.
template <typename Idx>
struct FusedParams {
  ParamsT<Idx> q;
  RouterParams r;
};

/// The most scores a fused router thread runs side by side (router_block): 2, without
/// spills in the fp32 variants (a 64-register budget) and with some outside the chains in
/// the 16-bit ones (32 registers, the quantizing blocks' occupancy).
constexpr int kFusedChains = 2;

/// Resident blocks per SM the fused kernel is built for: the fast kernel's for 16-bit
/// inputs (the decode and prefill case: the quantizing blocks keep their occupancy), and
/// the fast kernel's lowest for fp32 inputs (the router's registers come on top).
template <int In>
constexpr int kFusedBlocksPerSm = In != kInF32 ? kFastBlocksPerSm16 : 4;

/// The decode variant (kDecode): for grids the GPU holds at once at this many blocks per
/// SM (route() decides), where the quantizing blocks' occupancy does not matter and the
/// router block is the launch's critical path. Its registers (64) hold the router inlined,
/// every parameter a constant-bank operand as in route_kernel (no copy into shared memory,
/// no spills), with kDecodeChains scores side by side: 2, what one token a block needs for
/// E <= 512 with 256 threads (the branch-free chains interleave, and 3 of them spilled
/// here). Only split-topk plans with 32-bit indices get it (the decode plans), which keeps
/// the extra instantiations few.
constexpr int kDecodeChains = 2;
template <Mode M, Shape S>
constexpr bool kHasDecodeVariant = M == Mode::kIdx32 && S == Shape::kSplitTopk;

/// Blocks [0, r.blocks) are router blocks; blocks from r.blocks on quantize exactly as
/// stage_fast_kernel's quantizing blocks [0, quant_blocks) of the same plan. The router
/// blocks come first because blocks are dispatched in index order: when the grid is larger
/// than what the GPU holds at once (prefill), router blocks placed last would start only
/// after most quantizing blocks have finished, and their latency would add to the
/// staging's instead of overlapping it.
template <int In, core::Format F, int G, Mode kMode, Shape kShape, Extras X, bool kDecode>
__global__ void __launch_bounds__(256, kDecode ? kFusedDecodeBlocksPerSm : kFusedBlocksPerSm<In>)
    route_stage_kernel(const __grid_constant__ FusedParams<IdxOf<kMode>> fp) {
  using Idx = IdxOf<kMode>;
  const ParamsT<Idx>& p = fp.q;
  constexpr bool kStream = kMode != Mode::kIdx32;
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  if (blockIdx.x < fp.r.blocks) {  // block-uniform
    if constexpr (kDecode) {
      router_block_body<kDecodeChains, true>(fp.r, blockIdx.x);
    } else {
      __shared__ RouterParams sh_r;
      router_params_to_shared(fp.r, sh_r);
      router_block<kFusedChains>(sh_r, blockIdx.x);
    }
    return;
  }
  const uint32_t qb = blockIdx.x - fp.r.blocks;  // the quantizing block's index
  const float s2 = static_scale2<F>(p);
  uint32_t nf = 0;
  if constexpr (kShape == Shape::kTile) {
    for (uint32_t i = qb; i < p.n_tiles; i += p.quant_blocks) stage_tile<In, F, G, kStream, X>(p, i, s2, nf);
  } else if constexpr (kShape == Shape::kSplitTopk) {
    stage_chunk<In, F, G, kStream, X, false>(p, qb * blockDim.x + threadIdx.x, s2, nf, nullptr);
  } else {
    // The loop shape's grid-stride loop over the quantizing blocks only (32-bit modes: the
    // plan's n_chunks + grid threads < 2^32 covers this smaller stride).
    const Idx step = static_cast<Idx>(p.quant_blocks) * blockDim.x;
    for (Idx base = static_cast<Idx>(qb) * blockDim.x; base < p.n_chunks; base += step) {
      stage_chunk<In, F, G, kStream, X, false>(p, base + threadIdx.x, s2, nf, nullptr);
    }
  }
  if constexpr (X == Extras::kCount) flush_nonfinite(p.nonfinite, nf);
}

/// Calls v.template go<In, F, G, Mode, Shape>() for the fast-kernel variant a plan names.
template <class V, int In, core::Format F, int G, Mode M>
void visit_shape(const Plan& pl, const V& v) {
  if constexpr (M == Mode::kIdx64Stream) {
    v.template go<In, F, G, M, Shape::kLoop>();
  } else if (pl.shape == Shape::kSplitTopk) {
    v.template go<In, F, G, M, Shape::kSplitTopk>();
  } else if (pl.shape == Shape::kTile) {
    v.template go<In, F, G, M, Shape::kTile>();
  } else {
    v.template go<In, F, G, M, Shape::kLoop>();
  }
}

template <class V, int In, core::Format F, int G>
void visit_mode(const Plan& pl, const V& v) {
  if (pl.index == IndexWidth::k64) return visit_shape<V, In, F, G, Mode::kIdx64Stream>(pl, v);
  if (pl.store == StorePolicy::kEvictFirst) return visit_shape<V, In, F, G, Mode::kIdx32Stream>(pl, v);
  visit_shape<V, In, F, G, Mode::kIdx32>(pl, v);
}

template <class V, int In>
void visit_fused_format(const Plan& pl, const V& v) {
  const bool launched = core::visit_fast_group(pl.fmt, pl.G, [&](auto f, auto g) {
    visit_mode<V, In, decltype(f)::value, decltype(g)::value>(pl, v);
  });
  if (!launched) throw Error(ErrorCode::kInternal, "megamoe: route_and_stage: no fused kernel for " + to_string(pl));
}

/// Launches the fused kernel of one variant; @p decode: the decode variant where it exists
/// (route(): fused_decode_variant, plan.h).
struct FusedLaunch {
  const Plan& pl;
  const StageArgs& a;
  const detail::Problem& p;
  const RouterParams& r;
  bool decode;
  cudaStream_t stream;
  template <int In, core::Format F, int G, Mode M, Shape S>
  void go() const {
    if constexpr (kHasDecodeVariant<M, S>) {
      if (decode) return go_variant<In, F, G, M, S, true>();
    }
    go_variant<In, F, G, M, S, false>();
  }
  template <int In, core::Format F, int G, Mode M, Shape S, bool kDecode>
  void go_variant() const {
    const FusedParams<IdxOf<M>> fp{make_params<IdxOf<M>>(a, p, pl), r};
    // The staging kernel's variants (launch_fast.cuh): the counter, a floor read from the
    // parameters, or the default floor compiled in.
    if (pl.count_nonfinite) {
      return launch_kernel(route_stage_kernel<In, F, G, M, S, Extras::kCount, kDecode>, fp, pl, stream);
    }
    if constexpr (kUsesFloor<F>) {
      if (p.floor != core::kAmaxFloor) {
        return launch_kernel(route_stage_kernel<In, F, G, M, S, Extras::kFloor, kDecode>, fp, pl, stream);
      }
    }
    launch_kernel(route_stage_kernel<In, F, G, M, S, Extras::kNone, kDecode>, fp, pl, stream);
  }
};

}  // namespace
}  // namespace cuda
}  // namespace megamoe
