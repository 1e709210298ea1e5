// rmsnorm.h: RMSNorm's rounding points (docs/CONTRACT.md "RMSNorm and stage"), the one
// copy of the math, shared bit for bit by the CPU backend and the kernels. vLLM's kernels
// sum the squares in the order of their block reduction and take rsqrtf (an approximation);
// here the order is fixed and every step is rounded to nearest even, so that any backend,
// any launch shape, gives the same bytes:
//   c_j = fl(...fl(fl(z_16j^2) + fl(z_16j+1^2)) ... + fl(z_16j+15^2))   (chunk j, in order)
//   c_j = +0 for n <= j < N, N the power of two >= n = H / 16; then for h = N/2, N/4, ..., 1:
//   c_j = fl(c_j + c_{j+h}) for j < h (the halves folded, highest first); S = c_0
//   s   = fl(1 / sqrt_rn(fl(fl(S / H) + eps)))
//   y   = bf16(fl(bf16(fl(z * s)) * w))
// (a row kernel's threads fold their own chunks first, then across lanes by the same rule:
// a thread holding chunks t, t + n_threads, ... folds them highest first, as the tree does).
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "formats/bf16/codec.h"  // bf16_from_float: nearest even, NaN 0x7FC0 (PyTorch's rule)

namespace megamoe {
namespace core {

constexpr int kNormChunk = 16;  ///< elements of one sequential partial sum of squares

/// The residual add: the fp32 sum of the two bf16 values rounded once to bf16 (PyTorch's
/// eager `x + residual` and vLLM's generic kernel).
MEGAMOE_HD uint16_t norm_add(uint16_t x, uint16_t r) {
  return bf16_from_float(add_rn(bf16_to_float(x), bf16_to_float(r)));
}

/// Sum of squares of one chunk of kNormChunk values, in order.
MEGAMOE_HD float norm_chunk_sumsq(const float* z) {
  float acc = mul_rn(z[0], z[0]);
  MEGAMOE_UNROLL
  for (int i = 1; i < kNormChunk; ++i) acc = add_rn(acc, mul_rn(z[i], z[i]));
  return acc;
}

/// The power of two the tree folds from (N >= n, n >= 1).
MEGAMOE_HD int64_t norm_tree_width(int64_t n) {
  int64_t w = 1;
  while (w < n) w <<= 1;
  return w;
}

/// The contract's tree over c[0..w) (w = norm_tree_width(n), c[n..w) = +0): for h = w/2,
/// ..., 1, c[j] = fl(c[j] + c[j + h]) for j < h; returns c[0] (c is overwritten).
MEGAMOE_HD float fold_halves(float* c, int64_t w) {
  for (int64_t h = w / 2; h >= 1; h /= 2) {
    for (int64_t j = 0; j < h; ++j) c[j] = add_rn(c[j], c[j + h]);
  }
  return c[0];
}

/// The row's scale from its sum S over H columns: fl(1 / sqrt_rn(fl(fl(S / H) + eps)))
/// (H <= 2^24: exact as an fp32).
MEGAMOE_HD float norm_scale(float S, int64_t H, float eps) {
  const float m = add_rn(div_rn(S, static_cast<float>(H)), eps);
  return div_rn(1.0f, sqrt_nearest(m));
}

/// One normalized element: bf16(fl(bf16(fl(z * s)) * w)).
MEGAMOE_HD uint16_t norm_element(float z, float s, float w) {
  return bf16_from_float(mul_rn(bf16_to_float(bf16_from_float(mul_rn(z, s))), w));
}

}  // namespace core
}  // namespace megamoe
