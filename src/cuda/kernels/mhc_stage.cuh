// mhc_stage.cuh: mhc_pre_and_stage's kernels (core/mhc.h, docs/CONTRACT.md "mHC pre and
// stage"), one block a token. The block
//   1. reads the token's K = hc H bf16 values into shared memory once (16-byte loads where
//      the row is contiguous and aligned);
//   2. sums, by the contract's tree (norm.cuh fold_block: thread t holds chunks t, t + P,
//      ..., folds them highest first, then the block folds the lanes' partials), the
//      squares and the M = hc (hc + 2) dot products with fn's rows (fp32, read from
//      global memory / L2), kMhcMixGroup sums side by side a pass over the row;
//   3. has one thread compute the coefficients (core::mhc_coefficients: the CPU backend's
//      code, so the bits are equal by construction) into shared memory, and writes
//      post_mix, comb_mix, pre_mix;
//   4. forms z = bf16(sum_j q_j x_j) over parts of 8 columns (core::mhc_mix), in place of
//      stream 0 in shared memory (only the part's own thread reads those columns), written
//      to layer_input when given;
//   5. takes z's norm scale by the same tree over H, then y = norm_element(z, s, w):
//      mhc_stage_kernel stages y through the device API (norm_stage.cuh stage_norm_row, the
//      code rmsnorm_and_stage runs: y written when given, the staged bytes those of
//      prepare_inputs(y), then the token's top-k entries); blocks from T on mark the
//      full-buffer tail. mhc_kernel (NVFP4 online, whose global scale needs every row
//      first) writes y only, and the staging launch follows.
#pragma once

#include <cstdint>

#include "core/mhc.h"
#include "cuda/kernels/geometry.h"
#include "cuda/kernels/norm.cuh"
#include "cuda/kernels/norm_stage.cuh"
#include "megamoe/device/stage.cuh"

namespace megamoe {
namespace cuda {
namespace {

constexpr int kMhcSums = core::kMhcMaxMixes + 1;  ///< the sum of squares, then the mixes
constexpr int kMhcGroup = kMhcMixGroup;          ///< sums a pass over the row computes (geometry.h)

struct MhcKernelParams {
  const uint16_t* x;     // residual [T, K] bf16
  const float* fn;       // [M, K]
  const float* scale;    // [3]
  const float* base;     // [M]
  const float* pre_in;   // nullable [T, hc]
  float* post;           // [T, hc]
  float* comb;           // [T, hc hc]
  float* pre;            // nullable [T, hc]
  uint16_t* li;          // nullable layer_input [T, H]
  int64_t x_s0, x_s1, fn_s0, fn_s1, scale_s0, base_s0, pi_s0, pi_s1, post_s0, post_s1, comb_s0, comb_s1, pre_s0,
      pre_s1, li_s0, li_s1;
  int64_t K;
  int hc, M;
  int per_thread_k, lanes_k;  // the mixed row's tree (MhcPlan)
  int per_thread_h, lanes_h;  // z's tree
  core::MhcParams prm;
  // 16-byte accesses (the host checks contiguity and alignment): the residual's rows, fn's
  // rows, layer_input's rows.
  bool x_vec, fn_vec, li_vec;
  NormParams norm;  // the norm of z: weight, eps, H, y (nullable in mhc_stage_kernel), pdl
};

/// The block's shared state besides the row.
struct MhcShared {
  float red[kMhcGroup * 256];          // the trees' partials
  float sums[kMhcSums];                    // S, then d_0 .. d_M-1
  float base[core::kMhcMaxMixes];
  float q[core::kMhcMaxStreams];           // the weighted sum's coefficients
  core::MhcCoeffs co;
};

/// The 16 values of chunk j of a bf16 row in shared memory.
__device__ __forceinline__ void chunk_from_shared(const uint16_t* row, int64_t j, float (&v)[core::kNormChunk]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint16_t b[8];
    unpack8(*reinterpret_cast<const uint4*>(row + j * core::kNormChunk + 8 * half), b);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[8 * half + i] = core::bf16_to_float(b[i]);
  }
}

/// Chunk j of fn's row m.
__device__ __forceinline__ void fn_chunk(const MhcKernelParams& p, int m, int64_t j, float (&f)[core::kNormChunk]) {
  const int64_t k0 = j * core::kNormChunk;
  if (p.fn_vec) {
    const float4* q = reinterpret_cast<const float4*>(p.fn + m * p.fn_s0 + k0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 a = q[i];
      f[4 * i] = a.x, f[4 * i + 1] = a.y, f[4 * i + 2] = a.z, f[4 * i + 3] = a.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < core::kNormChunk; ++i) f[i] = p.fn[m * p.fn_s0 + (k0 + i) * p.fn_s1];
  }
}

/// Steps 1-4 for token t: the row into x_s, the coefficients and their outputs, z in
/// x_s[0, H) (complete for every thread on return); returns z's norm scale s (step 5).
__device__ __forceinline__ float mhc_row(const MhcKernelParams& p, int64_t t, uint16_t* x_s, MhcShared& sh) {
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int64_t H = p.norm.H;
  // 1. The row.
  if (p.x_vec) {
    for (int64_t c = tid; c < p.K / 8; c += P) {
      reinterpret_cast<uint4*>(x_s)[c] = *reinterpret_cast<const uint4*>(p.x + t * p.x_s0 + c * 8);
    }
  } else {
    for (int64_t k = tid; k < p.K; k += P) x_s[k] = p.x[t * p.x_s0 + k * p.x_s1];
  }
  for (int m = tid; m < p.M; m += P) sh.base[m] = p.base[m * p.base_s0];
  __syncthreads();
  // 2. The sums, kMhcGroup at a time: sum a is S for a = 0, else d_{a-1}.
  const int64_t nk = p.K / core::kNormChunk;
  for (int a0 = 0; a0 <= p.M; a0 += kMhcGroup) {
    float v[kMhcGroup][kNormMaxPerThread];
#pragma unroll
    for (int k = 0; k < kNormMaxPerThread; ++k) {
      if (k >= p.per_thread_k) continue;  // (a fixed trip count: the slots stay registers)
      const int64_t j = tid + static_cast<int64_t>(k) * P;
#pragma unroll
      for (int g = 0; g < kMhcGroup; ++g) v[g][k] = 0.0f;
      if (j < nk) {
        float xv[core::kNormChunk];
        chunk_from_shared(x_s, j, xv);
#pragma unroll
        for (int g = 0; g < kMhcGroup; ++g) {
          const int a = a0 + g;
          if (a == 0) {
            v[g][k] = core::norm_chunk_sumsq(xv);
          } else if (a <= p.M) {
            float f[core::kNormChunk];
            fn_chunk(p, a - 1, j, f);
            v[g][k] = core::chunk_dot(xv, f);
          }
        }
      }
    }
    fold_block<kMhcGroup>(v, p.per_thread_k, p.lanes_k, sh.red);
    if (tid < kMhcGroup && a0 + tid <= p.M) sh.sums[a0 + tid] = sh.red[tid * P];
    __syncthreads();  // red free again, sums visible
  }
  // 3. The coefficients, by one thread; then their outputs.
  if (tid == 0) {
    const float scale[3] = {p.scale[0], p.scale[p.scale_s0], p.scale[2 * p.scale_s0]};
    core::mhc_coefficients(sh.sums[0], sh.sums + 1, p.K, p.hc, scale, sh.base, p.prm, sh.co);
  }
  __syncthreads();
  for (int i = tid; i < p.hc * p.hc; i += P) {
    p.comb[t * p.comb_s0 + i * p.comb_s1] = core::canonical_nan(sh.co.comb[i]);
  }
  for (int j = tid; j < p.hc; j += P) {
    p.post[t * p.post_s0 + j * p.post_s1] = core::canonical_nan(sh.co.post[j]);
    if (p.pre != nullptr) p.pre[t * p.pre_s0 + j * p.pre_s1] = core::canonical_nan(sh.co.pre[j]);
    sh.q[j] = p.pre_in != nullptr ? p.pre_in[t * p.pi_s0 + j * p.pi_s1] : sh.co.pre[j];
  }
  __syncthreads();
  // 4. z over parts of 8 columns, into stream 0's place.
  for (int64_t c = tid; c < H / kNormPart; c += P) {
    uint16_t z[kNormPart];
#pragma unroll
    for (int i = 0; i < kNormPart; ++i) {
      float col[core::kMhcMaxStreams];
      for (int j = 0; j < p.hc; ++j) col[j] = core::bf16_to_float(x_s[j * H + c * kNormPart + i]);
      z[i] = core::bf16_from_float(core::mhc_mix(sh.q, col, p.hc));
    }
    *reinterpret_cast<uint4*>(x_s + c * kNormPart) = pack8(z);
    if (p.li != nullptr) {
      if (p.li_vec) {
        *reinterpret_cast<uint4*>(p.li + t * p.li_s0 + c * kNormPart) = pack8(z);
      } else {
#pragma unroll
        for (int i = 0; i < kNormPart; ++i) p.li[t * p.li_s0 + (c * kNormPart + i) * p.li_s1] = z[i];
      }
    }
  }
  __syncthreads();
  // 5. z's scale.
  const int64_t nh = H / core::kNormChunk;
  float v[1][kNormMaxPerThread];
#pragma unroll
  for (int k = 0; k < kNormMaxPerThread; ++k) {
    if (k >= p.per_thread_h) continue;
    const int64_t j = tid + static_cast<int64_t>(k) * P;
    v[0][k] = 0.0f;
    if (j < nh) {
      float zv[core::kNormChunk];
      chunk_from_shared(x_s, j, zv);
      v[0][k] = core::norm_chunk_sumsq(zv);
    }
  }
  fold_block<1>(v, p.per_thread_h, p.lanes_h, sh.red);
  return core::norm_scale(sh.red[0], H, p.norm.eps);
}

/// One launch: mHC pre, the norm and the staging (every format but NVFP4 online). Two
/// blocks an SM in the launch bounds: at most 128 registers a thread (sm_100's compiler
/// otherwise takes 255 and spills), and two blocks side by side where the rows fit.
template <core::Format F>
__global__ void __launch_bounds__(256, 2) mhc_stage_kernel(const MhcKernelParams p, const device::StageTarget tg) {
  if (p.norm.pdl) pdl_wait_and_trigger();
  extern __shared__ __align__(16) uint16_t x_s[];  // the token's K values; then z (and y for G < 8) in [0, H)
  __shared__ MhcShared sh;
  const int64_t b = blockIdx.x;
  if (b >= tg.T) return mark_tail_block(tg, b);  // a tail block
  const float s = mhc_row(p, b, x_s, sh);
  stage_norm_row<F>(p.norm, tg, b, x_s, s, sh.red);
}

/// mHC pre and the norm, y written to p.norm.y (the caller's y or scratch): the first of
/// NVFP4 online's two launches.
__global__ void __launch_bounds__(256, 2) mhc_kernel(const MhcKernelParams p) {
  if (p.norm.pdl) pdl_wait_and_trigger();
  extern __shared__ __align__(16) uint16_t x_s[];
  __shared__ MhcShared sh;
  const int64_t t = blockIdx.x;
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const float s = mhc_row(p, t, x_s, sh);
  for (int64_t h = tid; h < p.norm.H; h += P) {
    p.norm.y[t * p.norm.y_s0 + h * p.norm.y_s1] =
        core::norm_element(core::bf16_to_float(x_s[h]), s, norm_weight(p.norm, h));
  }
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
