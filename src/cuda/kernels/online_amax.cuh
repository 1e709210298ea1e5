// online_amax.cuh: NVFP4 online's global scale (docs/DESIGN.md "NVFP4 online"). Each block
// takes units (a row's span of threads x kOnlineVecsPerThread 16-byte vectors) in a
// grid-stride loop, reduces their NaN-ignoring max |x| and then either stores gs itself
// (one block: the whole tensor's max) or atomicMax-es its candidate core::online_candidate,
// a non-negative float compared as uint32 bits, into the word a memset zeroed (several
// blocks: the candidate is monotone in the amax, so the largest is the tensor's gs).
// Vectorized rows take 16-byte loads; others strided scalar loads. 64-bit offsets.
#pragma once

#include <cstdint>

#include "cuda/kernels/common.cuh"
#include "formats/nvfp4/recipe.h"

namespace megamoe {
namespace cuda {
namespace {

struct OnlineParams {
  const void* hs;
  int64_t hs_s0, hs_s1;  // element strides
  int64_t T, H;
  int64_t row_units;     // units a row
  float floor;
  float* gs;             // global_scale (out)
  uint32_t flags;        // kOnlinePdl, kOnlineAtomic
};
enum : uint32_t { kOnlinePdl = 1u, kOnlineAtomic = 2u };

/// |x| of the 16-bit pair in @p w folded into @p m (NaN ignored: fmaxf).
template <int In>
__device__ __forceinline__ float amax_word(float m, uint32_t w) {
  using Tr = InTraits<In>;
  m = fmaxf(m, core::abs_bits(Tr::to_float(static_cast<uint16_t>(w & 0xFFFFu))));
  return fmaxf(m, core::abs_bits(Tr::to_float(static_cast<uint16_t>(w >> 16))));
}

template <int In, bool kVec, int kVecs>
__global__ void __launch_bounds__(256) online_amax_kernel(const OnlineParams p) {
  if (p.flags & kOnlinePdl) pdl_wait_and_trigger();
  using Tr = InTraits<In>;
  using T = typename Tr::T;
  constexpr int kPerVec = 16 / static_cast<int>(sizeof(T));  // elements a 16-byte vector
  const int64_t span = static_cast<int64_t>(blockDim.x) * kVecs * kPerVec;
  const int64_t units = p.T * p.row_units;
  float m = 0.0f;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t t = u / p.row_units;
    const int64_t h0 = (u - t * p.row_units) * span;
    if constexpr (kVec) {
      // Row t is contiguous and its start 16-byte aligned; H is a multiple of 128, so every
      // vector lies inside the row.
      const uint4* row = reinterpret_cast<const uint4*>(static_cast<const T*>(p.hs) + t * p.hs_s0);
      uint4 v[kVecs];
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int64_t h = h0 + (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * kPerVec;
        v[i] = h < p.H ? __ldg(row + h / kPerVec) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if constexpr (In == kInF32) {
            m = fmaxf(m, core::abs_bits(__uint_as_float(w[k])));
          } else {
            m = amax_word<In>(m, w[k]);
          }
        }
      }
    } else {
      const T* hs = static_cast<const T*>(p.hs);
      for (int i = 0; i < kVecs * kPerVec; ++i) {
        const int64_t h = h0 + static_cast<int64_t>(i) * blockDim.x + threadIdx.x;
        if (h < p.H) m = fmaxf(m, core::abs_bits(Tr::to_float(hs[t * p.hs_s0 + h * p.hs_s1])));
      }
    }
  }
  // The block's max: warps by shuffles, then warp 0 over the warps' maxima.
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  __shared__ float warp_max[32];
  const unsigned warp = threadIdx.x / 32u, lane = threadIdx.x % 32u;
  if (lane == 0u) warp_max[warp] = m;
  __syncthreads();
  if (warp != 0u) return;
  m = lane < (blockDim.x + 31u) / 32u ? warp_max[lane] : 0.0f;
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  if (lane != 0u) return;
  if (p.flags & kOnlineAtomic) {
    const float c = core::online_candidate(m, p.floor);  // >= 0, never NaN
    if (__float_as_uint(c) != 0u) atomicMax(reinterpret_cast<unsigned int*>(p.gs), __float_as_uint(c));
  } else {
    *p.gs = core::online_global_scale(m, p.floor);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
