/// @file quant.h
/// @brief Quantization schemes for the hidden states.
///
/// A scheme names the element type, the scale type, the group shape (1 x G along the
/// hidden dimension), whether scales are static or dynamic, symmetric or not, and whether
/// a second-level scale exists. Staging accepts exactly:
///   element fp8 e4m3fn, symmetric, dynamic, no second-level scale, groups of 1 x G with
///   G dividing 128, scale type UE8M0 (E8M0) or fp32.
///
/// Scaling formats (per token t, per group g of G consecutive hidden elements):
///  - **UE8M0** (MXFP8 style): scale = 2^(e-127) with e = ceil(log2(max(amax,1e-4)/448)),
///    computed bit-exactly (see src/core/numerics.h). The exponent bytes are packed four to
///    an int32, little-endian in group order: byte j of x_sf[t, w] is the exponent of group
///    4w + j, so x_sf is [T, H/(4G)] int32.
///  - **fp32**: scale = max(amax,1e-4) * (1/448) as fp32; x_sf is [T, H/G] float32
///    (the Hopper / DeepGEMM-SM90 flavour; an MN-major transposed view is fine).
#pragma once

#include <cstdint>
#include <string>

namespace megamoe {

/// @brief Type of the per-group scale factor.
enum class ScaleType : uint8_t {
  kUE8M0,    ///< unsigned 8-bit power-of-two exponent (E8M0), packed 4 per int32
  kFloat32,  ///< plain fp32 scale
  kFloat16,  ///< fp16 scale (not accepted by staging; exists so it can be rejected by name)
};

/// @brief Element type of the quantized values.
enum class QuantElem : uint8_t {
  kFloat8E4M3,  ///< fp8 e4m3fn (accepted)
  kFloat8E5M2,  ///< fp8 e5m2 (rejected)
  kInt8,        ///< int8 (rejected)
  kFloat4E2M1,  ///< fp4 (rejected)
};

/// @brief A quantization scheme, shaped like vLLM's QuantKey.
struct QuantScheme {
  QuantElem elem = QuantElem::kFloat8E4M3;  ///< quantized element type
  ScaleType scale = ScaleType::kUE8M0;      ///< scale type
  int64_t group_m = 1;                      ///< group rows (1 = per token)
  int64_t group_k = 32;  ///< group columns G along H; <= 0 means per-tensor/per-token
  bool is_static = false;                   ///< static (precomputed) scales
  bool symmetric = true;                    ///< symmetric (no zero point)
  bool has_scale2 = false;                  ///< a second-level scale exists

  /// @brief fp8 e4m3 + UE8M0 scales, G = 32 (MXFP8; the default).
  static constexpr QuantScheme mxfp8() noexcept { return QuantScheme{}; }
  /// @brief fp8 e4m3 + UE8M0 scales, G = 128.
  static constexpr QuantScheme fp8_ue8m0_g128() noexcept {
    return QuantScheme{QuantElem::kFloat8E4M3, ScaleType::kUE8M0, 1, 128, false, true, false};
  }
  /// @brief fp8 e4m3 + fp32 scales, G = 128 (Hopper / DeepGEMM SM90).
  static constexpr QuantScheme fp8_fp32_g128() noexcept {
    return QuantScheme{QuantElem::kFloat8E4M3, ScaleType::kFloat32, 1, 128, false, true, false};
  }
  /// @brief fp8 e4m3 + fp32 scales, G = 32.
  static constexpr QuantScheme fp8_fp32_g32() noexcept {
    return QuantScheme{QuantElem::kFloat8E4M3, ScaleType::kFloat32, 1, 32, false, true, false};
  }

  /// @brief True for UE8M0 scales.
  constexpr bool ue8m0() const noexcept { return scale == ScaleType::kUE8M0; }
  bool operator==(const QuantScheme& o) const noexcept;
};

/// @brief Human-readable description, e.g. "QuantScheme(fp8_e4m3, scale=ue8m0, group=1x32,
/// dynamic, symmetric)"; used in error messages.
std::string to_string(const QuantScheme& q);

/// @brief Throw megamoe::Error naming @p q unless staging accepts it (see file comment).
void check_scheme(const QuantScheme& q);

}  // namespace megamoe
