// gate.h: the gate's dot product (docs/CONTRACT.md "Gate, route and stage"), the one copy
// of the math, shared bit for bit by the CPU backend and the kernels. A GEMM library sums
// in the order of its tiling (split-K, warp shuffles), which changes with the launch shape;
// here the order is fixed, the norm's (core/rmsnorm.h) with fused multiply-adds:
//   c_j = fma(y_16j+15, w_16j+15, ... fma(y_16j+1, w_16j+1, fma(y_16j, w_16j, +0)))
//         (chunk j of n = ceil(H / 16), in column order; a last shorter chunk stops early)
//   c_j = +0 for n <= j < N, N the power of two >= n; then for h = N/2, N/4, ..., 1:
//   c_j = fl(c_j + c_{j+h}) for j < h (the halves folded, highest first); logit = c_0
// A chain starts from +0 and a fused multiply-add rounds an exact zero to +0 (round to
// nearest), so no c_j is ever -0: the zeros that pad the last chunk or the tree change no
// bit, and a backend may skip them. Any split of the chunks into S = 2^s interleaved
// shares (share r holds the chunks j = r mod S) folds its own chunks, highest first, down
// to one value c_r, and the S shares then fold by the same rule: the split-K form a GPU
// kernel takes (one share a block or a warp, then the hand-off of the S partial sums).
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "core/rmsnorm.h"  // norm_tree_width: the fold is the norm's

namespace megamoe {
namespace core {

constexpr int kGateChunk = 16;  ///< columns of one sequential fused multiply-add chain

/// Chunks of a row of H columns: ceil(H / 16).
MEGAMOE_HD int64_t gate_chunks(int64_t H) { return (H + kGateChunk - 1) / kGateChunk; }

/// The power of two the fold starts from (N >= n, n >= 1): the norm's tree width.
MEGAMOE_HD int64_t gate_tree_width(int64_t n) { return norm_tree_width(n); }

/// One step of a chunk's chain: fl(y * w + acc), one rounding (the GPU's __fmaf_rn; on the
/// host std::fma, which glibc rounds correctly in software where the CPU has no FMA).
MEGAMOE_HD float gate_step(float y, float w, float acc) { return fma_rn(y, w, acc); }

/// A chunk of @p count <= 16 columns: the chain from +0 in column order.
MEGAMOE_HD float gate_chunk(const float* y, const float* w, int count) {
  float acc = 0.0f;
  for (int i = 0; i < count; ++i) acc = gate_step(y[i], w[i], acc);
  return acc;
}

/// Fold @p N (a power of two) chunk sums, kLanes independent rows of them interleaved
/// (c[j * kLanes + l] is chunk j of row l), highest halves first; row l's logit ends in c[l].
template <int kLanes>
MEGAMOE_HD void gate_fold(float* c, int64_t N) {
  for (int64_t h = N / 2; h >= 1; h /= 2) {
    for (int64_t j = 0; j < h; ++j) {
      MEGAMOE_UNROLL
      for (int l = 0; l < kLanes; ++l) c[j * kLanes + l] = add_rn(c[j * kLanes + l], c[(j + h) * kLanes + l]);
    }
  }
}

/// A logit as the call writes it: a NaN as the quiet NaN 0x7FC00000 (a CPU's fused
/// multiply-add keeps an input NaN's payload, a GPU's returns its canonical NaN; the bytes
/// of logits_out must not differ), every other value as it is.
MEGAMOE_HD float gate_output(float v) { return v != v ? bits_float(0x7FC00000u) : v; }

}  // namespace core
}  // namespace megamoe
