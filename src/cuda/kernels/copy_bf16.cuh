// copy_bf16.cuh: the bf16 pass-through kernel (formats/format_list.h kBf16: no scales). One
// launch does all of a call's work, FlashInfer's Bf16InputStage as one kernel: a grid-stride
// pass over the top-k entries (rows < T repacked, rows T..M-1 of a full buffer marked
// empty: topk.cuh, the repack of every staging kernel), then a grid-stride loop over the
// activations. Vectorized rows (contiguous, 16-byte aligned: Plan::vectorized) go by
// 16-element chunks, 16-byte loads and stores (two of each for 16-bit inputs, four loads
// for fp32); any other layout element by element with 64-bit strided offsets. bf16 bits are
// stored as loaded; fp16 and fp32 take formats/bf16/codec.h (integer rounding, the CPU
// backend's bits). 64-bit parameters (Params64): the divisions by the row length take the
// multiply-high form while the chunk index fits 32 bits.
#pragma once

#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/topk.cuh"
#include "formats/bf16/codec.h"

namespace megamoe {
namespace cuda {
namespace {

/// The bf16 bits of one input element of kind In (its raw bits: 16-bit kinds in the low half).
template <int In>
__device__ __forceinline__ uint16_t bf16_of_bits(uint32_t v) {
  if constexpr (In == kInBF16) return static_cast<uint16_t>(v);
  else if constexpr (In == kInF16) return core::bf16_from_half(static_cast<uint16_t>(v));
  else return core::bf16_from_float(__uint_as_float(v));
}

template <int In>
__device__ __forceinline__ bool nonfinite_bits(uint32_t v) {
  if constexpr (In == kInF32) return (v & 0x7F800000u) == 0x7F800000u;
  else if constexpr (In == kInF16) return (v & 0x7C00u) == 0x7C00u;
  else return core::bf16_non_finite(static_cast<uint16_t>(v));
}

/// Two 16-bit input values packed in a word -> their bf16 pair (low half first), counted.
template <int In, bool kCount>
__device__ __forceinline__ uint32_t pair16(uint32_t w, uint32_t& nf) {
  if constexpr (kCount) nf += (nonfinite_bits<In>(w & 0xFFFFu) ? 1u : 0u) + (nonfinite_bits<In>(w >> 16) ? 1u : 0u);
  if constexpr (In == kInBF16) return w;
  else return uint32_t{bf16_of_bits<In>(w & 0xFFFFu)} | (uint32_t{bf16_of_bits<In>(w >> 16)} << 16);
}

template <int In, bool kCount>
__device__ __forceinline__ uint32_t pair32(uint32_t a, uint32_t b, uint32_t& nf) {
  if constexpr (kCount) nf += (nonfinite_bits<In>(a) ? 1u : 0u) + (nonfinite_bits<In>(b) ? 1u : 0u);
  return uint32_t{bf16_of_bits<In>(a)} | (uint32_t{bf16_of_bits<In>(b)} << 16);
}

template <int In, bool kVec, bool kCount>
__global__ void __launch_bounds__(kCopyThreads, kCopyBlocksPerSm) stage_copy_kernel(const Params64 p) {
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Top-k: n_topk = T * K, or M * K with the full-buffer tail (Plan::fused_tail).
  for (int64_t e = first; e < p.n_topk; e += step) {
    const int64_t t = topk_row_of(p, e), k = e - t * p.K;
    if (t < p.T) repack_entry(p, t, k);
    else mark_empty(p, t, k);
  }
  uint16_t* const xq = reinterpret_cast<uint16_t*>(p.xq);
  uint32_t nf = 0;
  if constexpr (kVec) {
    // Two chunks a thread an iteration, both loaded before either is stored: the stores of
    // one chunk cannot be moved above the next chunk's loads (they may alias), so one chunk
    // an iteration keeps a single chunk's loads in flight per thread.
    const bool div32 = p.n_chunks <= int64_t{UINT32_MAX};
    auto at = [&](int64_t c, int64_t& t, int64_t& h) {
      t = div32 ? int64_t{core::fastdiv(static_cast<uint32_t>(c), p.cpr_div)} : c / p.cpr;
      h = (c - t * p.cpr) * 16;
    };
    auto load = [&](int64_t t, int64_t h, uint4& o0, uint4& o1) {
      if constexpr (In == kInF32) {
        const uint4* src = reinterpret_cast<const uint4*>(static_cast<const float*>(p.hs) + t * p.hs_s0 + h);
        const uint4 a = src[0], b = src[1], d = src[2], f = src[3];
        o0 = make_uint4(pair32<In, kCount>(a.x, a.y, nf), pair32<In, kCount>(a.z, a.w, nf),
                        pair32<In, kCount>(b.x, b.y, nf), pair32<In, kCount>(b.z, b.w, nf));
        o1 = make_uint4(pair32<In, kCount>(d.x, d.y, nf), pair32<In, kCount>(d.z, d.w, nf),
                        pair32<In, kCount>(f.x, f.y, nf), pair32<In, kCount>(f.z, f.w, nf));
      } else {
        const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.hs) + t * p.hs_s0 + h);
        const uint4 a = src[0], b = src[1];
        o0 = make_uint4(pair16<In, kCount>(a.x, nf), pair16<In, kCount>(a.y, nf), pair16<In, kCount>(a.z, nf),
                        pair16<In, kCount>(a.w, nf));
        o1 = make_uint4(pair16<In, kCount>(b.x, nf), pair16<In, kCount>(b.y, nf), pair16<In, kCount>(b.z, nf),
                        pair16<In, kCount>(b.w, nf));
      }
    };
    auto store = [&](int64_t t, int64_t h, const uint4& o0, const uint4& o1) {
      uint4* dst = reinterpret_cast<uint4*>(xq + t * p.xq_s0 + h);
      dst[0] = o0;
      dst[1] = o1;
    };
    int64_t c = first;
    for (; c + step < p.n_chunks; c += 2 * step) {
      int64_t t0, h0, t1, h1;
      at(c, t0, h0);
      at(c + step, t1, h1);
      uint4 a0, a1, b0, b1;
      load(t0, h0, a0, a1);
      load(t1, h1, b0, b1);
      store(t0, h0, a0, a1);
      store(t1, h1, b0, b1);
    }
    if (c < p.n_chunks) {
      int64_t t, h;
      at(c, t, h);
      uint4 o0, o1;
      load(t, h, o0, o1);
      store(t, h, o0, o1);
    }
  } else {
    using Bits = typename std::conditional<In == kInF32, uint32_t, uint16_t>::type;
    const Bits* hs = static_cast<const Bits*>(p.hs);
    const int64_t n = p.T * p.H;
    for (int64_t u = first; u < n; u += step) {
      const int64_t t = u / p.H, h = u - t * p.H;
      const uint32_t v = hs[t * p.hs_s0 + h * p.hs_s1];
      if constexpr (kCount) nf += nonfinite_bits<In>(v) ? 1u : 0u;
      xq[t * p.xq_s0 + h * p.xq_s1] = bf16_of_bits<In>(v);
    }
  }
  if constexpr (kCount) flush_nonfinite(p.nonfinite, nf);
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
