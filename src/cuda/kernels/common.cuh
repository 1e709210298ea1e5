// common.cuh: what every staging kernel shares: the parameter block, input traits,
// PDL entry, strided offsets, scale stores and the non-finite counter's warp flush.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/fastdiv.h"
#include "formats/recipe.h"
#include "core/layout.h"
#include "core/numerics.h"
#include "megamoe/device/target.h"

namespace megamoe {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------
// Kernel parameters (passed by value), for Idx = uint32_t (the fast kernel's 32-bit modes:
// strides and offsets fit, see fits_idx32 in plan.cpp) or int64_t (everything else).
// Kernel arguments live in the constant bank; at decode sizes every first touch of a
// constant-cache line is a stall on the critical path, so fields are grouped by who needs
// them when (32-bit layout, 64-byte lines, arguments from 16 bytes into the first line):
// the quantizing warps before their first load (line A, 48 bytes), their scale math and
// stores (line B), the top-k warps (lines C, D), then what only the other formats and
// kernels read (second-level scales, the non-finite counter, the general kernels' sizes).
// kFlagExpertScales: kept weights of ids in [0, E) times escale[id]; kFlagUnitGs: NVFP4
// static staging an NVFP4 online call of floor 0 (Plan::unit_gs).
// The top-k bits are the device API's (megamoe/device/target.h), which producers share.
using device::kFlagAlpha;
using device::kFlagExpertScales;
using device::kFlagIdsI64;
using device::kFlagWBF16;
using device::kFlagWF16;
enum : uint32_t { kFlagPdl = 1u, kFlagUnitGs = 64u };
static_assert(((kFlagPdl | kFlagUnitGs) & (kFlagIdsI64 | kFlagWBF16 | kFlagWF16 | kFlagAlpha | kFlagExpertScales)) == 0u,
              "the kernels' own flags are apart from the top-k bits");

template <typename Idx>
struct ParamsT {
  // A: before the first load of hidden states.
  const void* hs;
  uint8_t* xq;
  Idx hs_s0, xq_s0;
  Idx n_chunks;              // fast path: T * cpr
  uint32_t quant_blocks;     // split-topk / tile: blocks below quantize, the rest repack top-k
  core::FastDivU32 cpr_div;  // fast path: chunk index -> row (32-bit modes)
  uint32_t flags;            // kFlag*: launched with PDL, ids int64, weights bf16 / fp16, alpha, expert scales
  // B: scale math and stores.
  void* sf;
  uint32_t* shared_sf;  // nullable
  Idx sf_s0, sf_s1, sh_s0, sh_s1;
  core::FastDivU32 bm_div;  // shared rows: token -> block of shared_bm rows (32-bit modes)
  Idx abm;                  // aligned_block_m(shared_bm)
  Idx cpr;                  // 16-element chunks per row (H / 16)
  Idx hs_s1, xq_s1;         // general kernels only (filling the line)
  float floor;              // the scheme's amax floor
  // C, D: top-k.
  const void* ids;
  const void* w;
  const uint8_t* pad;  // nullable
  int64_t* idx_out;
  float* w_out;
  Idx ids_s0, ids_s1, w_s0, w_s1, pad_s0, io_s0, io_s1, wo_s0, wo_s1;
  core::FastDivU32 k_div;  // top-k blocks (split top-k shape, split rows): entry index -> row
  Idx n_topk;              // T * K, or M * K when the top-k blocks also fill the full-buffer tail
  Idx K;
  float alpha;             // routed scaling factor of kept weights (kFlagAlpha)
  // Tile shape (and T also the general kernels).
  Idx T;
  Idx n_tiles;               // tile shape: ceil(T / kTileTokens) * seg_div.divisor
  core::FastDivU32 seg_div;  // tile shape: warp-wide segments (32 chunks) per row
  // Second-level scales and the counter (nullptr when the call has none).
  const float* gscale;               // NVFP4 static: the device scalar gs
  float* x_scales;                   // NVFP4 per-token: [T] output
  unsigned long long* nonfinite;     // the int64 counter (added to)
  Idx xs_s0;                         // x_scales stride
  // General kernels only.
  Idx H, G, shared_bm;
  // Per-expert scales (kFlagExpertScales): read once a kept entry's id is known, after
  // everything above; 64-bit because the index is an id, not an offset the host bounded.
  const float* escale;
  int64_t es_s0, n_experts;
};
using Params32 = ParamsT<uint32_t>;
using Params64 = ParamsT<int64_t>;
static_assert(offsetof(Params32, sf) == 48, "line A holds what the quantizing warps read before loading");
static_assert(offsetof(Params32, ids) == 112, "scale math and store fields fill line B");

enum InKind { kInBF16 = 0, kInF16 = 1, kInF32 = 2 };

template <int In>
struct InTraits;
template <>
struct InTraits<kInBF16> {
  using T = uint16_t;
  static __device__ __forceinline__ float to_float(uint16_t v) { return core::bf16_to_float(v); }
};
template <>
struct InTraits<kInF16> {
  using T = uint16_t;
  // Hardware conversion: equal to core::half_to_float for all 65536 inputs up to NaN
  // payloads (tests/cuda/test_cuda_numerics.cu, HalfToFloatMatchesHardware), which hidden
  // states never show (amax ignores NaN, every NaN encodes the same way whatever its payload).
  static __device__ __forceinline__ float to_float(uint16_t v) { return __half2float(__ushort_as_half(v)); }
};
template <>
struct InTraits<kInF32> {
  using T = float;
  static __device__ __forceinline__ float to_float(float v) { return v; }
};

__device__ __forceinline__ void pdl_wait_and_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Element offsets are computed in Idx: int64_t in general, uint32_t when the host has
// checked that every tensor's strides are non-negative and its largest offset is below
// 2^31 (fewer instructions on the decode critical path).
template <typename Idx>
__device__ __forceinline__ Idx offset(Idx i, Idx s0, Idx k, Idx s1) {
  return i * s0 + k * s1;
}

/// Row of shared_x_sf for token t (fastdiv in the 32-bit modes).
template <typename Idx>
__device__ __forceinline__ Idx shared_row(const ParamsT<Idx>& p, Idx t) {
  if constexpr (sizeof(Idx) == 4) {
    const Idx q = core::fastdiv(t, p.bm_div);
    return core::shared_sf_row_qm(q, t - q * p.bm_div.divisor, p.abm);
  } else {
    return core::shared_sf_row(t, p.shared_bm);
  }
}

/// Packed scale word w of row t, and its shared-expert copy.
template <typename Idx>
__device__ __forceinline__ void store_word(const ParamsT<Idx>& p, Idx t, Idx w, uint32_t word) {
  static_cast<uint32_t*>(p.sf)[offset(t, p.sf_s0, w, p.sf_s1)] = word;
  if (p.shared_sf != nullptr) p.shared_sf[offset(shared_row(p, t), p.sh_s0, w, p.sh_s1)] = word;
}

/// fp32 scale of group g of row t.
template <typename Idx>
__device__ __forceinline__ void store_fp32_scale(const ParamsT<Idx>& p, Idx t, Idx g, float scale) {
  static_cast<float*>(p.sf)[offset(t, p.sf_s0, g, p.sf_s1)] = scale;
}

/// Byte b (bits 8b..8b+7, little-endian) of packed scale word w of row t, and its shared copy.
template <typename Idx>
__device__ __forceinline__ void store_word_byte(const ParamsT<Idx>& p, Idx t, Idx w, uint32_t b, uint32_t e) {
  reinterpret_cast<uint8_t*>(static_cast<uint32_t*>(p.sf) + offset(t, p.sf_s0, w, p.sf_s1))[b] = static_cast<uint8_t>(e);
  if (p.shared_sf != nullptr) {
    reinterpret_cast<uint8_t*>(p.shared_sf + offset(shared_row(p, t), p.sh_s0, w, p.sh_s1))[b] = static_cast<uint8_t>(e);
  }
}

/// The format's second-level scale as the group math takes it: the static gs (read once
/// per thread from the device scalar, after the PDL wait, coherently), else unused.
template <core::Format F, typename Idx>
__device__ __forceinline__ float static_scale2(const ParamsT<Idx>& p) {
  if constexpr (F == core::Format::kNvfp4Static) {
    // Through L2 (ld.global.cg), not the non-coherent read-only path: NVFP4 online's amax
    // launch writes gs just before this kernel, which PDL may start early; its wait makes
    // the amax kernel's writes visible to coherent loads.
    const float gs = __ldcg(p.gscale);
    if ((p.flags & kFlagUnitGs) == 0u) return gs;  // (a branch on the flags, not on gs)
    // NVFP4 online of floor 0: a total of 0 from the amax blocks means every element was
    // below 2^-100, whose global scale is the unit scale (a select: a branch on the loaded
    // gs would hold back the loads behind it). Block 0's first thread stores the value
    // (gs itself or 1); another block reading 0 or 1 meanwhile gets 1 either way.
    const float g = gs == 0.0f ? 1.0f : gs;
    if (blockIdx.x == 0 && threadIdx.x == 0) *const_cast<float*>(p.gscale) = g;
    return g;
  } else {
    return 0.0f;
  }
}

/// NVFP4 static's scale byte of a group (the same bits either way): from gs alone (the
/// one-pass shapes, one group a thread) by the division; from the constants of
/// core::StaticScale (the loop shape, once a thread: static_scale2_once) without it. A
/// one-pass thread would spend more on the constants than on the division, and computed
/// before the chunk's loads they held those loads back until gs arrived (0.2 us a decode
/// call on an H100).
__device__ __forceinline__ uint32_t static_sf(float amax, float gs) { return core::nvfp4_static_sf(amax, gs); }
__device__ __forceinline__ uint32_t static_sf(float amax, const core::StaticScale& s) {
  return core::nvfp4_static_sf_of(amax, s);
}
__device__ __forceinline__ float gs_of(float gs) { return gs; }
__device__ __forceinline__ float gs_of(const core::StaticScale& s) { return s.gs; }

/// The loop shape's second-level scale: NVFP4 static's constants once a thread (the loop's
/// first loads wait for gs; the multiplier table's loop shape waits for it anyway), else as
/// static_scale2.
template <core::Format F, typename Idx>
__device__ __forceinline__ auto static_scale2_once(const ParamsT<Idx>& p) {
  if constexpr (F == core::Format::kNvfp4Static) return core::nvfp4_static_scale(static_scale2<F>(p));
  else return static_scale2<F>(p);
}

/// A group's parameters under the second-level scale s2 (static_scale2 or
/// static_scale2_once), NVFP4 static's through static_sf.
template <core::Format F, typename S2>
__device__ __forceinline__ core::GroupParams group_params_of(float amax, float floor, const S2& s2) {
  if constexpr (F == core::Format::kNvfp4Static) {
    core::GroupParams g;
    g.sf = static_sf(amax, s2);
    g.m = core::nvfp4_static_divisor(g.sf, gs_of(s2));
    return g;
  } else {
    return core::group_params<F>(amax, floor, gs_of(s2));
  }
}

/// Add the warp's non-finite counts to the counter: one atomic per warp, none when the warp
/// saw none. Every lane of the warp must call it (shuffles). 64-bit sums: a thread's count
/// is below 2^32, a warp's need not be.
__device__ __forceinline__ void flush_nonfinite(unsigned long long* counter, uint32_t mine) {
  unsigned long long s = mine;
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, off);
  if ((threadIdx.x % 32u) == 0u && s != 0ull) atomicAdd(counter, s);
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
