// route_fused.cuh: the fused router + staging kernel (launch/router.cu's file comment); its
// dispatch from a plan to one of its variants is launch/route_fused.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/geometry.h"
#include "cuda/kernels/quantize_fast.cuh"
#include "cuda/kernels/router.cuh"

namespace megamoe {
namespace cuda {

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

}  // namespace
}  // namespace cuda
}  // namespace megamoe
