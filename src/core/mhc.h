// mhc.h: the rounding points of mHC pre (docs/CONTRACT.md "mHC pre and stage"), the one
// copy of the math, shared bit for bit by the CPU backend and a kernel. The peers (vLLM's
// mhc_pre_torch / tilelang kernels, DeepSeek's TileKernels reference) sum in their GEMM's
// or block reduction's order and call expf / rsqrtf, which differ between libraries and
// devices; here every step is an IEEE fp32 operation rounded to nearest even, in an order
// fixed by the contract, and exp is correctly rounded (the router's exp_f32, computed in
// double with explicit operations), so any backend gives the same bits. Per token, with
// x_k (k < K = hc H) its streams side by side:
//   S   = sum of fl(x_k^2), d_m = sum of fl(x_k fn[m][k])   (16-element chunks, halves folded)
//   r   = fl(1 / sqrt_rn(fl(fl(S / K) + rms_eps)));  mix_m = fl(d_m r)
//   a_m = fl(fl(mix_m scale[g(m)]) + base[m])
//   pre_j  = fl(sigmoid_c(a_j) + pre_eps);  post_j = fl(sigmoid_c(a_hc+j) post_mult)
//   comb   = Sinkhorn(a_2hc+...) (row softmax + eps, then column / row normalizations)
//   u_h    = fl(...fl(fl(q_0 x_0h) + fl(q_1 x_1h)) ... + fl(q_hc-1 x_hc-1,h)),  z_h = bf16(u_h)
// then RMSNorm of z with the layer's weight (core/rmsnorm.h), y.
#pragma once

#include <cstdint>

#include "core/numerics.h"
#include "core/rmsnorm.h"
#include "core/router.h"

namespace megamoe {
namespace core {

constexpr int kMhcMaxStreams = 16;                                      ///< hc_mult at most
constexpr int kMhcMaxMixes = kMhcMaxStreams * (kMhcMaxStreams + 2);     ///< hc (hc + 2) at most

/// Number of mixes of hc streams: hc pre gates, hc post gates, hc x hc comb logits.
MEGAMOE_HD int mhc_mixes(int hc) { return hc * (hc + 2); }

/// A NaN becomes 0x7FC00000 (hardware NaN payloads and signs differ between the host and a
/// GPU; the fp32 outputs' bytes do not).
MEGAMOE_HD float canonical_nan(float f) { return f != f ? quiet_nan() : f; }

/// Dot product of one chunk of kNormChunk values, in order: fl(...fl(fl(a0 b0) + fl(a1 b1)) ...).
MEGAMOE_HD float chunk_dot(const float* a, const float* b) {
  float acc = mul_rn(a[0], b[0]);
  MEGAMOE_UNROLL
  for (int i = 1; i < kNormChunk; ++i) acc = add_rn(acc, mul_rn(a[i], b[i]));
  return acc;
}

/// sigmoid_c(x) = fl(1 / fl(1 + exp_c(-x))): PyTorch's form, with exp_c the correctly
/// rounded e^x (core/router.h exp_f32: the same bits on the host and a GPU).
MEGAMOE_HD float exp_c(float x) { return exp_f32(x); }
MEGAMOE_HD float sigmoid_c(float x) { return div_rn(1.0f, add_rn(1.0f, exp_c(-x))); }

/// The scalar parameters of mHC pre.
struct MhcParams {
  float rms_eps;        ///< epsilon of the mixes' RMS over the hc H values
  float pre_eps;        ///< added to the pre gates
  float sinkhorn_eps;   ///< Sinkhorn's epsilon (added after the softmax and to every divisor)
  float post_mult;      ///< the post gates' multiplier
  int64_t repeat;       ///< Sinkhorn iterations (>= 1)
};

/// The per-token coefficients: pre and post gates [hc], comb [hc][hc] row-major.
struct MhcCoeffs {
  float pre[kMhcMaxStreams];
  float post[kMhcMaxStreams];
  float comb[kMhcMaxStreams * kMhcMaxStreams];
};

/// Maximum of n values in index order that propagates NaN: m = v0, then m = v_k when
/// v_k > m or v_k is NaN (once m is NaN it stays NaN).
MEGAMOE_HD float max_nan(const float* v, int n, int stride) {
  float m = v[0];
  for (int k = 1; k < n; ++k) {
    const float e = v[k * stride];
    if (e > m || e != e) m = e;
  }
  return m;
}

/// Sum of n values in index order from the first: fl(...fl(v0 + v1) ... + v_n-1).
MEGAMOE_HD float seq_sum(const float* v, int n, int stride) {
  float s = v[0];
  for (int k = 1; k < n; ++k) s = add_rn(s, v[k * stride]);
  return s;
}

/// Sinkhorn on c [hc][hc] in place (vLLM's order): per row j, m_j = max_nan, e = exp_c(fl(c -
/// m_j)), s_j = seq_sum(e), c = fl(fl(e / s_j) + eps); then columns c = fl(c / fl(t_k + eps))
/// (t_k = seq_sum of column k); then repeat - 1 times: rows c = fl(c / fl(s_j + eps)),
/// columns likewise.
MEGAMOE_HD void sinkhorn(float* c, int hc, float eps, int64_t repeat) {
  for (int j = 0; j < hc; ++j) {
    float* row = c + j * hc;
    const float m = max_nan(row, hc, 1);
    for (int k = 0; k < hc; ++k) row[k] = exp_c(add_rn(row[k], -m));
    const float s = seq_sum(row, hc, 1);
    for (int k = 0; k < hc; ++k) row[k] = add_rn(div_rn(row[k], s), eps);
  }
  for (int64_t it = 0; it < repeat; ++it) {
    if (it > 0) {
      for (int j = 0; j < hc; ++j) {
        float* row = c + j * hc;
        const float d = add_rn(seq_sum(row, hc, 1), eps);
        for (int k = 0; k < hc; ++k) row[k] = div_rn(row[k], d);
      }
    }
    for (int k = 0; k < hc; ++k) {
      const float d = add_rn(seq_sum(c + k, hc, hc), eps);
      for (int j = 0; j < hc; ++j) c[j * hc + k] = div_rn(c[j * hc + k], d);
    }
  }
}

/// The coefficients from the token's folded sums: S (of squares) and d[m] (the mix dot
/// products, m < hc (hc + 2)), K = hc H <= 2^24 (exact as an fp32). scale: the three
/// scales (pre, post, comb); base: the hc (hc + 2) biases.
MEGAMOE_HD void mhc_coefficients(float S, const float* d, int64_t K, int hc, const float* scale, const float* base,
                                 const MhcParams& prm, MhcCoeffs& out) {
  const float r = norm_scale(S, K, prm.rms_eps);
  auto logit = [&](int m, int g) { return add_rn(mul_rn(mul_rn(d[m], r), scale[g]), base[m]); };
  for (int j = 0; j < hc; ++j) {
    out.pre[j] = add_rn(sigmoid_c(logit(j, 0)), prm.pre_eps);
    out.post[j] = mul_rn(sigmoid_c(logit(hc + j, 1)), prm.post_mult);
  }
  for (int i = 0; i < hc * hc; ++i) out.comb[i] = logit(2 * hc + i, 2);
  sinkhorn(out.comb, hc, prm.sinkhorn_eps, prm.repeat);
}

/// One column of the weighted sum: fl(...fl(fl(q0 x0) + fl(q1 x1)) ... + fl(q_hc-1 x_hc-1)),
/// from the first product (no +0 start: a -0 stays -0).
MEGAMOE_HD float mhc_mix(const float* q, const float* x, int hc) {
  float u = mul_rn(q[0], x[0]);
  for (int j = 1; j < hc; ++j) u = add_rn(u, mul_rn(q[j], x[j]));
  return u;
}

}  // namespace core
}  // namespace megamoe
