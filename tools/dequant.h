// dequant.h: the staged values back as numbers (docs/CONTRACT.md "Per group"), for every
// format megamoe-stage runs, and the 16-bit inputs as fp32; the quality report (SNR,
// relative error) is computed from them.
#pragma once

#include <cstdint>
#include <vector>

#include "megamoe/quant.h"
#include "safetensors.h"

namespace megamoe_cli {

/// One format's outputs as the dequantizer reads them (rows beyond T are ignored).
struct Quantized {
  const Tensor* x_q = nullptr;       ///< [>= T, H] e4m3 / e5m2 bytes or [>= T, H/2] packed e2m1 bytes
  const Tensor* x_sf = nullptr;      ///< packed UE8M0 / e4m3 words, or fp32 scales
  const Tensor* x_scales = nullptr;  ///< [>= T] fp32 per-token scales (NVFP4 per-token)
  float global_scale = 1.0f;         ///< gs (NVFP4 static)
};

/// bf16 bits -> fp32, exactly (the upper half of an fp32).
float bf16_value(uint16_t b);
/// IEEE binary16 bits -> fp32, exactly; a NaN keeps its sign and payload.
float f16_value(uint16_t h);
/// fp8 e4m3fn byte -> value (0x7F/0xFF are NaN; no infinities).
double e4m3_value(uint8_t b);
/// fp8 e5m2 byte -> value (0x7C/0xFC are +-Inf, 0x7D-0x7F/0xFD-0xFF NaN).
double e5m2_value(uint8_t b);
/// e2m1 nibble (sign << 3 | code) -> value.
double e2m1_value(uint8_t nibble);

/// Row-major [T, H] dequantized values of @p x under @p q: element value times its group's
/// scale (UE8M0 2^(e-127), fp32 s, e4m3 sf * gs, or e4m3 sf * x_scales[t]). With
/// @p group_scales, also those scales, row-major [T, H/G]. Visits no rows when T * H == 0.
std::vector<double> dequantize(const Quantized& x, const megamoe::QuantScheme& q, int64_t T, int64_t H,
                               std::vector<double>* group_scales = nullptr);

}  // namespace megamoe_cli
