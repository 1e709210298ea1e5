// norm_stage.cuh: rmsnorm_and_stage in one launch (every format but NVFP4 online, whose
// global scale needs the whole tensor first): the norm kernel's row (norm.cuh, the
// contract's tree) and then the staging of that row through the public device API
// (megamoe/device/stage.cuh), one block a row:
//   1. z into shared memory and the row's scale s (norm_row);
//   2. NVFP4 per token: the row's max |y| (y recomputed from z, a block reduction);
//   3. parts of 8 values: y = norm_element(z, s, w), written to y when the call has it, and
//      staged as part of its group (groups of G >= 8 values spread over G / 8 lanes:
//      stage_group_part, store_scale_part; bf16 stores y itself). Groups of fewer values
//      (fp8 with G < 8) are staged a group a thread from y in shared memory instead;
//   4. the row's top-k entries.
// Blocks from T on mark the full-buffer tail. The staged bytes are those of
// prepare_inputs(y): the same bf16 rows through the same recipes.
#pragma once

#include <cstdint>

#include "cuda/kernels/geometry.h"
#include "cuda/kernels/norm.cuh"
#include "megamoe/device/stage.cuh"

namespace megamoe {
namespace cuda {
namespace {

constexpr int kNormPart = 8;  ///< values of a part (16 bytes of bf16)

/// Part c (columns 8c .. 8c+7) of row t: y's bf16 bits from z in shared memory.
__device__ __forceinline__ void norm_part(const NormParams& p, const uint16_t* z_s, int64_t c, float s,
                                          uint16_t (&y)[kNormPart]) {
  const int64_t h0 = c * kNormPart;
  uint16_t z[kNormPart];
  unpack8(*reinterpret_cast<const uint4*>(z_s + h0), z);
  float w[kNormPart];
  if (p.w_vec && !p.w_f32) {
    uint16_t b[kNormPart];
    unpack8(*reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.w) + h0), b);
#pragma unroll
    for (int i = 0; i < kNormPart; ++i) w[i] = core::bf16_to_float(b[i]);
  } else if (p.w_vec) {
    const float4 a = reinterpret_cast<const float4*>(static_cast<const float*>(p.w) + h0)[0];
    const float4 b = reinterpret_cast<const float4*>(static_cast<const float*>(p.w) + h0)[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < kNormPart; ++i) w[i] = norm_weight(p, h0 + i);
  }
#pragma unroll
  for (int i = 0; i < kNormPart; ++i) y[i] = core::norm_element(core::bf16_to_float(z[i]), s, w[i]);
}

/// The block's NaN-ignoring max of each thread's @p v (every thread gets it). red: P floats
/// of shared memory no thread still reads.
__device__ __forceinline__ float block_max(float v, float* red) {
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  red[tid] = v;
  __syncthreads();
  for (int h = P / 2; h >= 1; h /= 2) {
    if (tid < h) red[tid] = fmaxf(red[tid], red[tid + h]);
    __syncthreads();
  }
  return red[0];
}

/// Blocks from T on: each marks P * kNormTailEntriesPerThread full-buffer tail entries
/// (rows T..M-1), P apart.
__device__ __forceinline__ void mark_tail_block(const device::StageTarget& tg, int64_t b) {
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int64_t first = tg.T * tg.K + (b - tg.T) * P * kNormTailEntriesPerThread + tid;
  for (int r = 0; r < kNormTailEntriesPerThread; ++r) {
    const int64_t e = first + static_cast<int64_t>(r) * P;
    if (e >= tg.M * tg.K) return;
    const int64_t t = e / tg.K;
    device::mark_empty_entry(tg, t, e - t * tg.K);
  }
}

/// Steps 2-4 for row t of a block whose z_s holds the row's z (p.H values) and s its scale:
/// y = norm_element(z, s, w) written to p.y when non-null and staged, then the row's top-k
/// entries. Every thread of the block calls it (after the last read of red[0] by any
/// thread's caller: it synchronizes before writing red).
template <core::Format F>
__device__ __forceinline__ void stage_norm_row(const NormParams& p, const device::StageTarget& tg, int64_t t,
                                               uint16_t* z_s, float s, float* red) {
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int64_t parts = p.H / kNormPart;
  float row_amax = 0.0f;
  if constexpr (core::row_scaled(F)) {
    float a = 0.0f;
    for (int64_t c = tid; c < parts; c += P) {
      uint16_t y[kNormPart];
      norm_part(p, z_s, c, s, y);
#pragma unroll
      for (int i = 0; i < kNormPart; ++i) a = device::amax_step(a, core::bf16_to_float(y[i]));
    }
    __syncthreads();  // every thread is past its read of red[0] (the caller's tree)
    row_amax = block_max(a, red);
  }
  float s2 = 0.0f;
  if constexpr (!core::passthrough(F)) {
    s2 = device::second_level_scale<F>(tg, row_amax);
    if constexpr (core::row_scaled(F)) {
      if (tid == 0) device::store_token_scale(tg, t, s2);
    }
  }
  uint32_t nf = 0;
  const bool by_parts = core::passthrough(F) || tg.G >= kNormPart;
  if (by_parts) {
    // Whole passes of the block, so that every lane of a warp meets its group's lanes
    // (P is a multiple of 32) and takes part in their shuffles.
    for (int64_t base = 0; base < parts; base += P) {
      const int64_t c = base + tid;
      const bool active = c < parts;
      uint16_t y[kNormPart] = {};
      if (active) {
        norm_part(p, z_s, c, s, y);
        if (p.y != nullptr) {
          if (p.y_vec) {
            *reinterpret_cast<uint4*>(p.y + t * p.y_s0 + c * kNormPart) = pack8(y);
          } else {
#pragma unroll
            for (int i = 0; i < kNormPart; ++i) p.y[t * p.y_s0 + (c * kNormPart + i) * p.y_s1] = y[i];
          }
        }
      }
      float v[kNormPart];
#pragma unroll
      for (int i = 0; i < kNormPart; ++i) {
        v[i] = core::bf16_to_float(y[i]);
        nf += active ? device::count_nonfinite(v[i]) : 0u;
      }
      if constexpr (core::passthrough(F)) {
#pragma unroll
        for (int i = 0; i < kNormPart; ++i) {
          if (active) device::store_bf16(tg, t, c * kNormPart + i, y[i]);
        }
      } else {
        const uint32_t sf = device::stage_group_part<F, kNormPart>(tg, t, c * kNormPart, v, s2, active);
        device::store_scale_part<F, kNormPart>(tg, t, c * kNormPart, sf, active);
      }
    }
  } else if constexpr (!core::passthrough(F)) {
    // Groups of fewer than 8 values: y into shared memory (each thread its own parts), then
    // a group a thread.
    for (int64_t c = tid; c < parts; c += P) {
      uint16_t y[kNormPart];
      norm_part(p, z_s, c, s, y);
      if (p.y != nullptr) {
#pragma unroll
        for (int i = 0; i < kNormPart; ++i) p.y[t * p.y_s0 + (c * kNormPart + i) * p.y_s1] = y[i];
      }
      *reinterpret_cast<uint4*>(z_s + c * kNormPart) = pack8(y);
    }
    __syncthreads();
    const int64_t G = tg.G;
    for (int64_t g = tid; g < p.H / G; g += P) {
      const uint16_t* yv = z_s + g * G;
      const auto get = [yv](int64_t i) { return core::bf16_to_float(yv[i]); };
      for (int64_t i = 0; i < G; ++i) nf += device::count_nonfinite(get(i));
      device::store_scale<F>(tg, t, g, device::stage_group<F>(tg, t, g, get, s2));
    }
  }
  for (int64_t k = tid; k < tg.K; k += P) device::repack_topk(tg, t, k);
  device::add_nonfinite(tg, nf);
}

template <core::Format F>
__global__ void __launch_bounds__(256) rmsnorm_stage_kernel(const NormParams p, const device::StageTarget tg) {
  if (p.pdl) pdl_wait_and_trigger();
  extern __shared__ __align__(16) uint16_t z_s[];  // the row's z (then, for G < 8, its y): H values
  __shared__ float red[256];
  const int64_t b = blockIdx.x;
  if (b >= tg.T) return mark_tail_block(tg, b);  // a tail block
  const float s = norm_row(p, b, z_s, red);
  stage_norm_row<F>(p, tg, b, z_s, s, red);
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
