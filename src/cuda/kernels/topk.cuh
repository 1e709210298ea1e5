// topk.cuh: the router top-k repack (docs/CONTRACT.md), entry by entry, the one of every
// kernel: the staging kernels (the split-topk and tile shapes give it blocks of their own,
// one entry per thread; the loop shape a grid-stride pass before its chunks; the general
// and row kernels each row's entries to the row's first threads), the routing-only kernel
// (routing.cuh) and, for its staged outputs and their tail, the router (router.cuh).
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/geometry.h"
#include "megamoe/device/topk.cuh"

namespace megamoe {
namespace cuda {
namespace {

// store_entry, mark_empty and repack_entry are the public device API's
// (megamoe/device/topk.cuh): the library's kernels and producers share them.
using device::mark_empty;
using device::repack_entry;
using device::store_entry;

/// Top-k repack of row t, entries k = first, first + step, ...
template <typename Idx>
__device__ __forceinline__ void repack_topk(const ParamsT<Idx>& p, Idx t, Idx first, Idx step) {
  for (Idx k = first; k < p.K; k += step) repack_entry(p, t, k);
}

/// The loop shape's top-k entries: a grid-stride pass over the flattened [T, K] (n_topk),
/// whole warps on consecutive entries. Inside the chunk loop a row's first K chunk threads
/// took them, and the warp holding those lanes ran the repack path for all 32: one warp a
/// row (an eighth of the warps at H = 4096). 32-bit modes: n_topk < 2^31 and the loop grid
/// has at most kMaxGridThreads, so e never wraps.
template <typename Idx>
__device__ __forceinline__ void repack_dense(const ParamsT<Idx>& p) {
  const Idx step = static_cast<Idx>(gridDim.x) * blockDim.x;
  for (Idx e = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; e < p.n_topk; e += step) {
    Idx t;
    if constexpr (sizeof(Idx) == 4) t = core::fastdiv(e, p.k_div);
    else t = e / p.K;
    repack_entry(p, t, e - t * p.K);
  }
}

/// Row of entry e < n_topk of the flattened [T, K] (or [M, K]): by the multiply-high k_div
/// wherever every entry index fits 32 bits (then K does too, and fastdiv is exact:
/// tests/cpp/test_fastdiv.cpp), which 32-bit modes guarantee (n_topk < 2^31, fits_idx32)
/// and split rows have at decode; by a division beyond.
template <typename Idx>
__device__ __forceinline__ Idx topk_row_of(const ParamsT<Idx>& p, Idx e) {
  if constexpr (sizeof(Idx) == 4) return core::fastdiv(e, p.k_div);
  else return p.n_topk <= int64_t{UINT32_MAX} ? Idx{core::fastdiv(static_cast<uint32_t>(e), p.k_div)} : e / p.K;
}

/// The top-k blocks (the blocks from quant_blocks on; plan.h topk_block_count) of the
/// split-topk, split-half and tile shapes (32-bit modes) and of split rows (64-bit): the
/// first ceil(T * K / blockDim.x) repack entry (b - quant_blocks) * blockDim.x +
/// threadIdx.x of the flattened [T, K]; in full-buffer mode (n_topk = M * K, those shapes
/// only: plan.cpp tail_in_topk_blocks) the blocks after them mark the tail rows T..M-1
/// empty, -1 / +0.0, nothing read, kTailEntriesPerThread entries a thread, blockDim.x apart
/// (each store instruction of a warp stays contiguous).
template <typename Idx>
__device__ __forceinline__ void repack_block(const ParamsT<Idx>& p) {
  const Idx b = static_cast<Idx>(blockIdx.x - p.quant_blocks);
  const Idx real = p.T * p.K;  // <= n_topk
  if (b * blockDim.x < real) {  // block-uniform: a block of rows 0..T-1
    const Idx e = b * blockDim.x + threadIdx.x;
    if (e >= real) return;
    const Idx t = topk_row_of(p, e);
    repack_entry(p, t, e - t * p.K);
    return;
  }
  // Only the 32-bit shapes fill the tail here; split rows' blocks all hold rows 0..T-1, and
  // their kernel, on the decode chain, keeps no code for it.
  if constexpr (sizeof(Idx) != 4) return;
  const Idx real_blocks = (real + blockDim.x - 1) / blockDim.x;
  const Idx base = real + (b - real_blocks) * blockDim.x * kTailEntriesPerThread + threadIdx.x;
#pragma unroll
  for (int r = 0; r < kTailEntriesPerThread; ++r) {
    const Idx e = base + static_cast<Idx>(r) * blockDim.x;  // 32-bit modes: < n_topk + grid threads < 2^32
    if (e >= p.n_topk) return;
    const Idx t = topk_row_of(p, e), k = e - t * p.K;
    mark_empty(p, t, k);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
