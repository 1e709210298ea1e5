// dequant.cpp: see dequant.h. Written from docs/CONTRACT.md, not from the library's
// encoders, so that a wrong scale layout shows up as a bad SNR rather than cancelling out.
#include "dequant.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace megamoe_cli {

float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16_value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu, bits = 0;
  if (e == 0x1F) {
    bits = 0x7F800000u | m << 13;  // Inf, or NaN with its payload
  } else if (e != 0) {
    bits = (e + 112) << 23 | m << 13;  // exponent bias 15 -> 127
  } else if (m != 0) {
    // Subnormal m * 2^-24: shifted left s places until bit 10 is set, it is
    // 1.f * 2^(-14 - s), an fp32 normal with exponent field 113 - s.
    uint32_t s = 0;
    for (; (m & 0x400u) == 0; ++s) m <<= 1;
    bits = (113 - s) << 23 | (m & 0x3FFu) << 13;
  }
  bits |= sign;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 0xF && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80) ? -v : v;
}

double e5m2_value(uint8_t b) {
  const int e = (b >> 2) & 0x1F, m = b & 3;
  if (e == 0x1F) return m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m, -16) : std::ldexp(4 + m, e - 17);
  return (b & 0x80) ? -v : v;
}

double e2m1_value(uint8_t nibble) {
  static const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double v = grid[nibble & 7];
  return (nibble & 8) ? -v : v;
}

std::vector<double> dequantize(const Quantized& x, const megamoe::QuantScheme& q, int64_t T, int64_t H,
                               std::vector<double>* group_scales) {
  if (q.elem == megamoe::QuantElem::kBFloat16) {  // bf16 pass-through: no scales (one unit scale a row)
    std::vector<double> out(static_cast<size_t>(T * H));
    if (group_scales != nullptr) group_scales->assign(static_cast<size_t>(H > 0 ? T : 0), 1.0);
    const int64_t qcols = x.x_q->shape[1];
    for (int64_t t = 0; t < (H > 0 ? T : 0); ++t) {
      for (int64_t i = 0; i < H; ++i) {
        uint16_t b;
        std::memcpy(&b, x.x_q->data.data() + 2 * (t * qcols + i), 2);
        out[static_cast<size_t>(t * H + i)] = bf16_value(b);
      }
    }
    return out;
  }
  const bool fp4 = q.elem == megamoe::QuantElem::kFloat4E2M1;
  const bool e5m2 = q.elem == megamoe::QuantElem::kFloat8E5M2;
  const bool packed = q.scale != megamoe::ScaleType::kFloat32;  // four scale bytes per word
  const int64_t G = q.group_k, groups = G > 0 ? H / G : 0, qcols = x.x_q->shape[1], scols = x.x_sf->shape[1];
  const uint8_t* xq = x.x_q->data.data();
  // T * H is the element count of hidden_states, which exists in memory (so does T * groups).
  std::vector<double> out(static_cast<size_t>(T * H));
  if (group_scales != nullptr) group_scales->assign(static_cast<size_t>(T * groups), 0.0);
  // Rows are visited only when they have elements: T may be 2^40 with H == 0.
  if (out.empty() || groups == 0) return out;
  for (int64_t t = 0; t < T; ++t) {
    double second = 1.0;  // the second-level scale of NVFP4
    if (q.scale2 == megamoe::Scale2::kStatic || q.scale2 == megamoe::Scale2::kOnline) second = x.global_scale;
    if (q.scale2 == megamoe::Scale2::kPerToken) {
      float pts;
      std::memcpy(&pts, x.x_scales->data.data() + 4 * t, 4);
      second = pts;
    }
    for (int64_t g = 0; g < groups; ++g) {
      double scale;
      if (packed) {
        uint32_t w;
        std::memcpy(&w, x.x_sf->data.data() + 4 * (t * scols + g / 4), 4);
        const uint8_t byte = static_cast<uint8_t>(w >> (8 * (g % 4)));
        scale = q.scale == megamoe::ScaleType::kUE8M0 ? std::ldexp(1.0, byte - 127) : e4m3_value(byte) * second;
      } else {
        float s;
        std::memcpy(&s, x.x_sf->data.data() + 4 * (t * scols + g), 4);
        scale = s;
      }
      if (group_scales != nullptr) (*group_scales)[static_cast<size_t>(t * groups + g)] = scale;
      for (int64_t i = g * G; i < (g + 1) * G; ++i) {
        const double v = fp4 ? e2m1_value(static_cast<uint8_t>(xq[t * qcols + i / 2] >> (4 * (i % 2))))
                             : e5m2 ? e5m2_value(xq[t * qcols + i])
                                    : e4m3_value(xq[t * qcols + i]);
        out[static_cast<size_t>(t * H + i)] = v * scale;
      }
    }
  }
  return out;
}

}  // namespace megamoe_cli
