// quantize_rowwise.cuh: the row kernel, for formats whose groups depend on the whole
// token row (NVFP4 per-token: the per-token scale max(row_amax, floor) / 2688 comes
// first). One block per token row (block-stride loop over rows), one thread per 16-element
// group (loop over the row's groups), two passes over the row: (1) the row's amax, reduced
// over the block, the per-token scale written to x_scales; (2) each group's amax again, its
// e4m3 scale byte and its 16 nibbles. The second pass reads the row again; it comes from L1
// or L2, so DRAM still sees each byte once. kVec: hidden rows contiguous and 16-byte
// aligned, x_q rows 8-byte aligned (16-byte loads, 8-byte stores); else strided scalars.
#pragma once

#include "core/formats.h"
#include "cuda/chunk.cuh"
#include "cuda/common.cuh"
#include "cuda/topk.cuh"

namespace megamoe {
namespace cuda {
namespace {

constexpr int kRowMaxWarps = 32;  // 1024-thread blocks at most

/// Group g (16 elements) of row t, as fp32, from a strided row.
template <int In>
__device__ __forceinline__ void load_group_strided(const Params64& p, int64_t t, int64_t g, float (&x)[kChunk]) {
  const auto* hs = static_cast<const typename InTraits<In>::T*>(p.hs);
#pragma unroll
  for (int i = 0; i < kChunk; ++i) x[i] = InTraits<In>::to_float(hs[t * p.hs_s0 + (g * kChunk + i) * p.hs_s1]);
}

/// NaN-ignoring max |x| of a strided group, and its non-finite elements when counting.
template <bool kCount>
__device__ __forceinline__ float group_amax_strided(const float (&x)[kChunk], uint32_t& nf) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    amax = fmaxf(amax, core::abs_bits(x[i]));
    if constexpr (kCount) nf += core::non_finite(x[i]) ? 1u : 0u;
  }
  return amax;
}

template <int In, bool kVec, bool kCount>
__global__ void __launch_bounds__(1024) stage_rowwise_kernel(const Params64 p) {
  constexpr core::Format F = core::Format::kNvfp4PerToken;
  static_assert(core::fixed_group_of(F) == kChunk, "one thread per 16-element group");
  __shared__ float warp_max[kRowMaxWarps];
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  const int64_t groups = p.H / kChunk;
  const auto* hs = static_cast<const typename InTraits<In>::T*>(p.hs);
  const uint32_t lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, warps = blockDim.x / 32u;
  uint32_t nf = 0;
  for (int64_t t = blockIdx.x; t < p.T; t += gridDim.x) {
    // Pass 1: the row's amax (0 when every element is NaN, as the CPU backend's fold from 0).
    float amax = 0.0f;
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      if constexpr (kVec) {
        RawChunk<In> x;
        load_chunk<In>(hs + t * p.hs_s0 + g * kChunk, x);
        amax = fmaxf(amax, chunk_amax<In>(x));
        if constexpr (kCount) nf += chunk_nonfinite<In>(x);
      } else {
        float x[kChunk];
        load_group_strided<In>(p, t, g, x);
        amax = fmaxf(amax, group_amax_strided<kCount>(x, nf));
      }
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    float row_amax = 0.0f;
    for (uint32_t w = 0; w < warps; ++w) row_amax = fmaxf(row_amax, warp_max[w]);
    const float pts = core::per_token_scale(row_amax, p.floor);
    if (threadIdx.x == 0) p.x_scales[t * p.xs_s0] = pts;
    // Pass 2: groups.
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      uint32_t ignored = 0;
      if constexpr (kVec) {
        RawChunk<In> x;
        load_chunk<In>(hs + t * p.hs_s0 + g * kChunk, x);
        // From 0 like the CPU backend's fold: an all-NaN group has amax 0 (chunk_amax: NaN).
        const core::GroupParams gp = core::group_params<F>(fmaxf(0.0f, chunk_amax<In>(x)), p.floor, pts);
        const Encoded<F> q = encode_chunk<F, In>(x, gp);
        store_words<false>(p.xq + t * p.xq_s0 + g * (kChunk / 2), q.w);
        store_word_byte<int64_t>(p, t, g / 4, static_cast<uint32_t>(g % 4), gp.sf);
      } else {
        float x[kChunk];
        load_group_strided<In>(p, t, g, x);
        const core::GroupParams gp = core::group_params<F>(group_amax_strided<false>(x, ignored), p.floor, pts);
#pragma unroll
        for (int i = 0; i < kChunk; i += 2) {
          const uint32_t byte = core::encode<F>(x[i], gp) | (core::encode<F>(x[i + 1], gp) << 4);
          p.xq[t * p.xq_s0 + (g * (kChunk / 2) + i / 2) * p.xq_s1] = static_cast<uint8_t>(byte);
        }
        store_word_byte<int64_t>(p, t, g / 4, static_cast<uint32_t>(g % 4), gp.sf);
      }
    }
    repack_topk<int64_t>(p, t, threadIdx.x, blockDim.x);
    __syncthreads();  // warp_max is free for the next row
  }
  if constexpr (kCount) flush_nonfinite(p.nonfinite, nf);
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
