// topk.cuh: the router top-k repack (docs/CONTRACT.md), entry by entry, the one of every
// kernel: the staging kernels (the split-topk and tile shapes give it blocks of their own,
// one entry per thread; the loop shape a grid-stride pass before its chunks; the general
// and row kernels each row's entries to the row's first threads), the routing-only kernel
// (routing.cuh) and, for its staged outputs and their tail, the router (router.cuh).
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/geometry.h"

namespace megamoe {
namespace cuda {
namespace {

/// The staged top-k entry (t, k): id and weight. P: any kernel's parameters with the
/// staged outputs' fields (idx_out, w_out and their strides io_s0, io_s1, wo_s0, wo_s1):
/// the staging kernels', the routing-only kernel's and the router's.
template <typename Idx, typename P>
__device__ __forceinline__ void store_entry(const P& p, Idx t, Idx k, int64_t id, float w) {
  p.idx_out[offset(t, p.io_s0, k, p.io_s1)] = id;
  p.w_out[offset(t, p.wo_s0, k, p.wo_s1)] = w;
}

/// Entry (t, k) of a full-buffer tail row (no token): -1 / +0.0, nothing read.
template <typename Idx, typename P>
__device__ __forceinline__ void mark_empty(const P& p, Idx t, Idx k) {
  store_entry(p, t, k, int64_t{-1}, 0.0f);
}

/// Top-k entry (t, k), t < T: padded rows get id -1 and weight 0, others a copy (ids
/// widened to int64, weights to fp32, times the routed scaling factor when the call has
/// one, then the expert's scale when it has a table: one fp32 product each). Both loads
/// (and the padding flag's) issue before any use.
/// P: the staging kernels' ParamsT<Idx> or the routing-only kernel's RoutingParams (the
/// same top-k fields and kFlag bits).
template <typename Idx, typename P>
__device__ __forceinline__ void repack_entry(const P& p, Idx t, Idx k) {
  const Idx ioff = offset(t, p.ids_s0, k, p.ids_s1);
  const Idx woff = offset(t, p.w_s0, k, p.w_s1);
  const int64_t id = (p.flags & kFlagIdsI64) ? static_cast<const int64_t*>(p.ids)[ioff]
                                             : static_cast<int64_t>(static_cast<const int32_t*>(p.ids)[ioff]);
  const bool w16 = (p.flags & (kFlagWBF16 | kFlagWF16)) != 0;
  const uint32_t wbits = w16 ? static_cast<uint32_t>(static_cast<const uint16_t*>(p.w)[woff])
                             : static_cast<const uint32_t*>(p.w)[woff];
  const uint8_t pad = p.pad != nullptr ? p.pad[t * p.pad_s0] : uint8_t{0};
  // fp16 weights by the software rule: the hardware conversion canonicalizes NaN payloads,
  // and a kept NaN weight is copied bit-exactly.
  const float w = (p.flags & kFlagWBF16)  ? core::bf16_to_float(static_cast<uint16_t>(wbits))
                  : (p.flags & kFlagWF16) ? core::half_to_float(static_cast<uint16_t>(wbits))
                                          : core::bits_float(wbits);
  float wk = (p.flags & kFlagAlpha) ? core::scale_weight(w, p.alpha) : w;
  // The expert's scale: a load that depends on the id, so only where the call has a table
  // and the entry is kept with an id inside it.
  if ((p.flags & kFlagExpertScales) && pad == 0 && id >= 0 && id < p.n_experts) {
    wk = core::scale_weight(wk, p.escale[id * p.es_s0]);
  }
  store_entry(p, t, k, pad != 0 ? int64_t{-1} : id, pad != 0 ? 0.0f : wk);
}


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
