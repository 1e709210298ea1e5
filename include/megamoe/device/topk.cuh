/// @file device/topk.cuh
/// @brief The top-k repack and the full-buffer tail, entry by entry: the device functions
/// every kernel of the library stages top-k with (staging, routing-only, router) and a
/// producer calls with a StageTarget.
///
/// P is any parameter block with the top-k fields of StageTarget (ids, w, pad, idx_out,
/// w_out, their strides, flags, alpha, escale, es_s0, n_experts); Idx the index type of its
/// offsets (int64_t, or uint32_t where the caller knows every offset fits).
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "megamoe/device/target.h"

namespace megamoe {
namespace device {

/// Element offset i * s0 + k * s1 in the index type of the caller.
template <typename Idx>
__device__ __forceinline__ Idx offset(Idx i, Idx s0, Idx k, Idx s1) {
  return i * s0 + k * s1;
}

/// The staged top-k entry (t, k): id and weight.
template <typename Idx, typename P>
__device__ __forceinline__ void store_entry(const P& p, Idx t, Idx k, int64_t id, float w) {
  p.idx_out[offset(t, static_cast<Idx>(p.io_s0), k, static_cast<Idx>(p.io_s1))] = id;
  p.w_out[offset(t, static_cast<Idx>(p.wo_s0), k, static_cast<Idx>(p.wo_s1))] = w;
}

/// Entry (t, k) of a full-buffer tail row (T <= t < M, no token): -1 / +0.0, nothing read.
template <typename Idx, typename P>
__device__ __forceinline__ void mark_empty(const P& p, Idx t, Idx k) {
  store_entry(p, t, k, int64_t{-1}, 0.0f);
}

/// Top-k entry (t, k), t < T: padded rows get id -1 and weight 0, others a copy (ids
/// widened to int64, weights to fp32, times the routed scaling factor when the call has
/// one, then the expert's scale when it has a table: one fp32 product each). Both loads
/// (and the padding flag's) issue before any use.
template <typename Idx, typename P>
__device__ __forceinline__ void repack_entry(const P& p, Idx t, Idx k) {
  const Idx ioff = offset(t, static_cast<Idx>(p.ids_s0), k, static_cast<Idx>(p.ids_s1));
  const Idx woff = offset(t, static_cast<Idx>(p.w_s0), k, static_cast<Idx>(p.w_s1));
  const int64_t id = (p.flags & kFlagIdsI64) ? static_cast<const int64_t*>(p.ids)[ioff]
                                             : static_cast<int64_t>(static_cast<const int32_t*>(p.ids)[ioff]);
  const bool w16 = (p.flags & (kFlagWBF16 | kFlagWF16)) != 0;
  const uint32_t wbits = w16 ? static_cast<uint32_t>(static_cast<const uint16_t*>(p.w)[woff])
                             : static_cast<const uint32_t*>(p.w)[woff];
  const uint8_t pad = p.pad != nullptr ? p.pad[t * static_cast<Idx>(p.pad_s0)] : uint8_t{0};
  // fp16 weights by the software rule: the hardware conversion canonicalizes NaN payloads,
  // and a kept NaN weight is copied bit-exactly.
  const float w = (p.flags & kFlagWBF16)  ? core::bf16_to_float(static_cast<uint16_t>(wbits))
                  : (p.flags & kFlagWF16) ? core::half_to_float(static_cast<uint16_t>(wbits))
                                          : core::bits_float(wbits);
  float wk = (p.flags & kFlagAlpha) ? core::scale_weight(w, p.alpha) : w;
  // The expert's scale: a load that depends on the id, so only where the call has a table
  // and the entry is kept with an id inside it.
  if ((p.flags & kFlagExpertScales) && pad == 0 && id >= 0 && id < p.n_experts) {
    wk = core::scale_weight(wk, p.escale[id * p.es_s0]);
  }
  store_entry(p, t, k, pad != 0 ? int64_t{-1} : id, pad != 0 ? 0.0f : wk);
}

}  // namespace device
}  // namespace megamoe
