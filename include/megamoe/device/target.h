/// @file device/target.h
/// @brief StageTarget: the staged outputs of one staging call as a plain value that a
/// producer kernel takes by value (header-only device API, device/stage.cuh).
///
/// A producer kernel (a norm, an mHC pre step, an activation function, a dispatch) that
/// holds rows of values after its own math stages them itself, without a staging launch
/// and without writing the rows to memory: on the host, `stage_target(args)` checks the
/// StageArgs exactly as prepare_inputs would (hidden_states only describes the rows: its
/// shape, dtype and device are read, its memory never) and returns this value; in the
/// kernel, the functions of megamoe/device/stage.cuh compute each group's scale, encode the
/// values and store x_q, x_sf, the shared-expert copy, the per-token scales, the top-k
/// repack and the full-buffer tail, with the numerics of the library's own kernels (the
/// bytes equal prepare_inputs' on the same rows).
///
/// Every stride is in elements of its tensor (x_q: bytes for fp8 and packed fp4, 2-byte
/// elements for the bf16 pass-through; x_sf: int32 words or fp32 scales).
#pragma once

#include <cstdint>

#include "megamoe/stage.h"

namespace megamoe {
namespace device {

/// StageTarget::flags bits of the top-k repack (the library's kernels use the same bits).
enum : uint32_t {
  kFlagIdsI64 = 2u,         ///< topk_ids are int64 (else int32)
  kFlagWBF16 = 4u,          ///< topk_weights are bf16
  kFlagWF16 = 8u,           ///< topk_weights are fp16 (neither: fp32)
  kFlagAlpha = 16u,         ///< kept weights times the routed scaling factor alpha
  kFlagExpertScales = 32u,  ///< kept weights of ids in [0, n_experts) times escale[id]
};

/// @brief The outputs of a staging call and its options, validated (stage_target).
struct StageTarget {
  int64_t T = 0;        ///< rows the producer stages (tokens)
  int64_t M = 0;        ///< rows of the top-k outputs: T, or max_tokens in full-buffer mode
  int64_t H = 0;        ///< values per row
  int64_t K = 0;        ///< top-k entries per row
  int64_t G = 0;        ///< group size (0 for the bf16 pass-through)
  uint8_t format = 0;   ///< the registry row (core::Format); device::visit_format dispatches on it
  float floor = 0.0f;   ///< the scheme's amax floor
  // Quantized rows.
  uint8_t* x_q = nullptr;  ///< [T, H] fp8 bytes, [T, H/2] packed e2m1, or [T, H] bf16 (2-byte elements)
  int64_t xq_s0 = 0, xq_s1 = 0;
  void* x_sf = nullptr;    ///< packed int32 scale words [T, H/(4G)] or fp32 scales [T, H/G]; null for bf16
  int64_t sf_s0 = 0, sf_s1 = 0;
  uint32_t* shared_sf = nullptr;  ///< optional shared-expert copy of x_sf's words (MN-major TMA rows)
  int64_t sh_s0 = 0, sh_s1 = 0, shared_bm = 1;
  float* x_scales = nullptr;      ///< NVFP4 per-token: [T] second-level scales
  int64_t xs_s0 = 0;
  const float* gscale = nullptr;  ///< NVFP4 static: the device scalar gs
  unsigned long long* nonfinite = nullptr;  ///< optional int64 counter of NaN / +-Inf staged values (added to)
  // Top-k repack (field names shared with the library's kernels).
  const void* ids = nullptr;      ///< [T, K] int32 or int64 (kFlagIdsI64)
  const void* w = nullptr;        ///< [T, K] fp32, bf16 or fp16 (kFlagWBF16, kFlagWF16)
  const uint8_t* pad = nullptr;   ///< optional [T] padding mask, nonzero = padded
  int64_t* idx_out = nullptr;     ///< [M, K] int64
  float* w_out = nullptr;         ///< [M, K] fp32
  int64_t ids_s0 = 0, ids_s1 = 0, w_s0 = 0, w_s1 = 0, pad_s0 = 0, io_s0 = 0, io_s1 = 0, wo_s0 = 0, wo_s1 = 0;
  uint32_t flags = 0;             ///< kFlag* above
  float alpha = 1.0f;             ///< routed scaling factor (kFlagAlpha)
  const float* escale = nullptr;  ///< per-expert scales (kFlagExpertScales)
  int64_t es_s0 = 0, n_experts = 0;
  bool full_buffer = false;       ///< rows T..M-1 of the top-k outputs are a tail to mark empty
};

/// @brief Check @p args as prepare_inputs does and return its outputs as a StageTarget.
/// hidden_states describes the rows the producer stages (shape [T, H], dtype, device); its
/// data pointer is never read and may be null. Every format but NVFP4 online (whose global
/// scale is a reduction over the whole tensor: a producer stages NVFP4 static with a global
/// scale of its own) and every staging option apply.
/// @throws megamoe::Error on an invalid argument, and with kUnsupported for NVFP4 online and
/// for an output whose data pointer is off its element size (the stores are typed).
StageTarget stage_target(const StageArgs& args);

}  // namespace device
}  // namespace megamoe
