// quantize_rowwise.cuh: the row kernel, for formats whose groups depend on the whole
// token row (NVFP4 per-token: the per-token scale max(row_amax, floor) / 2688 comes
// first). One block per token row (block-stride loop over rows), one thread per 16-element
// group. When the row has at most two groups a thread (the planned shape up to H = 16384,
// rowwise_threads: one group a thread at decode sizes, two beyond), or four in the wide
// kernel (prefill rows of 16-bit inputs, 4096 < H <= 8192), and is vectorizable, the
// thread loads its groups once, keeps them in registers across the block's max and
// encodes them from there: one DRAM round trip a row, the top-k entries' loads in flight
// with it (decode is that latency). Otherwise two passes over the row: (1) the row's
// amax; (2) each group's amax again, its e4m3 scale byte and its 16 nibbles; the second
// pass reads the row again from L1 or L2, so DRAM still sees each byte once. kVec: hidden
// rows contiguous and 16-byte aligned, x_q rows 8-byte aligned (16-byte loads, 8-byte
// stores); else strided scalars. The block's max goes through one of two shared buffers by
// row parity: a warp can only reuse a buffer after the next row's barrier, which every
// warp reaches after reading it, so rows need one barrier each. Register rows of the full
// kernel take a second: warp 0 alone turns the maxima into the row's constants and every
// thread reads them from one shared TokenRow (row_constants_by_warp0), which warp 0
// rewrites only after the next row's first barrier, when every thread has read it.
#pragma once

#include <type_traits>

#include "formats/recipe.h"
#include "cuda/kernels/chunk.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/topk.cuh"

namespace megamoe {
namespace cuda {
namespace {

constexpr int kRowMaxWarps = kRowwiseMaxThreads / 32;
// Blocks of kRowwiseMaxThreads threads resident per SM the row kernel is built for: 42
// registers hold the two chunks of the register path (16 words of 16-bit inputs) and their
// encode without spills; fp32 inputs (32 words) get 64, as do the counting variants on
// sm_100, where ptxas -v showed them spilling at 40.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr bool kRowCountNeedsRegisters = true;
#else
constexpr bool kRowCountNeedsRegisters = false;
#endif
template <int In, bool kCount>
constexpr int kRowBlocksPerSm = In == kInF32 || (kCount && kRowCountNeedsRegisters) ? 2 : 3;

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

/// The entries of the block-max buffers (both parities) that no warp of this block writes,
/// zeroed once before the first row's barrier: block_max then reads whole vectors with no
/// per-entry test.
__device__ __forceinline__ void zero_absent_warps(float (&buf)[2][kRowMaxWarps]) {
  const uint32_t warps = blockDim.x / 32u;
  if (threadIdx.x < 2u * kRowMaxWarps && threadIdx.x % kRowMaxWarps >= warps) {
    buf[threadIdx.x / kRowMaxWarps][threadIdx.x % kRowMaxWarps] = 0.0f;
  }
}

/// The warp's max of v >= 0, never NaN, in every lane: one redux.sync on v's bits
/// (non-negative floats order as their bits do) instead of five shuffle and max pairs on the
/// row's dependent chain.
__device__ __forceinline__ float warp_max_nonneg(float v) {
  return __uint_as_float(__reduce_max_sync(0xFFFFFFFFu, __float_as_uint(v)));
}

/// Each warp's max of v (>= 0, never NaN) into buf[warp], then a block barrier (all threads
/// call it).
__device__ __forceinline__ void publish_warp_maxima(float v, float* buf) {
  v = warp_max_nonneg(v);
  if (threadIdx.x % 32u == 0) buf[threadIdx.x / 32u] = v;
  __syncthreads();
}

/// The block's max of v >= 0, never NaN (every thread gets it; all threads call it: a
/// barrier).
/// kVector (the split kernel; absent warps' entries zeroed by zero_absent_warps): the
/// warps' maxima read as two (up to 8 warps) or four 16-byte loads issued together instead
/// of a shared-memory round trip a warp. The full kernel keeps the loop: a 16-entry vector
/// form there took 0.04-0.06 us off its decode calls at H = 7168 but cost 5% at T = 16384
/// (a same-run A/B on an H200).
template <bool kVector>
__device__ __forceinline__ float block_max(float v, float* buf) {
  publish_warp_maxima(v, buf);
  float r = 0.0f;
  if constexpr (kVector) {
    const float4* q = reinterpret_cast<const float4*>(buf);
    const float4 a = q[0], b = q[1];
    r = fmaxf(fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w)), fmaxf(fmaxf(b.x, b.y), fmaxf(b.z, b.w)));
    if (blockDim.x > 256u) {  // block-uniform; not taken by the split kernel's blocks
      const float4 c = q[2], d = q[3];
      r = fmaxf(r, fmaxf(fmaxf(fmaxf(c.x, c.y), fmaxf(c.z, c.w)), fmaxf(fmaxf(d.x, d.y), fmaxf(d.z, d.w))));
    }
  } else {
    for (uint32_t w = 0; w < blockDim.x / 32u; ++w) r = fmaxf(r, buf[w]);
  }
  return r;
}

/// The row's constants (core::nvfp4_token_row of its per-token scale) from each thread's
/// part v of the row max, computed by warp 0 alone and read by every thread from @p sh (all
/// threads call it: two barriers). Against block_max: a second barrier a row, but the other
/// warps skip the maxima's reads, the division and the reciprocal (about 40 instructions a
/// thread a row), which bound the row kernel at prefill. The split kernel's decode rows
/// keep block_max, one barrier shorter.
__device__ __forceinline__ core::TokenRow row_constants_by_warp0(float v, float* buf, core::TokenRow* sh, float floor) {
  publish_warp_maxima(v, buf);
  if (threadIdx.x < 32u) {  // warp 0, whole
    const float m = warp_max_nonneg(threadIdx.x < blockDim.x / 32u ? buf[threadIdx.x] : 0.0f);
    if (threadIdx.x == 0) *sh = core::nvfp4_token_row(core::per_token_scale(m, floor));
  }
  __syncthreads();
  return *sh;
}

/// Group g of row t from chunk x (amax: its NaN-ignoring max |x|, NaN for an all-NaN chunk):
/// its scale byte and nibbles, under the row's constants @p row (core::nvfp4_token_row).
/// kFast: the row has row.fast (the caller's row-uniform branch), the division-free form
/// without nvfp4_token_group's test and the f16 multiply form without its own.
template <int In, bool kFast = false>
__device__ __forceinline__ void encode_group(const Params64& p, int64_t t, int64_t g, const RawChunk<In>& x, float amax,
                                             const core::TokenRow& row) {
  constexpr core::Format F = core::Format::kNvfp4PerToken;
  // From 0 like the CPU backend's fold: an all-NaN group has amax 0.
  const float m = fmaxf(0.0f, amax);
  const core::GroupParams gp = kFast ? core::nvfp4_token_group_fast(m, row) : core::nvfp4_token_group(m, row);
  const Encoded<F> q = encode_chunk<F, In, kFast>(x, gp);  // a fast row's multipliers: 0 or >= 2^-123
  store_words<false>(p.xq + t * p.xq_s0 + g * (kChunk / 2), q.w);
  store_word_byte<int64_t>(p, t, g / 4, static_cast<uint32_t>(g % 4), gp.sf);
}

/// Row t with groups threadIdx.x + n * blockDim.x, n < N, held in registers. kSplit: the
/// block is part @p part of kSplit == N blocks that share the row (decode: the row's work
/// over several SMs): it loads every group for the row's max but encodes, counts and
/// stores only its own, n == part (part 0 also the per-token scale; the top-k entries are
/// the split kernel's top-k blocks', topk.cuh repack_block).
template <int In, bool kCount, int N, bool kSplit>
__device__ __forceinline__ void row_in_registers(const Params64& p, int64_t t, int64_t groups, float* buf, uint32_t& nf,
                                                 int part, core::TokenRow* sh = nullptr) {
  const auto* hs = static_cast<const typename InTraits<In>::T*>(p.hs);
  RawChunk<In> x[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int64_t g = threadIdx.x + n * static_cast<int64_t>(blockDim.x);
    if (g < groups) load_chunk<In>(hs + t * p.hs_s0 + g * kChunk, x[n]);
    else zero_chunk<In>(x[n]);  // amax 0, no non-finite elements
  }
  // The row's top-k entries while the chunk loads are in flight.
  if constexpr (!kSplit) repack_topk<int64_t>(p, t, threadIdx.x, blockDim.x);
  float amax[N], row = 0.0f;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    amax[n] = chunk_amax<In>(x[n]);
    row = fmaxf(row, amax[n]);
    if constexpr (kCount) nf += !kSplit || n == part ? chunk_nonfinite<In>(x[n]) : 0u;
  }
  core::TokenRow tr;
  if constexpr (kSplit) {
    const float rmax = block_max<true>(row, buf);
    tr = core::nvfp4_token_row(core::per_token_scale(rmax, p.floor));
  } else {
    tr = row_constants_by_warp0(row, buf, sh, p.floor);
  }
  if (threadIdx.x == 0 && (!kSplit || part == 0)) p.x_scales[t * p.xs_s0] = tr.pts;
  if constexpr (kSplit) {
    // The own chunk by selects (block-uniform part): one encode, the others' registers free.
    RawChunk<In> own = x[0];
    float own_amax = amax[0];
#pragma unroll
    for (int n = 1; n < N; ++n) {
      if (n == part) {
        own = x[n];
        own_amax = amax[n];
      }
    }
    const int64_t g = threadIdx.x + part * static_cast<int64_t>(blockDim.x);
    if (g < groups) {
      if (tr.fast) encode_group<In, true>(p, t, g, own, own_amax, tr);
      else encode_group<In>(p, t, g, own, own_amax, tr);
    }
  } else {
    // Block-uniform branches around the groups where every thread has all N (the planned
    // shapes at H = 4096 and 7168): the row's flag tested once, no per-thread test, so that
    // no group is a convergence region of its own around its whole encode.
    const auto encode = [&](auto fast, auto whole) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const int64_t g = threadIdx.x + n * static_cast<int64_t>(blockDim.x);
        if (decltype(whole)::value || g < groups) encode_group<In, decltype(fast)::value>(p, t, g, x[n], amax[n], tr);
      }
    };
    if (!tr.fast) encode(std::false_type{}, std::false_type{});
    else if (groups == N * static_cast<int64_t>(blockDim.x)) encode(std::true_type{}, std::true_type{});
    else encode(std::true_type{}, std::false_type{});
  }
}

/// Resident blocks per SM of the split variants (at most kRowSplitMaxThreads threads, up to
/// four chunks of the row in flight a thread).
template <int In>
constexpr int kRowSplitBlocksPerSm = In == kInF32 ? 2 : 4;

/// The row kernel with each row shared by kSplit blocks (plan.h row_split; vectorized rows,
/// every part's groups one a thread): quantizing block b < p.quant_blocks takes part
/// b % kSplit of row b / kSplit (and b + quant_blocks, ...); the blocks after them repack
/// the top-k entries, so that no quantizing warp waits on their loads before the row max's
/// barrier.
template <int In, bool kCount, int kSplit>
__global__ void __launch_bounds__(kRowSplitMaxThreads, kRowSplitBlocksPerSm<In>)
    stage_rowwise_split_kernel(const Params64 p) {
  static_assert(kSplit == 2 || kSplit == 4, "two or four blocks a row");
  __shared__ alignas(16) float warp_max[2][kRowMaxWarps];
  zero_absent_warps(warp_max);
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  if (blockIdx.x >= p.quant_blocks) {  // block-uniform: a top-k block
    repack_block(p);
    return;
  }
  const int64_t groups = p.H / kChunk;
  uint32_t nf = 0, parity = 0;
  for (int64_t b = blockIdx.x; b < p.T * kSplit; b += p.quant_blocks, parity ^= 1u) {
    row_in_registers<In, kCount, kSplit, true>(p, b / kSplit, groups, warp_max[parity], nf,
                                               static_cast<int>(b % kSplit));
  }
  if constexpr (kCount) flush_nonfinite(p.nonfinite, nf);
}

/// Resident blocks per SM of the wide row kernel: 64 registers a thread (four chunks of
/// 16-bit inputs in flight and their encode).
constexpr int kRowWideBlocksPerSm = 8;

/// The wide row kernel (plan.h row_wide): kRowWideGroups groups a thread in registers, rows
/// of 16-bit inputs (fp32's four chunks would not fit its 64 registers).
template <int In, bool kCount>
__global__ void __launch_bounds__(kRowWideMaxThreads, kRowWideBlocksPerSm)
    stage_rowwise_wide_kernel(const Params64 p) {
  static_assert(In != kInF32, "16-bit inputs");
  __shared__ float warp_max[2][kRowMaxWarps];
  __shared__ alignas(16) core::TokenRow row_sh;
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  const int64_t groups = p.H / kChunk;
  uint32_t nf = 0, parity = 0;
  for (int64_t t = blockIdx.x; t < p.T; t += gridDim.x, parity ^= 1u) {
    row_in_registers<In, kCount, kRowWideGroups, false>(p, t, groups, warp_max[parity], nf, 0, &row_sh);
  }
  if constexpr (kCount) flush_nonfinite(p.nonfinite, nf);
}

template <int In, bool kVec, bool kCount>
__global__ void __launch_bounds__(kRowwiseMaxThreads, kRowBlocksPerSm<In, kCount>) stage_rowwise_kernel(const Params64 p) {
  constexpr core::Format F = core::Format::kNvfp4PerToken;
  static_assert(core::fixed_group_of(F) == kChunk, "one thread per 16-element group");
  __shared__ float warp_max[2][kRowMaxWarps];
  __shared__ alignas(16) core::TokenRow row_sh;
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  const int64_t groups = p.H / kChunk;
  const auto* hs = static_cast<const typename InTraits<In>::T*>(p.hs);
  // Block-uniform: the row in registers, one or two groups a thread.
  const bool in_registers = kVec && groups <= 2 * static_cast<int64_t>(blockDim.x);
  const bool one_group = groups <= static_cast<int64_t>(blockDim.x);
  uint32_t nf = 0, parity = 0;
  for (int64_t t = blockIdx.x; t < p.T; t += gridDim.x, parity ^= 1u) {
    if constexpr (kVec) {
      if (in_registers) {
        if (one_group) row_in_registers<In, kCount, 1, false>(p, t, groups, warp_max[parity], nf, 0, &row_sh);
        else row_in_registers<In, kCount, 2, false>(p, t, groups, warp_max[parity], nf, 0, &row_sh);
        continue;
      }
    }
    repack_topk<int64_t>(p, t, threadIdx.x, blockDim.x);
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
    const float pts = core::per_token_scale(block_max<false>(amax, warp_max[parity]), p.floor);
    if (threadIdx.x == 0) p.x_scales[t * p.xs_s0] = pts;
    const core::TokenRow tr = core::nvfp4_token_row(pts);
    // Pass 2: groups.
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      uint32_t ignored = 0;
      if constexpr (kVec) {
        RawChunk<In> x;
        load_chunk<In>(hs + t * p.hs_s0 + g * kChunk, x);
        encode_group<In>(p, t, g, x, chunk_amax<In>(x), tr);
      } else {
        float x[kChunk];
        load_group_strided<In>(p, t, g, x);
        const core::GroupParams gp = core::nvfp4_token_group(group_amax_strided<false>(x, ignored), tr);
#pragma unroll
        for (int i = 0; i < kChunk; i += 2) {
          const uint32_t byte = core::encode<F>(x[i], gp) | (core::encode<F>(x[i + 1], gp) << 4);
          p.xq[t * p.xq_s0 + (g * (kChunk / 2) + i / 2) * p.xq_s1] = static_cast<uint8_t>(byte);
        }
        store_word_byte<int64_t>(p, t, g / 4, static_cast<uint32_t>(g % 4), gp.sf);
      }
    }
  }
  if constexpr (kCount) flush_nonfinite(p.nonfinite, nf);
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
