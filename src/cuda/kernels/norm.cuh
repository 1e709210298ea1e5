// norm.cuh: rmsnorm_and_stage's norm kernel (core/rmsnorm.h, docs/CONTRACT.md "RMSNorm and
// stage"): one block a row. Thread t of P = blockDim.x (a power of two, N / P chunks each)
// reads chunks t, t + P, ... of the row (the residual added, z kept in shared memory as
// bf16 and written to residual_out), sums each chunk's squares in order, folds its own
// chunk sums highest first (the tree's levels h >= P pair a thread's chunks k and
// k + m/2), then the block folds the P partial sums by the remaining levels h = P/2 .. 1
// in shared memory; every thread then has S, the row's scale, and writes y over its
// chunks. Any strides; 16-bit element accesses (misaligned tensors run on aligned copies).
#pragma once

#include <cstdint>

#include "core/rmsnorm.h"
#include "cuda/kernels/common.cuh"

namespace megamoe {
namespace cuda {
namespace {

struct NormParams {
  const uint16_t* x;
  const uint16_t* res;   // nullable
  const void* w;         // bf16 or fp32 (w_f32)
  uint16_t* y;
  uint16_t* res_out;     // nullable
  int64_t x_s0, x_s1, r_s0, r_s1, w_s0, y_s0, y_s1, ro_s0, ro_s1;
  int64_t H;
  float eps;
  int per_thread;        // N / blockDim.x chunk slots a thread folds (at least 1)
  bool w_f32;
  bool pdl;
  // 16-byte accesses (the host checks contiguity and alignment): x and residual (and
  // residual_out) rows; the weight; y's rows.
  bool rows_vec, w_vec, y_vec;
};

/// 8 bf16 values from 16 bytes.
__device__ __forceinline__ void unpack8(const uint4& q, uint16_t (&b)[8]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    b[2 * i] = static_cast<uint16_t>(w[i] & 0xFFFFu);
    b[2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
  }
}
__device__ __forceinline__ uint4 pack8(const uint16_t (&b)[8]) {
  return make_uint4(b[0] | (uint32_t{b[1]} << 16), b[2] | (uint32_t{b[3]} << 16), b[4] | (uint32_t{b[5]} << 16),
                    b[6] | (uint32_t{b[7]} << 16));
}

constexpr int kNormMaxPerThread = 16;  // kNormMaxH / 16 / kNormMaxThreads

/// The in-thread levels of fold_block, m = M, M/2, ..., 2 (those with m <= per_thread):
/// v[a][k] = fl(v[a][k] + v[a][k + m/2]) for k < m/2. Compile-time bounds, so that every
/// index is a constant and the slots stay registers.
template <int A, int M>
__device__ __forceinline__ void fold_slots(float (&v)[A][kNormMaxPerThread], int per_thread) {
  if constexpr (M > 1) {
    if (M <= per_thread) {
#pragma unroll
      for (int a = 0; a < A; ++a) {
#pragma unroll
        for (int k = 0; k < M / 2; ++k) v[a][k] = core::add_rn(v[a][k], v[a][k + M / 2]);
      }
    }
    fold_slots<A, M / 2>(v, per_thread);
  }
}

/// The contract's tree over a block for A sums at once. Thread tid holds v[a][k], the sum of
/// chunk tid + k P of sum a (k < per_thread, a power of two <= kNormMaxPerThread; +0 past
/// the row): it folds its slots highest first (the tree's levels h >= P), then the block
/// folds the first @p lanes partials (lanes = P, or the tree's width when it is narrower:
/// the threads past it are not read) by the levels lanes/2 .. 1 in red (A P floats, no
/// thread still reading them). On return red[a P] is sum a for every thread; a caller that
/// writes red again synchronizes first.
template <int A>
__device__ __forceinline__ void fold_block(float (&v)[A][kNormMaxPerThread], int per_thread, int lanes, float* red) {
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  fold_slots<A, kNormMaxPerThread>(v, per_thread);
#pragma unroll
  for (int a = 0; a < A; ++a) red[a * P + tid] = v[a][0];
  __syncthreads();
  for (int h = lanes / 2; h >= 1; h /= 2) {
    if (tid < h) {
#pragma unroll
      for (int a = 0; a < A; ++a) red[a * P + tid] = core::add_rn(red[a * P + tid], red[a * P + tid + h]);
    }
    __syncthreads();
  }
}

/// The row's z into z_s (the residual added, residual_out written) and its scale s, by the
/// contract's tree: every thread of the block calls it and gets s; z_s is complete for
/// every thread when it returns. red: the block's P floats of shared memory.
__device__ __forceinline__ float norm_row(const NormParams& p, int64_t t, uint16_t* z_s, float* red) {
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int64_t n = p.H / core::kNormChunk;
  float v[1][kNormMaxPerThread];
#pragma unroll
  for (int k = 0; k < kNormMaxPerThread; ++k) {
    if (k >= p.per_thread) continue;  // (a fixed trip count: the slots stay registers)
    const int64_t j = tid + static_cast<int64_t>(k) * P;
    float c = 0.0f;
    if (j < n && p.rows_vec) {  // two 16-byte halves of the chunk
      float z[core::kNormChunk];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t h = j * core::kNormChunk + 8 * half;
        uint16_t b[8];
        unpack8(*reinterpret_cast<const uint4*>(p.x + t * p.x_s0 + h), b);
        if (p.res != nullptr) {
          uint16_t r[8];
          unpack8(*reinterpret_cast<const uint4*>(p.res + t * p.r_s0 + h), r);
#pragma unroll
          for (int i = 0; i < 8; ++i) b[i] = core::norm_add(b[i], r[i]);
          if (p.res_out != nullptr) *reinterpret_cast<uint4*>(p.res_out + t * p.ro_s0 + h) = pack8(b);
        }
        *reinterpret_cast<uint4*>(z_s + h) = pack8(b);
#pragma unroll
        for (int i = 0; i < 8; ++i) z[8 * half + i] = core::bf16_to_float(b[i]);
      }
      c = core::norm_chunk_sumsq(z);
    } else if (j < n) {
      float z[core::kNormChunk];
      for (int i = 0; i < core::kNormChunk; ++i) {
        const int64_t h = j * core::kNormChunk + i;
        uint16_t b = p.x[t * p.x_s0 + h * p.x_s1];
        if (p.res != nullptr) {
          b = core::norm_add(b, p.res[t * p.r_s0 + h * p.r_s1]);
          if (p.res_out != nullptr) p.res_out[t * p.ro_s0 + h * p.ro_s1] = b;
        }
        z_s[h] = b;
        z[i] = core::bf16_to_float(b);
      }
      c = core::norm_chunk_sumsq(z);
    }
    v[0][k] = c;
  }
  fold_block<1>(v, p.per_thread, P, red);
  return core::norm_scale(red[0], p.H, p.eps);
}

/// The row's weight w[h] as fp32.
__device__ __forceinline__ float norm_weight(const NormParams& p, int64_t h) {
  return p.w_f32 ? static_cast<const float*>(p.w)[h * p.w_s0]
                 : core::bf16_to_float(static_cast<const uint16_t*>(p.w)[h * p.w_s0]);
}

__global__ void __launch_bounds__(256) rmsnorm_kernel(const NormParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
  extern __shared__ __align__(16) uint16_t z_s[];  // the row's z, H values
  __shared__ float red[256];
  const int64_t t = blockIdx.x;
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const float s = norm_row(p, t, z_s, red);
  for (int64_t h = tid; h < p.H; h += P) {
    p.y[t * p.y_s0 + h * p.y_s1] = core::norm_element(core::bf16_to_float(z_s[h]), s, norm_weight(p, h));
  }
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
