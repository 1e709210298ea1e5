// stage_check.h: what megamoe-stage measures about one staging result: the outputs as
// staged, and the quantization quality after dequantizing. The bitwise comparison with the
// independent reference is reference_check.h's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megamoe/quant.h"
#include "stage_inputs.h"

namespace megamoe_cli {

/// The staging outputs, as written to --output.
struct StageOutputs {
  Tensor x_fp8;             ///< F8_E4M3 [T, H] (F8_E5M2 for MXFP8 e5m2)
  Tensor x_sf;              ///< I32 [T, H/(4G)] (UE8M0) or F32 [T, H/G]
  Tensor topk_idx_out;      ///< I64 [T, K]
  Tensor topk_weights_out;  ///< F32 [T, K]
  std::optional<Tensor> shared_x_sf;  ///< I32 [R, H/(4G)] with --shared-block-m
  int64_t shared_block_m = 0;
  // How they were staged: the checks below read the format from here (their G / ue8m0
  // arguments are this scheme's), so every caller checks every format the same way.
  megamoe::QuantScheme scheme;       ///< x_fp8 is U8 [rows, H/2] packed e2m1 for the fp4 schemes
  std::optional<Tensor> x_scales;    ///< F32 [rows] (NVFP4 per-token)
  float global_scale = 1.0f;         ///< gs, the [1] global_scale input (NVFP4 static)
  int64_t full_buffer_rows = 0;      ///< M > 0: full-buffer mode, every output has M rows
  std::optional<float> routed_scaling_factor;
};

/// What make_outputs writes to the x outputs' full-buffer rows T..M-1 (staging must leave
/// them so).
constexpr uint8_t kUntouchedByte = 0x5A;

/// fp8 formats: relative errors count only elements with |x| above this fraction of their
/// group's amax. Any scale these formats pick puts such elements in the element codec's
/// normal range, so their relative error is at most 2^-4 for e4m3 and 2^-3 for e5m2 (unless
/// amax is below the amax floor).
constexpr double kRelErrFloor = 1e-3;

/// fp4 formats: relative errors count only elements with |x| at least this many times their
/// group's dequantized scale, i.e. at least e2m1's smallest nonzero magnitude (code 1 = 0.5)
/// in that group. Smaller elements round to 0 or to that magnitude, a relative error of up to
/// 1 whatever the encoder does; they count in the SNR only. The elements counted have a
/// relative error of about 1/3 at most (at 0.75 times the scale, between the codes 0.5 and 1),
/// unless the scale is too small for the group's amax (an NVFP4 e4m3 scale in or below
/// e4m3's subnormal range), which then shows.
constexpr double kFp4RelErrStep = 0.5;

/// Quality of x_fp8 * scale against the input.
struct Quality {
  double snr_db = 0;       ///< 10*log10(sum x^2 / sum (x - deq)^2); +inf when exact; NaN when no finite x
  /// max |x - deq| / |x| over finite x with |x| > kRelErrFloor * group amax (fp8) or
  /// |x| >= kFp4RelErrStep * group scale (fp4; also every nonzero x of a group whose scale
  /// is not finite, whose error is infinite)
  double max_rel_err = 0;
  int64_t rel_err_elements = 0;  ///< elements max_rel_err is taken over
  bool fp4_rule = false;         ///< max_rel_err follows the fp4 rule above
  int64_t finite = 0;            ///< elements counted in the SNR
};

/// hidden_states or topk_weights (BF16/F16/F32) as fp32, exactly.
std::vector<float> to_float(const Tensor& t);

/// Dequantize and measure; @p hidden is to_float(in.hidden_states). Loops over the T * H
/// elements only: no rows are visited when H == 0.
Quality measure_quality(const std::vector<float>& hidden, int64_t T, int64_t H,
                        const StageOutputs& out, int64_t G, bool ue8m0);

}  // namespace megamoe_cli
