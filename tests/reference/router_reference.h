// router_reference.h: an independent, header-only host reference of SPEC.md's fused
// DeepSeek-V4 router ("Fused router" and "Non-finite detection"), written from the spec
// alone and sharing no code with src/core/router.h. Each rule is formulated a second way:
//  - exp, log1p: the C library's long double functions (x87, 64-bit significand), rounded
//    once to fp32. bench/router_accuracy.cpp shows that for every fp32 input this long
//    double is far enough from an fp32 rounding boundary, so the rounding is the correctly
//    rounded result, which is what the library's own functions return.
//  - sqrt: the double square root rounded to fp32 (double rounding is innocuous for sqrt
//    since 53 >= 2*24 + 2), not the fp32 instruction.
//  - fp32 sums, quotients and products: formed exactly or correctly in double, rounded once
//    (innocuous for the same reason).
//  - selection: a stable sort of all experts by (number before NaN, larger biased score,
//    lower id), the first K taken; no integer keys.
//  - EPLB: p = t*K + k, slot = p mod clamp(replica_count, 1, R), recorded when the physical
//    id is in [0, P), in a plain host array.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "megamoe_reference.h"

namespace megamoe_router_ref {

inline uint32_t bits(float f) { return megamoe_ref::detail::bits_of(f); }
inline float from_bits(uint32_t u) { return megamoe_ref::detail::float_of(u); }
inline float nan_out() { return from_bits(0x7FC00000u); }

/// e^x rounded to fp32 (NaN for NaN).
inline float exp32(float x) { return static_cast<float>(std::exp(static_cast<long double>(x))); }
/// log(1 + y) rounded to fp32 (NaN below -1, -inf at -1).
inline float log1p32(float y) { return static_cast<float>(std::log1p(static_cast<long double>(y))); }
/// sqrt rounded to fp32.
inline float sqrt32(float v) { return static_cast<float>(std::sqrt(static_cast<double>(v))); }

/// s = sqrt(softplus(logit)), softplus(x) = x above 20, else log1p(exp(x)), fp32 steps.
inline float score(float logit) {
  if (std::isnan(logit)) return nan_out();
  const float sp = logit > 20.0f ? logit : log1p32(exp32(logit));
  return sqrt32(sp);
}

inline float add32(float a, float b) { return static_cast<float>(static_cast<double>(a) + static_cast<double>(b)); }
inline float div32(float a, float b) { return static_cast<float>(static_cast<double>(a) / static_cast<double>(b)); }
inline float mul32(float a, float b) { return static_cast<float>(static_cast<double>(a) * static_cast<double>(b)); }

/// One router problem on the host: plain row-major arrays.
struct Problem {
  int64_t T = 0, E = 0, K = 0;
  std::vector<float> logits;          ///< [T, E]
  std::vector<float> bias;            ///< [E] or empty (no bias)
  std::optional<float> alpha;         ///< routed scaling factor; absent: none (no product)
  std::vector<uint8_t> pad;           ///< [T] or empty
  std::vector<int32_t> tid2eid;       ///< [V, K] or empty (no hash)
  std::vector<int64_t> input_ids;     ///< [T] (hash layers)
  int64_t V = 0;
  std::vector<int32_t> l2p;           ///< [E, R] or empty (no EPLB)
  std::vector<int32_t> replicas;      ///< [E]
  int64_t R = 0;
  int64_t P = 0;                      ///< expert_load length
  bool record = false;
};

struct Result {
  std::vector<int64_t> ids;      ///< [T, K] public ids (physical with EPLB), -1 when padded
  std::vector<float> weights;    ///< [T, K]
  std::vector<int64_t> load;     ///< [P] increments
  int64_t nonfinite = 0;         ///< NaN / Inf logits
};

inline Result route(const Problem& p) {
  Result out;
  out.ids.assign(static_cast<size_t>(p.T * p.K), -1);
  out.weights.assign(static_cast<size_t>(p.T * p.K), 0.0f);
  out.load.assign(static_cast<size_t>(p.P), 0);
  for (float v : p.logits) out.nonfinite += std::isfinite(v) ? 0 : 1;
  const bool hash = !p.tid2eid.empty();
  for (int64_t t = 0; t < p.T; ++t) {
    if (!p.pad.empty() && p.pad[static_cast<size_t>(t)] != 0) continue;
    const float* row = p.logits.data() + t * p.E;
    std::vector<int64_t> chosen(static_cast<size_t>(p.K), -1);
    if (hash) {
      const int64_t r = p.input_ids[static_cast<size_t>(t)];
      if (r < 0 || r >= p.V) continue;  // an invalid token id: the token behaves as padded
      for (int64_t k = 0; k < p.K; ++k) {
        const int64_t e = p.tid2eid[static_cast<size_t>(r * p.K + k)];
        chosen[static_cast<size_t>(k)] = e >= 0 && e < p.E ? e : -1;
      }
    } else {
      std::vector<double> b(static_cast<size_t>(p.E));
      for (int64_t e = 0; e < p.E; ++e) {
        const float s = score(row[e]);
        b[static_cast<size_t>(e)] = p.bias.empty() ? s : add32(s, p.bias[static_cast<size_t>(e)]);
      }
      std::vector<int64_t> order(static_cast<size_t>(p.E));
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) {
        const double x = b[static_cast<size_t>(a)], y = b[static_cast<size_t>(c)];
        if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
        return x > y;  // equal (including -0 == +0): stable, so the lower id stays first
      });
      std::copy(order.begin(), order.begin() + p.K, chosen.begin());
    }
    float sum = 0.0f;
    for (int64_t e : chosen) {
      if (e >= 0) sum = add32(sum, score(row[e]));
    }
    const float d = std::isnan(sum) ? sum : std::max(sum, 1e-20f);
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t e = chosen[static_cast<size_t>(k)];
      if (e < 0) continue;
      const float q = div32(score(row[e]), d);
      const float w = p.alpha ? mul32(q, *p.alpha) : q;
      out.weights[static_cast<size_t>(t * p.K + k)] = std::isnan(w) ? nan_out() : w;
      int64_t id = e;
      if (!p.l2p.empty()) {
        const int64_t c = std::min<int64_t>(std::max<int64_t>(p.replicas[static_cast<size_t>(e)], 1), p.R);
        id = p.l2p[static_cast<size_t>(e * p.R + (t * p.K + k) % c)];
        if (p.record && id >= 0 && id < p.P) ++out.load[static_cast<size_t>(id)];
      }
      out.ids[static_cast<size_t>(t * p.K + k)] = id;
    }
  }
  return out;
}

}  // namespace megamoe_router_ref
