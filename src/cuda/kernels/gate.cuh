// gate.cuh: the gate's logits on CUDA (core/gate.h, docs/CONTRACT.md "Gate, route and
// stage"), split over the GPU in the contract's own order, so that the bits are the CPU
// backend's whatever the split (plan.h GatePlan sizes it):
//  - a block takes a tile of kGateWarps experts (one warp each) and one share r of the
//    S = max(1, N / 32) interleaved chunk shares (share r holds the chunks j = r mod S, so
//    it has M = N / S <= 32 of them);
//  - lane m of expert e's warp holds the 16 weight values of chunk j = r + S m in registers
//    (zeros past the row, and for chunks j >= n), and for each of the launch's tokens runs
//    the chunk's chain of fused multiply-adds from +0 in column order, then the warp folds
//    its M chain values by shuffles over the levels h = M/2 .. 1, which are the contract's
//    levels h S (the pairs inside the share), highest first: lane 0 then holds the share's
//    partial sum, which goes to scratch;
//  - the hand-off without a grid barrier (none that a cooperative launch, refused under MPS,
//    would need): each block, once its partial sums are stored, fences and counts itself in
//    at its tile's counter (zeroed by a memset node before the launch); the block that
//    arrives last reads the tile's S partial sums of every token through L2 (__ldcg: the
//    non-coherent path could serve a line from before the other blocks' stores), folds them
//    by the remaining levels h = S/2 .. 1 (the ones >= 32 inside a lane, highest first,
//    then shuffles) and writes the logits (a NaN as 0x7FC00000, core::gate_output).
// Padding zeros change no bit (a chain never holds -0: core/gate.h), so a lane past the row
// adds +0 and a short last chunk runs as a full one with zero weights. The arithmetic is
// __fmaf_rn and __fadd_rn (core::fma_rn / add_rn): the compiler can neither contract nor
// reorder it. Any strides: 16-byte loads where the rows are contiguous and 16-byte aligned,
// strided element loads otherwise (tensors off their element size run on aligned copies).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/gate.h"
#include "core/numerics.h"
#include "cuda/kernels/common.cuh"
#include "cuda/policy/plan.h"  // kGateWarps, kGateMaxFoldPerLane

namespace megamoe {
namespace cuda {
namespace {

enum : uint32_t {
  kGateWF32 = 1u,   // fp32 weight (else bf16)
  kGateYVec = 2u,   // y rows contiguous and 16-byte aligned: 16-byte loads
  kGateWVec = 4u,   // weight rows likewise
  kGatePdl = 8u,    // launched with PDL: wait for the previous grid before any load
  kGateNc = 16u,    // y and weight through the read-only (non-coherent) path
};

struct GateParams {
  const uint16_t* y;         // [T, H] bf16
  const void* w;             // [E, H] bf16 or fp32
  float* partial;            // scratch [S][tb][E]: the shares' partial sums of this launch
  float* logits;             // scratch [T, E] dense: what the router reads
  float* out;                // logits_out (nullable)
  unsigned int* counters;    // this launch's tiles arrival counters (zeroed before the first launch)
  int64_t y_s0, y_s1, w_s0, w_s1, out_s0, out_s1;
  int64_t t0;                // the launch's first token
  int64_t tb;                // the launch's tokens
  int64_t E, H;
  int64_t n;                 // chunks: ceil(H / 16)
  int64_t S;                 // shares (power of two)
  int64_t tiles;             // expert tiles (kGateWarps experts each)
  int M;                     // chunks a share: N / S <= 32 (power of two)
  int fold;                  // partial sums a lane of the last block folds: ceil(S / 32) <= kGateMaxFoldPerLane
  uint32_t flags;            // kGate*
};

constexpr int kGateLanesMaxFold = static_cast<int>(kGateMaxFoldPerLane);

__device__ __forceinline__ int64_t gate_min(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ uint4 gate_ld16(const void* p, bool nc) {
  const uint4* q = static_cast<const uint4*>(p);
  return nc ? __ldg(q) : *q;
}
__device__ __forceinline__ uint16_t gate_ld_bf16(const uint16_t* p, bool nc) { return nc ? __ldg(p) : *p; }
__device__ __forceinline__ float gate_ld_f32(const float* p, bool nc) { return nc ? __ldg(p) : *p; }

/// 8 bf16 values (16 bytes) widened exactly into v[0..7].
__device__ __forceinline__ void gate_widen8(const uint4& q, float* v) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = core::bits_float(w[i] << 16);
    v[2 * i + 1] = core::bits_float(w[i] & 0xFFFF0000u);
  }
}

/// Row @p row's chunk @p j (@p count <= 16 valid columns, the rest zero) of a bf16 tensor.
__device__ __forceinline__ void gate_load_bf16(const uint16_t* base, int64_t s0, int64_t s1, int64_t row, int64_t j,
                                               int count, bool vec, bool nc, float (&v)[16]) {
  const int64_t h0 = j * core::kGateChunk;
  if (vec && count == core::kGateChunk) {
    const uint16_t* p = base + row * s0 + h0;
    gate_widen8(gate_ld16(p, nc), v);
    gate_widen8(gate_ld16(p + 8, nc), v + 8);
    return;
  }
#pragma unroll
  for (int i = 0; i < core::kGateChunk; ++i) {
    v[i] = i < count ? core::bf16_to_float(gate_ld_bf16(base + row * s0 + (h0 + i) * s1, nc)) : 0.0f;
  }
}

/// The same for an fp32 tensor.
__device__ __forceinline__ void gate_load_f32(const float* base, int64_t s0, int64_t s1, int64_t row, int64_t j,
                                              int count, bool vec, bool nc, float (&v)[16]) {
  const int64_t h0 = j * core::kGateChunk;
  if (vec && count == core::kGateChunk) {
    const float* p = base + row * s0 + h0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 u = gate_ld16(p + 4 * q, nc);
      v[4 * q] = core::bits_float(u.x);
      v[4 * q + 1] = core::bits_float(u.y);
      v[4 * q + 2] = core::bits_float(u.z);
      v[4 * q + 3] = core::bits_float(u.w);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < core::kGateChunk; ++i) {
    v[i] = i < count ? gate_ld_f32(base + row * s0 + (h0 + i) * s1, nc) : 0.0f;
  }
}

__global__ void __launch_bounds__(kGateWarps * 32) gate_kernel(const __grid_constant__ GateParams p) {
  if (p.flags & kGatePdl) pdl_wait_and_trigger();
  const bool nc = (p.flags & kGateNc) != 0;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) % p.tiles;
  const int64_t r = static_cast<int64_t>(blockIdx.x) / p.tiles;
  const int64_t e = tile * kGateWarps + warp;

  // 1. The share's partial sums of expert e for every token of the launch.
  if (e < p.E) {  // warp-uniform
    const int64_t j = r + p.S * lane;  // lane m = lane's chunk
    const bool active = lane < p.M && j < p.n;
    const int count = active ? static_cast<int>(gate_min(core::kGateChunk, p.H - j * core::kGateChunk)) : 0;
    float w[core::kGateChunk];
    if (p.flags & kGateWF32) {
      gate_load_f32(static_cast<const float*>(p.w), p.w_s0, p.w_s1, e, j, count, (p.flags & kGateWVec) != 0, nc, w);
    } else {
      gate_load_bf16(static_cast<const uint16_t*>(p.w), p.w_s0, p.w_s1, e, j, count, (p.flags & kGateWVec) != 0, nc,
                     w);
    }
    // Unrolled so that several tokens' loads are in flight before their chains run.
#pragma unroll 4
    for (int64_t t = 0; t < p.tb; ++t) {
      float y[core::kGateChunk];
      gate_load_bf16(p.y, p.y_s0, p.y_s1, p.t0 + t, j, count, (p.flags & kGateYVec) != 0, nc, y);
      // The chunk's chain from +0 (past count both operands are zero: the chain's value
      // passes unchanged, core/gate.h).
      float c = 0.0f;
#pragma unroll
      for (int i = 0; i < core::kGateChunk; ++i) c = core::gate_step(y[i], w[i], c);
      // The share's levels, highest first: lane m adds lane m + h's value for m < h.
      for (int h = p.M / 2; h >= 1; h /= 2) c = core::add_rn(c, __shfl_down_sync(0xFFFFFFFFu, c, h));
      if (lane == 0) __stcg(&p.partial[(r * p.tb + t) * p.E + e], c);
    }
  }

  // 2. The hand-off: the last block of the tile to arrive folds the shares.
  __shared__ unsigned int is_last;
  __threadfence();  // this block's partial sums visible device-wide before it counts itself in
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&p.counters[tile], 1u) == static_cast<unsigned int>(p.S - 1) ? 1u : 0u;
  __syncthreads();
  if (is_last == 0u) return;
  __threadfence();  // the other blocks' partial sums, counted in before this block's arrival

  const int64_t e0 = tile * kGateWarps;
  const int64_t tile_e = gate_min(kGateWarps, p.E - e0);
  const int lanes = static_cast<int>(gate_min(p.S, 32));
  for (int64_t i = warp; i < p.tb * tile_e; i += kGateWarps) {
    const int64_t t = i / tile_e, ee = e0 + i % tile_e;
    // Lane l holds shares l + 32 k (k < fold): the levels h >= 32 pair k and k + m/2 inside
    // the lane, then shuffles fold the levels below 32.
    float v[kGateLanesMaxFold];
#pragma unroll
    for (int k = 0; k < kGateLanesMaxFold; ++k) {
      const int64_t share = lane + 32 * k;
      v[k] = k < p.fold && share < p.S ? __ldcg(&p.partial[(share * p.tb + t) * p.E + ee]) : 0.0f;
    }
#pragma unroll
    for (int m = kGateLanesMaxFold; m > 1; m /= 2) {
      if (m <= p.fold) {
#pragma unroll
        for (int k = 0; k < m / 2; ++k) v[k] = core::add_rn(v[k], v[k + m / 2]);
      }
    }
    float c = v[0];
    for (int h = lanes / 2; h >= 1; h /= 2) c = core::add_rn(c, __shfl_down_sync(0xFFFFFFFFu, c, h));
    if (lane == 0) {
      const float out = core::gate_output(c);
      p.logits[(p.t0 + t) * p.E + ee] = out;
      if (p.out != nullptr) p.out[(p.t0 + t) * p.out_s0 + ee * p.out_s1] = out;
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
