// stage_check.cpp: the quality metrics (see stage_check.h).
#include "stage_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dequant.h"

namespace megamoe_cli {

std::vector<float> to_float(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (v.empty()) return v;  // data() may be null: no memcpy from it
  if (t.dtype == "F32") {
    std::memcpy(v.data(), t.data.data(), v.size() * 4);
  } else {
    const bool bf16 = t.dtype == "BF16";
    const uint16_t* p = reinterpret_cast<const uint16_t*>(t.data.data());
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = bf16 ? bf16_value(p[i]) : f16_value(p[i]);
    }
  }
  return v;
}

Quality measure_quality(const std::vector<float>& hidden, int64_t T, int64_t H,
                        const StageOutputs& out, int64_t G, bool ue8m0) {
  (void)ue8m0, (void)G;  // out.scheme's
  Quality q;
  q.fp4_rule = out.scheme.elem == megamoe::QuantElem::kFloat4E2M1;
  double signal = 0, noise = 0;
  const Quantized x{&out.x_fp8, &out.x_sf, out.x_scales ? &*out.x_scales : nullptr, out.global_scale};
  std::vector<double> scales;  // [T, groups]: each group's dequantized scale
  const std::vector<double> deq = dequantize(x, out.scheme, T, H, &scales);
  // bf16 pass-through has no groups: a row is one group of scale 1 (dequantize's).
  const bool bf16 = out.scheme.elem == megamoe::QuantElem::kBFloat16;
  const int64_t gk = bf16 ? H : out.scheme.group_k, groups = gk > 0 ? H / gk : 0;
  // No rows are visited without elements: T may be 2^40 with H == 0.
  const int64_t rows = groups == 0 ? 0 : T;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = t * H + g * gk;
      double amax = 0;
      for (int64_t i = 0; i < gk; ++i) {
        const double x = hidden[base + i];
        if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
      }
      const double scale = scales[static_cast<size_t>(t * groups + g)];
      for (int64_t i = 0; i < gk; ++i) {
        const double x = hidden[base + i];
        if (!std::isfinite(x)) continue;
        // A non-finite dequantized value (a NaN or infinite scale) is an infinite error, not
        // one std::max would drop.
        const double err = x - deq[base + i];
        const double inf = std::numeric_limits<double>::infinity();
        signal += x * x;
        noise += std::isfinite(err) ? err * err : inf;
        ++q.finite;
        const double ax = std::fabs(x);
        const bool counted = q.fp4_rule ? ax > 0 && (!std::isfinite(scale) || ax >= kFp4RelErrStep * scale)
                                        : ax > kRelErrFloor * amax;
        if (counted) {
          q.max_rel_err = std::max(q.max_rel_err, std::isfinite(err) ? std::fabs(err) / ax : inf);
          ++q.rel_err_elements;
        }
      }
    }
  }
  if (q.finite == 0) {
    q.snr_db = std::numeric_limits<double>::quiet_NaN();
  } else {
    q.snr_db = noise == 0 ? std::numeric_limits<double>::infinity() : 10 * std::log10(signal / noise);
  }
  return q;
}

}  // namespace megamoe_cli
