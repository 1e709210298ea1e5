/// @file device/stage.cuh
/// @brief The device-side staging API (header-only CUDA C++17, sm_80 and newer): what a
/// producer kernel calls once it holds a row, or a group-aligned part of a row, of values
/// after its own math, to write the staged form prepare_inputs would write for those rows.
///
/// It is built on the numerics the library's kernels and its CPU backend use (the format
/// registry and each format's recipe), so the bytes equal prepare_inputs' on the same rows
/// by construction; tests/cuda/test_device_api.cu holds the example producer
/// (examples/cuda/producer.cuh) to it, byte for byte, in every format.
///
/// Use: on the host, `megamoe::device::stage_target(args)` (device/target.h) checks the
/// staging arguments and returns a StageTarget; launch the producer kernel with it (by
/// value) and the format as a template argument (`device::visit_format(target.format, ...)`
/// gives the compile-time format). In the kernel, for each row t < T:
///   1. `float s2 = second_level_scale<F>(tg, row_amax)`: the static global scale (NVFP4
///      static), the per-token scale from the row's NaN-ignoring max |y| (NVFP4 per token:
///      store it with `store_token_scale`), else 0 (unused);
///   2. for each group g of G values: `stage_group<F>(tg, t, g, get, s2)`, get(i) the
///      group's value i as fp32 (called twice per value: amax, then encode), which stores
///      the group's codes and returns its scale code; store it with `store_scale<F>` (one
///      byte of a packed word or one fp32) or gather four into `store_scale_word`;
///   3. the row's top-k entries: `repack_topk(tg, t, k)` for k < K;
/// and for full-buffer rows T <= t < M: `mark_empty_entry(tg, t, k)`. bf16 pass-through
/// (the format without scales) stores values with `store_bf16` instead of steps 1-2. The
/// non-finite counter: count with `count_nonfinite` and add once a thread with
/// `add_nonfinite`. NVFP4 online is refused by stage_target (a producer stages NVFP4 static
/// under a global scale it computes).
///
/// Values are what the producer would have written as its bf16 (or fp16, fp32) rows,
/// converted exactly to fp32: staging the rounded rows is what makes the bytes equal
/// prepare_inputs applied to the producer's own output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/layout.h"
#include "formats/recipe.h"
#include "formats/visit.h"
#include "megamoe/device/target.h"
#include "megamoe/device/topk.cuh"

namespace megamoe {
namespace device {

using core::Format;
using core::GroupParams;
using core::visit_format;  // host: fn(FormatTag<F>{}) for StageTarget::format

/// The format of a StageTarget as the registry's enumerator.
inline Format format_of(const StageTarget& tg) { return static_cast<Format>(tg.format); }

/// NaN-ignoring max |x| of a running group amax and a value (fmaxf semantics: a NaN
/// value leaves the max unchanged, +-Inf counts as Inf).
__device__ __forceinline__ float amax_step(float amax, float x) { return fmaxf(amax, core::abs_bits(x)); }

/// 1 for NaN and +-Inf (the non-finite counter's rule).
__device__ __forceinline__ uint32_t count_nonfinite(float x) { return core::non_finite(x) ? 1u : 0u; }

/// Add a thread's non-finite count to the call's counter (when it has one): one atomic per
/// thread with a nonzero count. Any thread may call it, alone.
__device__ __forceinline__ void add_nonfinite(const StageTarget& tg, uint32_t n) {
  if (tg.nonfinite != nullptr && n != 0u) atomicAdd(tg.nonfinite, static_cast<unsigned long long>(n));
}

/// The row's second-level scale as group_params takes it: NVFP4 static's global scale
/// (read through L2: a producer may be PDL-launched after the kernel that wrote it),
/// NVFP4 per token's pts from the row's NaN-ignoring max |x| (row_amax), 0 otherwise.
template <Format F>
__device__ __forceinline__ float second_level_scale(const StageTarget& tg, float row_amax) {
  if constexpr (core::row_of(F).s2 == Scale2::kStatic) {
    (void)row_amax;
    return __ldcg(tg.gscale);
  } else if constexpr (core::row_scaled(F)) {
    return core::per_token_scale(row_amax, tg.floor);
  } else {
    (void)tg;
    (void)row_amax;
    return 0.0f;
  }
}

/// NVFP4 per token: row t's scale pts into x_scales.
__device__ __forceinline__ void store_token_scale(const StageTarget& tg, int64_t t, float pts) {
  tg.x_scales[t * tg.xs_s0] = pts;
}

/// A group's scale and multiplier from its NaN-ignoring max |x| (format_list.h's recipes).
template <Format F>
__device__ __forceinline__ GroupParams group_params(const StageTarget& tg, float amax, float s2) {
  static_assert(!core::passthrough(F) && !core::online_scaled(F), "no group math for this format");
  return core::group_params<F>(amax, tg.floor, s2);
}

/// The code of value x in a group: an fp8 byte or an e2m1 nibble.
template <Format F>
__device__ __forceinline__ uint32_t encode(float x, const GroupParams& g) {
  return core::encode<F>(x, g);
}

/// Store group g's codes of row t, values get(0..G-1): fp8 one byte each, e2m1 two a byte
/// (low nibble first). Four bytes a store where x_q's row is contiguous and 4-aligned.
template <Format F, typename Get>
__device__ __forceinline__ void store_codes(const StageTarget& tg, int64_t t, int64_t g, const Get& get,
                                            const GroupParams& gp) {
  constexpr int kVpb = core::values_per_byte(F);
  const int64_t nbytes = tg.G / kVpb;
  const int64_t b0 = g * nbytes;  // the group's first byte column
  uint8_t* row = tg.x_q + t * tg.xq_s0;
  auto byte_of = [&](int64_t b) -> uint32_t {
    if constexpr (kVpb == 2) {
      return core::encode<F>(get(2 * b), gp) | (core::encode<F>(get(2 * b + 1), gp) << 4);
    } else {
      return core::encode<F>(get(b), gp);
    }
  };
  if (tg.xq_s1 == 1 && nbytes % 4 == 0 && reinterpret_cast<uintptr_t>(row + b0) % 4 == 0) {
    for (int64_t b = 0; b < nbytes; b += 4) {
      const uint32_t word = byte_of(b) | (byte_of(b + 1) << 8) | (byte_of(b + 2) << 16) | (byte_of(b + 3) << 24);
      *reinterpret_cast<uint32_t*>(row + b0 + b) = word;
    }
  } else {
    for (int64_t b = 0; b < nbytes; ++b) row[(b0 + b) * tg.xq_s1] = static_cast<uint8_t>(byte_of(b));
  }
}

/// Group g's scale code sf of row t: byte g % 4 of packed word g / 4 (and of its
/// shared-expert copy), or the fp32 scale.
template <Format F>
__device__ __forceinline__ void store_scale(const StageTarget& tg, int64_t t, int64_t g, uint32_t sf) {
  if constexpr (core::packed_scales(F)) {
    const int64_t w = core::ue8m0_word(g);
    const uint32_t b = static_cast<uint32_t>(g % 4);
    reinterpret_cast<uint8_t*>(static_cast<uint32_t*>(tg.x_sf) + t * tg.sf_s0 + w * tg.sf_s1)[b] =
        static_cast<uint8_t>(sf);
    if (tg.shared_sf != nullptr) {
      const int64_t r = core::shared_sf_row(t, tg.shared_bm);
      reinterpret_cast<uint8_t*>(tg.shared_sf + r * tg.sh_s0 + w * tg.sh_s1)[b] = static_cast<uint8_t>(sf);
    }
  } else {
    static_cast<uint32_t*>(tg.x_sf)[t * tg.sf_s0 + g * tg.sf_s1] = sf;  // the fp32 scale's bits
  }
}

/// Packed scale word w of row t (groups 4w .. 4w+3, byte j = group 4w+j) and its
/// shared-expert copy: for a producer that holds four groups.
__device__ __forceinline__ void store_scale_word(const StageTarget& tg, int64_t t, int64_t w, uint32_t word) {
  static_cast<uint32_t*>(tg.x_sf)[t * tg.sf_s0 + w * tg.sf_s1] = word;
  if (tg.shared_sf != nullptr) tg.shared_sf[core::shared_sf_row(t, tg.shared_bm) * tg.sh_s0 + w * tg.sh_s1] = word;
}

/// Stage group g (values g*G .. g*G+G-1) of row t: its NaN-ignoring amax, its parameters
/// under s2 (second_level_scale), its codes into x_q. Returns the scale code for
/// store_scale (UE8M0 or e4m3 byte, or fp32 bits). get(i), i < G: value i as fp32.
template <Format F, typename Get>
__device__ __forceinline__ uint32_t stage_group(const StageTarget& tg, int64_t t, int64_t g, const Get& get, float s2) {
  float amax = 0.0f;
  for (int64_t i = 0; i < tg.G; ++i) amax = amax_step(amax, get(i));
  const GroupParams gp = group_params<F>(tg, amax, s2);
  store_codes<F>(tg, t, g, get, gp);
  return gp.sf;
}

// ---------------------------------------------------------------------------------------
// Groups spread over lanes: V values a lane (consecutive columns), a group of G values on
// L = G / V consecutive lanes of a warp, its first lane a multiple of L (so every lane of a
// warp walking consecutive V-value parts of a row, parts aligned to a multiple of 32
// lanes, meets its group's lanes). Every lane of the warp calls these together (they
// shuffle); a lane past the row's end passes active = false and its values are ignored
// (its whole group is then past the end, as H is a multiple of G).

/// Lanes a group spans at V values a lane.
template <int V>
__device__ __forceinline__ int lanes_per_group(const StageTarget& tg) {
  return static_cast<int>(tg.G / V);
}

/// Stage the V values of this lane, columns h0 .. h0+V-1 of row t (h0 a multiple of V), as
/// part of their group: the group's NaN-ignoring amax across its lanes, its parameters
/// under s2, this lane's codes into x_q (one store where the row is contiguous and
/// aligned). Returns the group's scale code, the same in each of its lanes. Requires
/// G % V == 0 and G / V <= 32.
template <Format F, int V>
__device__ __forceinline__ uint32_t stage_group_part(const StageTarget& tg, int64_t t, int64_t h0, const float (&v)[V],
                                                     float s2, bool active) {
  static_assert(V % 8 == 0, "parts of 8 or 16 values (whole bytes and words of codes)");
  constexpr int kVpb = core::values_per_byte(F);
  constexpr int kBytes = V / kVpb;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) amax = amax_step(amax, v[i]);
  const int L = lanes_per_group<V>(tg);
  for (int o = 1; o < L; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const GroupParams gp = group_params<F>(tg, amax, s2);
  if (!active) return gp.sf;
  uint32_t words[kBytes / 4];
#pragma unroll
  for (int w = 0; w < kBytes / 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = (4 * w + b) * kVpb;
      const uint32_t byte = kVpb == 2 ? core::encode<F>(v[i], gp) | (core::encode<F>(v[i + 1], gp) << 4)
                                      : core::encode<F>(v[i], gp);
      word |= byte << (8 * b);
    }
    words[w] = word;
  }
  uint8_t* at = tg.x_q + t * tg.xq_s0 + (h0 / kVpb) * tg.xq_s1;
  const uintptr_t a = reinterpret_cast<uintptr_t>(at);
  const bool contiguous = tg.xq_s1 == 1;
  if constexpr (kBytes == 16) {
    if (contiguous && a % 16 == 0) {
      *reinterpret_cast<uint4*>(at) = make_uint4(words[0], words[1], words[2], words[3]);
      return gp.sf;
    }
  } else if constexpr (kBytes == 8) {
    if (contiguous && a % 8 == 0) {
      *reinterpret_cast<uint2*>(at) = make_uint2(words[0], words[1]);
      return gp.sf;
    }
  }
  if (contiguous && a % 4 == 0) {
#pragma unroll
    for (int w = 0; w < kBytes / 4; ++w) reinterpret_cast<uint32_t*>(at)[w] = words[w];
  } else {
#pragma unroll
    for (int b = 0; b < kBytes; ++b) at[b * tg.xq_s1] = static_cast<uint8_t>(words[b / 4] >> (8 * (b % 4)));
  }
  return gp.sf;
}

/// Store the scale code sf of the group holding columns h0 .. h0+V-1 (stage_group_part's
/// result, called by the same lanes together): packed scales as whole words where four
/// groups fit in a warp (gathered by shuffles, stored by the word's first lane), else one
/// byte by each group's first lane; fp32 scales by each group's first lane.
template <Format F, int V>
__device__ __forceinline__ void store_scale_part(const StageTarget& tg, int64_t t, int64_t h0, uint32_t sf, bool active) {
  const int L = lanes_per_group<V>(tg);
  const int lane = static_cast<int>(threadIdx.x % 32u);
  const int64_t g = h0 / tg.G;
  if constexpr (core::packed_scales(F)) {
    if (4 * L <= 32) {
      const int base = lane & ~(4 * L - 1);
      uint32_t word = 0;
      for (int j = 0; j < 4; ++j) word |= __shfl_sync(0xFFFFFFFFu, sf, base + j * L) << (8 * j);
      if (active && lane == base) store_scale_word(tg, t, g / 4, word);
      return;
    }
  }
  if (active && lane % L == 0) store_scale<F>(tg, t, g, sf);
}

/// bf16 pass-through: value h of row t as its bf16 bits (a bf16 row's bits as they are;
/// an fp32 value through core::bf16_from_float, nearest even, NaN 0x7FC0).
__device__ __forceinline__ void store_bf16(const StageTarget& tg, int64_t t, int64_t h, uint16_t bits) {
  reinterpret_cast<uint16_t*>(tg.x_q)[t * tg.xq_s0 + h * tg.xq_s1] = bits;
}

/// Top-k entry (t, k) of a row t < T (repack_entry: padding, scaling, expert scales).
__device__ __forceinline__ void repack_topk(const StageTarget& tg, int64_t t, int64_t k) { repack_entry(tg, t, k); }

/// Entry (t, k) of a full-buffer tail row T <= t < M: -1 / +0.0.
__device__ __forceinline__ void mark_empty_entry(const StageTarget& tg, int64_t t, int64_t k) { mark_empty(tg, t, k); }

}  // namespace device
}  // namespace megamoe
