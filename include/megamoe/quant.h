/// @file quant.h
/// @brief Quantization schemes of the hidden states: an element codec, a scale codec, a
/// group size, an amax floor, a tie rule and an optional second-level scale.
///
/// Staging accepts exactly these families (docs/CONTRACT.md "Activation formats"):
///  - **fp8** (e4m3fn elements): UE8M0 scales (packed four per int32) or fp32 scales,
///    groups of 1 x G along H with G dividing 128 (UE8M0: H/G a multiple of 4), ties to
///    nearest even. Presets mxfp8() (the default), fp8_ue8m0_g128(), fp8_fp32_g128()
///    (Hopper / DeepGEMM SM90), fp8_fp32_g32().
///  - **MXFP8 e5m2** (e5m2 elements, max 57344): UE8M0 scales, G = 32, ties to nearest
///    even. Preset mxfp8_e5m2() (FlashInfer's mxfp8_e5m2).
///  - **MXFP4** (e2m1 elements, two per byte): UE8M0 scales, G = 32, ties toward zero
///    (DeepGEMM's per_token_cast_to_fp4, the default) or to nearest even (PTX
///    cvt.rn.satfinite.e2m1x2). Preset mxfp4().
///  - **NVFP4** (e2m1 elements, ties toward zero): e4m3 scales packed four per int32,
///    G = 16, with a second-level scale that is either static (a device fp32 scalar the
///    caller passes: StageArgs::global_scale) or computed per token (an extra output
///    StageArgs::x_scales). Presets nvfp4_static(), nvfp4_per_token().
///  - **bf16 pass-through** (FlashInfer's Bf16InputStage; DeepGEMM's NVFP4 shared experts
///    read bf16): x_q is [T, H] bf16, no scales (x_sf empty or absent, group_k 0). bf16
///    input is copied bit for bit; fp16 and fp32 round to nearest even, every NaN to 0x7FC0
///    (c10::BFloat16's scalar rule). Reads no floor. Preset bf16().
///  - **NVFP4 online**: NVFP4 static's groups under a global scale the call computes from
///    the whole tensor, gs = fl(max(amax, floor) / 2688) (amax: the NaN-ignoring max |x|
///    over all T x H elements; floor 0: gs = 1 where amax < 2^-100) and writes to
///    StageArgs::global_scale, an output here. Preset nvfp4_online().
/// Every family takes an amax floor (1e-4 by default; 1e-10 for DeepGEMM's SM90 MegaMoE
/// pre-dispatch and SGLang's kernels; 0 for FlashInfer's SM90 rule, a zero group's unit
/// scale): with_amax_floor(). The numeric recipe of each is in
/// src/formats/ (one folder per family; formats/format_list.h the registry) and
/// docs/CONTRACT.md.
#pragma once

#include <cstdint>
#include <string>

namespace megamoe {

/// @brief Type (codec) of the per-group scale factor.
enum class ScaleType : uint8_t {
  kUE8M0,       ///< unsigned 8-bit power-of-two exponent (E8M0), packed 4 per int32
  kFloat32,     ///< plain fp32 scale
  kFloat16,     ///< fp16 scale (not accepted; exists so it can be rejected by name)
  kFloat8E4M3,  ///< fp8 e4m3 scale byte, packed 4 per int32 (NVFP4)
  kNone,        ///< no scales (bf16 pass-through: x_sf is empty)
};

/// @brief Element type (codec) of the quantized values.
enum class QuantElem : uint8_t {
  kFloat8E4M3,  ///< fp8 e4m3fn, one byte per value
  kFloat8E5M2,  ///< fp8 e5m2, one byte per value (MXFP8 e5m2)
  kInt8,        ///< int8 (rejected)
  kFloat4E2M1,  ///< fp4 e2m1, two values per byte (low nibble = even column)
  kBFloat16,    ///< bf16, two bytes per value, no scales (bf16 pass-through)
};

/// @brief How a value exactly between two representable ones is rounded.
enum class Rounding : uint8_t {
  kDefault,         ///< the element codec's reference rule: e4m3 nearest even, e2m1 toward zero
  kNearestEven,     ///< to the neighbour with the even code (IEEE, PTX cvt.rn)
  kTiesTowardZero,  ///< to the neighbour of smaller magnitude (DeepGEMM's fp4 reference)
};

/// @brief The second-level scale of a scheme.
enum class Scale2 : uint8_t {
  kNone,      ///< none (fp8, MXFP4)
  kStatic,    ///< a caller-given device fp32 scalar (NVFP4 static: StageArgs::global_scale)
  kPerToken,  ///< one fp32 per token, computed and written to StageArgs::x_scales
  kOnline,    ///< one fp32 for the tensor, computed and written to StageArgs::global_scale
};

/// @brief A quantization scheme, shaped like vLLM's QuantKey plus what FP4 needs.
struct QuantScheme {
  QuantElem elem = QuantElem::kFloat8E4M3;  ///< quantized element type
  ScaleType scale = ScaleType::kUE8M0;      ///< scale type
  int64_t group_m = 1;                      ///< group rows (1 = per token)
  int64_t group_k = 32;  ///< group columns G along H; <= 0 means per-tensor/per-token
  bool is_static = false;                   ///< static (precomputed) group scales
  bool symmetric = true;                    ///< symmetric (no zero point)
  Scale2 scale2 = Scale2::kNone;            ///< second-level scale
  Rounding rounding = Rounding::kDefault;   ///< tie rule of the element encoding
  float amax_floor = 1e-4f;                 ///< lower bound of a group's amax (0: the unit scale)

  /// @brief fp8 e4m3 + UE8M0 scales, G = 32 (MXFP8; the default).
  static constexpr QuantScheme mxfp8() noexcept { return QuantScheme{}; }
  /// @brief fp8 e4m3 + UE8M0 scales, G = 128.
  static constexpr QuantScheme fp8_ue8m0_g128() noexcept { return fp8(ScaleType::kUE8M0, 128); }
  /// @brief fp8 e4m3 + fp32 scales, G = 128 (Hopper / DeepGEMM SM90).
  static constexpr QuantScheme fp8_fp32_g128() noexcept { return fp8(ScaleType::kFloat32, 128); }
  /// @brief fp8 e4m3 + fp32 scales, G = 32.
  static constexpr QuantScheme fp8_fp32_g32() noexcept { return fp8(ScaleType::kFloat32, 32); }
  /// @brief fp8 e5m2 + UE8M0 scales, G = 32 (FlashInfer's mxfp8_e5m2: scale from amax / 57344).
  static constexpr QuantScheme mxfp8_e5m2() noexcept { return QuantScheme{QuantElem::kFloat8E5M2, ScaleType::kUE8M0, 1, 32}; }
  /// @brief fp4 e2m1 + UE8M0 scales, G = 32 (MXFP4); ties toward zero unless @p r says otherwise.
  static constexpr QuantScheme mxfp4(Rounding r = Rounding::kTiesTowardZero) noexcept {
    QuantScheme q{QuantElem::kFloat4E2M1, ScaleType::kUE8M0, 1, 32};
    q.rounding = r;
    return q;
  }
  /// @brief bf16 pass-through: x_q is the input as bf16, no scales (scale kNone, group_k 0).
  static constexpr QuantScheme bf16() noexcept {
    return QuantScheme{QuantElem::kBFloat16, ScaleType::kNone, 1, 0};
  }
  /// @brief NVFP4 with a static global scale (DeepGEMM's fp4xfp4 MegaMoE buffers).
  static constexpr QuantScheme nvfp4_static() noexcept { return nvfp4(Scale2::kStatic); }
  /// @brief NVFP4 with a per-token second-level scale (SGLang's nvfp4xnvfp4 pre-dispatch).
  static constexpr QuantScheme nvfp4_per_token() noexcept { return nvfp4(Scale2::kPerToken); }
  /// @brief NVFP4 with a global scale computed from the whole tensor (amax / 2688) and
  /// written to StageArgs::global_scale, then NVFP4 static's groups under it.
  static constexpr QuantScheme nvfp4_online() noexcept { return nvfp4(Scale2::kOnline); }

  /// @brief This scheme with another amax floor (e.g. 1e-10f for the SM90 pre-dispatch).
  constexpr QuantScheme with_amax_floor(float floor) const noexcept {
    QuantScheme q = *this;
    q.amax_floor = floor;
    return q;
  }
  /// @brief True for UE8M0 scales.
  constexpr bool ue8m0() const noexcept { return scale == ScaleType::kUE8M0; }
  bool operator==(const QuantScheme& o) const noexcept;
  bool operator!=(const QuantScheme& o) const noexcept { return !(*this == o); }

 private:
  static constexpr QuantScheme fp8(ScaleType s, int64_t g) noexcept {
    return QuantScheme{QuantElem::kFloat8E4M3, s, 1, g};
  }
  static constexpr QuantScheme nvfp4(Scale2 s2) noexcept {
    QuantScheme q{QuantElem::kFloat4E2M1, ScaleType::kFloat8E4M3, 1, 16};
    q.scale2 = s2;
    q.rounding = Rounding::kTiesTowardZero;
    return q;
  }
};

/// @brief Human-readable description, e.g. "QuantScheme(fp8_e4m3fn, scale=ue8m0,
/// group=1x32, dynamic, symmetric)" (scale2, rounding and amax_floor named when not the
/// default); used in error messages.
std::string to_string(const QuantScheme& q);

/// @brief Short name of an accepted scheme ("mxfp8", "fp8_fp32_g128", "mxfp4",
/// "mxfp4_rne", "nvfp4_static", "nvfp4_per_token", "nvfp4_online", ...; "+floor=<the floor, 9 digits>",
/// e.g. "+floor=1.00000001e-10", when the floor is not the default and the format uses
/// one: NVFP4 static has none), or "unsupported".
std::string scheme_name(const QuantScheme& q);

/// @brief Throw megamoe::Error naming @p q unless staging accepts it (see file comment).
void check_scheme(const QuantScheme& q);

}  // namespace megamoe
