// quantize_fast.cuh: the vectorized staging kernel, for hidden and x_q rows that are
// contiguous and 16-byte (x_q of fp4: 8-byte) aligned, and the formats whose group is a
// whole number of 16-element chunks: fp8 with G 32 or 128, MXFP4 (G 32), NVFP4 static (G 16).
//
// One thread owns a 16-element chunk of one token row (two 16 B loads of bf16/fp16, four
// of fp32; one 16 B store of fp8 or one 8 B store of fp4 nibbles). Consecutive threads own
// consecutive chunks of the flattened [T, H] problem. The G/16 threads of a group reduce
// amax with xor-shuffles; the group's first thread stores the scale: an fp32, or its byte
// (UE8M0 or e4m3) straight into the packed int32 word and into the shared-expert copy.
// Shapes (plan.h): a grid-stride loop, one chunk per thread with top-k blocks of their own,
// or token tiles that gather the scales in shared memory so that MN-major scale layouts
// get 8 tokens per line (docs/DESIGN.md).
#pragma once

#include <type_traits>

#include "formats/recipe.h"
#include "cuda/kernels/chunk.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/geometry.h"
#include "cuda/kernels/topk.cuh"

namespace megamoe {
namespace cuda {
namespace {

// Resident 256-thread blocks per SM the fast kernel is built for: the SM's thread limit
// (2048 on sm_80/90/100, 1536 on sm_86/87/89) for 16-bit inputs, which then fit 32
// registers; fp32 inputs hold twice the bytes per chunk and get 6 blocks (40 registers).
// The variants off the measured paths get more registers where ptxas -v showed spills:
// counting 16-bit inputs 6 blocks (NVFP4 static on sm_100), counting or fp4-encoding fp32
// inputs 4 (the tile shape; on sm_80 the one-pass shape). NVFP4 static of 16-bit inputs
// also gets 6: its seven per-group thresholds (formats/e2m1/pairs.h) spilled at 32 registers,
// as did MXFP4's paired path on sm_80.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
constexpr int kFastBlocksPerSm16 = 6;
#else
constexpr int kFastBlocksPerSm16 = 8;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 800
constexpr bool kSm80 = true;
#else
constexpr bool kSm80 = false;
#endif
template <core::Format F, bool kCount>
constexpr bool kFast16NeedsRegisters =
    kCount || F == core::Format::kNvfp4Static || (kSm80 && core::values_per_byte(F) == 2);
template <int In, core::Format F, bool kCount>
constexpr int kFastBlocksPerSm = In != kInF32 ? (kFast16NeedsRegisters<F, kCount> ? 6 : kFastBlocksPerSm16)
                                                : (kCount || core::values_per_byte(F) == 2 ? 4 : 6);

/// Index width and store policy of the fast kernel (64-bit plans always stream).
enum class Mode {
  kIdx32,        ///< 32-bit chunk indices and offsets, default stores (decode, mid sizes)
  kIdx32Stream,  ///< 32-bit, evict-first stores (outputs larger than L2)
  kIdx64Stream,  ///< 64-bit everything (T*H or an offset beyond 2^31), evict-first stores
};
template <Mode kMode>
using IdxOf = std::conditional_t<kMode == Mode::kIdx64Stream, int64_t, uint32_t>;

/// What a variant of the fast kernel adds to the plain path.
enum class Extras {
  kNone,   ///< the default amax floor, compiled in (the instruction sequence of the fp8 path)
  kFloor,  ///< the amax floor read from the parameters
  kCount,  ///< the floor read, and the non-finite counter
};
/// The format's group math reads the amax floor (NVFP4 static's does not).
template <core::Format F>
constexpr bool kUsesFloor = F != core::Format::kNvfp4Static && F != core::Format::kNvfp4PerToken;

/// The format's scale as it is stored: packed byte (UE8M0 / e4m3) or fp32 bits.
template <core::Format F>
constexpr bool kPackedSf = core::packed_scales(F);

/// The loop shape of NVFP4 static of bf16 on sm_89+ builds, once a block, the multiply
/// form's multiplier of each scale byte (core::nvfp4_static_multiplier: 0 where the byte's
/// divisor has none) in shared memory; a group then costs one table read instead of its
/// divisor and seven thresholds, and its codes the multiply form (formats/e2m1/f16mul.h) instead
/// of the threshold count (formats/e2m1/f16.h). The other shapes run a chunk or a few a thread,
/// too few to pay for the table.
template <int In, core::Format F, Shape kShape>
constexpr bool kRecipTable = kShape == Shape::kLoop && F == core::Format::kNvfp4Static && In == kInBF16 && kHasE5m2;
constexpr uint32_t kRecipEntries = 128;  // every e4m3 byte of a positive scale (0x7F: NaN, never stored)
/// Resident blocks of the table's loop, the SM's thread limit (its grid is one wave of them,
/// plan.h kRecipLoopWaves): the multiply form fits 32 registers, counting included (ptxas
/// -v, sm_90 and sm_100). sm_86/87/89 hold 1536 threads, 6 such blocks: asking for 8 there
/// is out of their range (ptxas ignores it with a warning).
constexpr int kRecipBlocksPerSm = kFastBlocksPerSm16;

/// Index c's row t and position in the row j (fastdiv by cpr_div in the 32-bit modes,
/// where cpr_div.divisor == cpr).
template <typename Idx>
__device__ __forceinline__ void row_and_chunk(const ParamsT<Idx>& p, Idx c, Idx& t, Idx& j) {
  if constexpr (sizeof(Idx) == 4) {
    t = core::fastdiv(c, p.cpr_div);
    j = c - t * p.cpr_div.divisor;
  } else {
    t = c / p.cpr;
    j = c - t * p.cpr;
  }
}

/// The max of @p amax over the kTPG consecutive threads of a group (xor-shuffles; every
/// lane of the warp must call it).
template <int kTPG>
__device__ __forceinline__ float group_amax(float amax) {
#pragma unroll
  for (int off = 1; off < kTPG; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  return amax;
}

/// Group g's scale of row t: its byte into the packed word (and the shared-expert copy), or
/// its fp32.
template <core::Format F, typename Idx>
__device__ __forceinline__ void store_group_scale(const ParamsT<Idx>& p, Idx t, Idx g, uint32_t sf) {
  if constexpr (kPackedSf<F>) {
    store_word_byte(p, t, g / 4, static_cast<uint32_t>(g % 4), sf);
  } else {
    store_fp32_scale(p, t, g, __uint_as_float(sf));
  }
}

/// Quantize chunk j of row t (a no-op unless active, but every lane must call it:
/// shuffles). s2: the format's second-level scale (static_scale2). kTile: the group's scale
/// goes to this warp's row of the block's shared-memory tile (a scale byte or an fp32's
/// bits, at the group's index within the warp's 32 chunks) instead of global memory. X: the
/// floor's source, and whether the chunk's non-finite elements are added to nf. kRecip:
/// @p recip is the block's table of kRecipTable.
template <int In, core::Format F, int G, bool kStream, bool kTile, Extras X, bool kRecip, typename Idx, typename S2>
__device__ __forceinline__ void stage_at(const ParamsT<Idx>& p, Idx t, Idx j, bool active, const S2& s2, uint32_t* tile,
                                         uint32_t& nf, const float* recip) {
  static_assert(G % kChunk == 0 && G <= 128, "fast path groups span whole chunks");
  constexpr int kTPG = G / kChunk;                                 // threads per group
  constexpr int kOutBytes = kChunk / core::values_per_byte(F);    // x_q bytes per chunk
  RawChunk<In> x;
  if (active) {
    load_chunk<In>(static_cast<const typename InTraits<In>::T*>(p.hs) + offset(t, p.hs_s0, j * kChunk, Idx{1}), x);
  } else {
    zero_chunk<In>(x);
  }
  if constexpr (X == Extras::kCount) nf += chunk_nonfinite<In>(x);
  const float amax = group_amax<kTPG>(chunk_amax<In>(x));
  if (!active) return;
  const float floor = X == Extras::kNone ? core::kAmaxFloor : p.floor;
  core::GroupParams gp;
  Encoded<F> q;
  if constexpr (kRecip) {
    gp.sf = static_sf(amax, s2);
    const float r = recip[gp.sf];
    if (r != 0.0f) {
      core::e2m1_f16_mul_chunk(x.w, r, q.w);  // r >= 2^-100 (kPairsMaxDivisor)
    } else {  // rare (see the table's tests): per value, which holds no thresholds in registers
      gp.m = core::nvfp4_static_divisor(gp.sf, gs_of(s2));
      encode_fp4_per_value<F, In>(x, gp, q.w);
    }
  } else {
    gp = group_params_of<F>(amax, floor, s2);
    q = encode_chunk<F, In>(x, gp);
  }
  store_words<kStream>(p.xq + offset(t, p.xq_s0, j * kOutBytes, Idx{1}), q.w);
  // The group's first thread stores its scale: an fp32, or its byte into the packed word
  // and the shared-expert copy.
  if (j % kTPG != 0) return;
  if constexpr (kTile) {  // j = 32 * segment + lane
    const uint32_t gl = (threadIdx.x % 32u) / kTPG;  // group in the warp's segment
    if constexpr (kPackedSf<F>) reinterpret_cast<uint8_t*>(tile)[gl] = static_cast<uint8_t>(gp.sf);
    else tile[gl] = gp.sf;
    return;
  }
  store_group_scale<F>(p, t, j / kTPG, gp.sf);  // (j / kTPG: the group in the row)
}

/// Quantize half chunk c (8 elements) of the flattened problem (Shape::kSplitHalf: FP4
/// formats of 16-bit inputs): stage_at's steps on one 16-byte load, 2G/16 threads a group,
/// one 4-byte store of nibbles. The chunk forms encode words 0..3 of a chunk whose words
/// 4..7 are zero; only the first output word is stored, so the compiler drops the rest.
template <int In, core::Format F, int G, bool kStream, Extras X, typename S2>
__device__ __forceinline__ void stage_half(const Params32& p, uint32_t c, const S2& s2, uint32_t& nf) {
  static_assert(In != kInF32 && core::values_per_byte(F) == 2, "half chunks: FP4 of 16-bit inputs");
  constexpr int kTPG = 2 * G / kChunk;  // threads per group
  constexpr Half2Kind K = In == kInBF16 ? Half2Kind::kBF16 : Half2Kind::kF16;
  const uint32_t h = c & 1u;
  uint32_t t, j;
  row_and_chunk(p, c >> 1, t, j);
  const bool active = (c >> 1) < p.n_chunks;
  RawChunk<In> x;
  zero_chunk<In>(x);
  if (active) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(static_cast<const typename InTraits<In>::T*>(p.hs) +
                                                         offset(t, p.hs_s0, j * kChunk + h * (kChunk / 2), 1u)));
    x.w[0] = u.x;
    x.w[1] = u.y;
    x.w[2] = u.z;
    x.w[3] = u.w;
  }
  if constexpr (X == Extras::kCount) nf += chunk_nonfinite<In>(x);  // (words 4..7: zeros, finite)
  const uint32_t (&lo)[4] = reinterpret_cast<const uint32_t(&)[4]>(x.w);
  const float amax = group_amax<kTPG>(abs_max_packed<K>(lo));
  if (!active) return;
  const float floor = X == Extras::kNone ? core::kAmaxFloor : p.floor;
  const core::GroupParams gp = group_params_of<F>(amax, floor, s2);
  const Encoded<F> q = encode_chunk<F, In>(x, gp);
  const uint32_t w0[1] = {q.w[0]};  // (the half's nibbles: one word)
  store_words<kStream>(p.xq + offset(t, p.xq_s0, j * (kChunk / 2) + h * (kChunk / 4), 1u), w0);
  const uint32_t jh = 2u * j + h;  // half chunk in the row
  if (jh % kTPG != 0) return;
  store_group_scale<F>(p, t, jh / kTPG, gp.sf);
}

/// Quantize 16-element chunk c of the flattened problem (see stage_at).
template <int In, core::Format F, int G, bool kStream, Extras X, bool kRecip, typename Idx, typename S2>
__device__ __forceinline__ void stage_chunk(const ParamsT<Idx>& p, Idx c, const S2& s2, uint32_t& nf,
                                            const float* recip) {
  Idx t, j;
  row_and_chunk(p, c, t, j);
  stage_at<In, F, G, kStream, false, X, kRecip>(p, t, j, c < p.n_chunks, s2, nullptr, nf, recip);
}

/// Tile i of the tile shape: warp w quantizes token kTileTokens * (i / segments) + w,
/// chunks 32 * (i % segments) + lane; then the block stores the tile's scales with
/// consecutive threads on consecutive tokens (packed scales: whole words, to x_sf and the
/// shared copy). Every thread of the block must call it (barriers).
template <int In, core::Format F, int G, bool kStream, Extras X>
__device__ __forceinline__ void stage_tile(const Params32& p, uint32_t i, float s2, uint32_t& nf) {
  constexpr uint32_t kItems = kPackedSf<F> ? 512u / (4u * G) : 512u / G;  // words or groups per segment
  constexpr uint32_t kChunksPerItem = kPackedSf<F> ? 4u * G / kChunk : G / kChunk;
  __shared__ uint32_t tile[kTileTokens][kItems];
  const uint32_t tg = core::fastdiv(i, p.seg_div), seg = i - tg * p.seg_div.divisor;
  const uint32_t warp = threadIdx.x / 32u, t = tg * kTileTokens + warp, j = seg * 32u + threadIdx.x % 32u;
  stage_at<In, F, G, kStream, true, X, false>(p, t, j, t < p.T && j < p.cpr, s2, tile[warp], nf, nullptr);
  __syncthreads();
  if (threadIdx.x < kTileTokens * kItems) {
    const uint32_t k = threadIdx.x % kTileTokens, item = threadIdx.x / kTileTokens;
    const uint32_t tt = tg * kTileTokens + k, g = seg * kItems + item;  // word (packed) or group
    if (tt < p.T && g * kChunksPerItem < p.cpr) {
      if constexpr (kPackedSf<F>) store_word(p, tt, g, tile[k][item]);
      else store_fp32_scale(p, tt, g, __uint_as_float(tile[k][item]));
    }
  }
  if (i + p.quant_blocks < p.n_tiles) __syncthreads();  // (block-uniform) the tile is free for the next one
}

/// The fast kernel. X == Extras::kCount: the variant that counts non-finite hidden
/// elements into p.nonfinite; the others neither compute nor touch the counter.
template <int In, core::Format F, int G, Mode kMode, Shape kShape, Extras X>
__global__ void __launch_bounds__(256, kRecipTable<In, F, kShape> ? kRecipBlocksPerSm
                                                                   : kFastBlocksPerSm<In, F, X == Extras::kCount>)
    stage_fast_kernel(const ParamsT<IdxOf<kMode>> p) {
  using Idx = IdxOf<kMode>;
  static_assert(kShape == Shape::kLoop || sizeof(Idx) == 4, "one-pass shapes use 32-bit indices");
  static_assert(kShape == Shape::kLoop || kShape == Shape::kSplitTopk || kShape == Shape::kSplitHalf ||
                    kShape == Shape::kTile,
                "fast shapes");
  constexpr bool kStream = kMode != Mode::kIdx32;
  if (p.flags & kFlagPdl) pdl_wait_and_trigger();
  uint32_t nf = 0;
  if constexpr (kShape == Shape::kLoop) {
    repack_dense(p);  // first: its loads' latency hides behind the other warps' chunks
    const auto s2 = static_scale2_once<F>(p);
    constexpr bool kRecip = kRecipTable<In, F, kShape>;
    __shared__ float recip[kRecip ? kRecipEntries : 1u];
    if constexpr (kRecip) {
      for (uint32_t i = threadIdx.x; i < kRecipEntries; i += blockDim.x) {
        recip[i] = core::nvfp4_static_multiplier(core::nvfp4_static_divisor(i, gs_of(s2)));
      }
      __syncthreads();
    }
    // 32-bit modes: the host checked n + gridDim.x * blockDim.x < 2^32 (no wrap-around).
    for (Idx base = static_cast<Idx>(blockIdx.x) * blockDim.x; base < p.n_chunks;
         base += static_cast<Idx>(gridDim.x) * blockDim.x) {
      stage_chunk<In, F, G, kStream, X, kRecip>(p, base + threadIdx.x, s2, nf, recip);
    }
  } else {
    if (blockIdx.x >= p.quant_blocks) {  // block-uniform: a top-k block
      repack_block(p);
      return;
    }
    const float s2 = static_scale2<F>(p);
    if constexpr (kShape == Shape::kTile) {
      for (uint32_t i = blockIdx.x; i < p.n_tiles; i += p.quant_blocks) stage_tile<In, F, G, kStream, X>(p, i, s2, nf);
    } else if constexpr (kShape == Shape::kSplitHalf) {
      stage_half<In, F, G, kStream, X>(p, blockIdx.x * blockDim.x + threadIdx.x, s2, nf);
    } else {
      stage_chunk<In, F, G, kStream, X, false>(p, blockIdx.x * blockDim.x + threadIdx.x, s2, nf, nullptr);
    }
  }
  if constexpr (X == Extras::kCount) flush_nonfinite(p.nonfinite, nf);
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
