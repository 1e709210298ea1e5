// quantize_generic.cuh: the general staging kernel: any G, any strides, any alignment,
// every format but NVFP4 per-token (quantize_rowwise.cuh). One thread owns one packed
// scale word (4 groups) or one fp32-scale group, walks it with strided scalar accesses
// (amax first, then the values), stores the word or scale, and the row's first threads
// repack its top-k. 64-bit offsets.
#pragma once

#include "formats/recipe.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/topk.cuh"

namespace megamoe {
namespace cuda {
namespace {

template <int In, core::Format F, bool kCount>
__global__ void __launch_bounds__(256) stage_generic_kernel(const Params64 p) {
  static_assert(F != core::Format::kNvfp4PerToken, "per-token scales need the row kernel");
  constexpr bool kPacked = core::packed_scales(F);
  constexpr bool kFp4 = core::values_per_byte(F) == 2;
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  using Tr = InTraits<In>;
  const auto* hs = static_cast<const typename Tr::T*>(p.hs);
  const float s2 = static_scale2<F>(p);
  const int64_t groups = kPacked ? 4 : 1;     // groups per unit
  const int64_t span = groups * p.G;          // elements per unit
  const int64_t upr = p.H / span;             // units per row
  const int64_t n = p.T * upr;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t nf = 0;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += stride) {
    const int64_t t = u / upr, j = u - t * upr;
    uint32_t word = 0;
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int64_t h0 = j * span + gi * p.G;
      float amax = 0.0f;
      for (int64_t i = 0; i < p.G; ++i) {
        const float x = Tr::to_float(hs[t * p.hs_s0 + (h0 + i) * p.hs_s1]);
        amax = fmaxf(amax, core::abs_bits(x));
        if constexpr (kCount) nf += core::non_finite(x) ? 1u : 0u;
      }
      const core::GroupParams gp = group_params_of<F>(amax, p.floor, s2);
      if constexpr (kFp4) {  // G is even: values pair up into bytes, low nibble first
        for (int64_t i = 0; i < p.G; i += 2) {
          const float a = Tr::to_float(hs[t * p.hs_s0 + (h0 + i) * p.hs_s1]);
          const float b = Tr::to_float(hs[t * p.hs_s0 + (h0 + i + 1) * p.hs_s1]);
          const uint32_t byte = core::encode<F>(a, gp) | (core::encode<F>(b, gp) << 4);
          p.xq[t * p.xq_s0 + ((h0 + i) / 2) * p.xq_s1] = static_cast<uint8_t>(byte);
        }
      } else {
        for (int64_t i = 0; i < p.G; ++i) {
          const float x = Tr::to_float(hs[t * p.hs_s0 + (h0 + i) * p.hs_s1]);
          p.xq[t * p.xq_s0 + (h0 + i) * p.xq_s1] = static_cast<uint8_t>(core::encode<F>(x, gp));
        }
      }
      if constexpr (kPacked) {
        word |= gp.sf << (8 * gi);
      } else {
        store_fp32_scale<int64_t>(p, t, j, __uint_as_float(gp.sf));
      }
    }
    if constexpr (kPacked) store_word<int64_t>(p, t, j, word);
    repack_topk<int64_t>(p, t, j, upr);
  }
  if constexpr (kCount) flush_nonfinite(p.nonfinite, nf);
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
