// mhc_reference.h: an independent host reference of mhc_pre_and_stage's mHC pre step
// (docs/CONTRACT.md "mHC pre and stage"), written from the contract's text without the
// library's headers:
//  - every fp32 operation (+, *, /, sqrt) is formed in double and rounded once to float
//    (innocuous double rounding for these on two floats: 53 >= 2*24 + 2);
//  - e^x is std::exp in long double rounded to float (the contract's exp is correctly
//    rounded);
//  - the long sums (of squares, the mix dot products) are sequential 16-term chunk sums
//    combined by norm_reference.h's even/odd recursive tree (the contract states the same
//    tree as folds of halves, highest first);
//  - the bf16 rounding of the weighted sum and the whole RMSNorm are norm_reference.h's.
// A second rendering, peer(), is vLLM's mhc_pre_torch followed by the layer's rms_norm in
// float64 throughout (no fixed order: plain sums), used to bound how far the contract's
// fp32 results are from the peer's mathematics.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "norm_reference.h"

namespace megamoe_ref {
namespace mhc {

using norm::add;
using norm::mul;
inline float sub(float a, float b) { return static_cast<float>(static_cast<double>(a) - static_cast<double>(b)); }
inline float quot(float a, float b) { return static_cast<float>(static_cast<double>(a) / static_cast<double>(b)); }
inline float expf_cr(float x) { return static_cast<float>(std::exp(static_cast<long double>(x))); }
inline float sigmoid(float x) { return quot(1.0f, add(1.0f, expf_cr(-x))); }
inline float nan_out() { return detail::float_of(0x7FC00000u); }
inline float out(float v) { return std::isnan(v) ? nan_out() : v; }

/// The scalar parameters.
struct Params {
  float rms_eps = 1e-6f, pre_eps = 1e-6f, sinkhorn_eps = 1e-6f, post_mult = 2.0f;
  int repeat = 20;
  float norm_eps = 1e-6f;
};

/// One token's results (fp32 outputs with NaN as 0x7FC00000, bf16 bits for z and y).
struct Token {
  std::vector<float> pre, post, comb;
  std::vector<uint16_t> z, y;
};

/// The contract's long sum of @p terms (a multiple of 16 of them).
inline float long_sum(const std::vector<float>& terms) {
  const size_t n = terms.size() / 16;
  size_t N = 1;
  while (N < n) N *= 2;
  std::vector<float> c(N, 0.0f);
  for (size_t k = 0; k < n; ++k) {
    float acc = terms[16 * k];
    for (size_t i = 1; i < 16; ++i) acc = add(acc, terms[16 * k + i]);
    c[k] = acc;
  }
  return norm::tree(c, 0, 1, N);
}

/// Divide row j (along k) or column k (along j) of the hc x hc matrix @p c by its sum plus
/// eps, the sum taken in index order from the first element.
inline void normalize(std::vector<float>& c, int hc, bool rows, float eps) {
  for (int a = 0; a < hc; ++a) {
    auto at = [&](int b) -> float& { return rows ? c[static_cast<size_t>(a * hc + b)] : c[static_cast<size_t>(b * hc + a)]; };
    float s = at(0);
    for (int b = 1; b < hc; ++b) s = add(s, at(b));
    const float d = add(s, eps);
    for (int b = 0; b < hc; ++b) at(b) = quot(at(b), d);
  }
}

/// @param x   the token's hc * H streams side by side, bf16 bits
/// @param fn  [hc (hc + 2)][hc H] dense; @param base [hc (hc + 2)]; @param pre_in null or [hc]
/// @param w   the norm weight as floats [H]
inline Token token(const uint16_t* x, int hc, size_t H, const std::vector<float>& fn, const float* scale,
                   const std::vector<float>& base, const float* pre_in, const std::vector<float>& w, const Params& p) {
  const size_t K = static_cast<size_t>(hc) * H;
  const int M = hc * (hc + 2);
  std::vector<float> xf(K), terms(K);
  for (size_t k = 0; k < K; ++k) xf[k] = norm::bf16_value(x[k]);
  for (size_t k = 0; k < K; ++k) terms[k] = mul(xf[k], xf[k]);
  const float S = long_sum(terms);
  const float r = quot(1.0f, static_cast<float>(std::sqrt(static_cast<double>(add(quot(S, static_cast<float>(K)), p.rms_eps)))));
  std::vector<float> a(static_cast<size_t>(M));
  for (int m = 0; m < M; ++m) {
    for (size_t k = 0; k < K; ++k) terms[k] = mul(xf[k], fn[static_cast<size_t>(m) * K + k]);
    const float g = scale[m < hc ? 0 : m < 2 * hc ? 1 : 2];
    a[static_cast<size_t>(m)] = add(mul(mul(long_sum(terms), r), g), base[static_cast<size_t>(m)]);
  }
  Token t;
  for (int j = 0; j < hc; ++j) {
    t.pre.push_back(add(sigmoid(a[static_cast<size_t>(j)]), p.pre_eps));
    t.post.push_back(mul(sigmoid(a[static_cast<size_t>(hc + j)]), p.post_mult));
  }
  std::vector<float> c(a.begin() + 2 * hc, a.end());
  for (int j = 0; j < hc; ++j) {  // softmax along the row, then + eps
    float mx = c[static_cast<size_t>(j * hc)];
    for (int k = 1; k < hc; ++k) {
      const float v = c[static_cast<size_t>(j * hc + k)];
      if (std::isnan(v) || (!std::isnan(mx) && v > mx)) mx = v;
    }
    float s = 0.0f;
    for (int k = 0; k < hc; ++k) {
      float& v = c[static_cast<size_t>(j * hc + k)];
      v = expf_cr(sub(v, mx));
      s = k == 0 ? v : add(s, v);
    }
    for (int k = 0; k < hc; ++k) {
      float& v = c[static_cast<size_t>(j * hc + k)];
      v = add(quot(v, s), p.sinkhorn_eps);
    }
  }
  normalize(c, hc, false, p.sinkhorn_eps);
  for (int i = 1; i < p.repeat; ++i) {
    normalize(c, hc, true, p.sinkhorn_eps);
    normalize(c, hc, false, p.sinkhorn_eps);
  }
  t.comb = c;
  const float* q = pre_in != nullptr ? pre_in : t.pre.data();
  t.z.resize(H);
  for (size_t h = 0; h < H; ++h) {
    float u = mul(q[0], xf[h]);
    for (int j = 1; j < hc; ++j) u = add(u, mul(q[j], xf[static_cast<size_t>(j) * H + h]));
    t.z[h] = norm::to_bf16(u);
  }
  t.y = norm::row(t.z.data(), nullptr, w, p.norm_eps).y;
  for (auto* v : {&t.pre, &t.post, &t.comb})
    for (float& e : *v) e = out(e);
  return t;
}

/// The peer's mathematics in float64 (vLLM's mhc_pre_torch, then rms_norm with the layer's
/// weight): z and y are rounded to bf16 where the peer rounds (its layer_input, then its
/// (x * s) before the weight, then the product).
struct PeerToken {
  std::vector<double> pre, post, comb;
  std::vector<uint16_t> z, y;
};

inline uint16_t bf16_of_double(double v) { return norm::to_bf16(static_cast<float>(v)); }

inline PeerToken peer(const uint16_t* x, int hc, size_t H, const std::vector<float>& fn, const float* scale,
                      const std::vector<float>& base, const std::vector<float>& w, const Params& p) {
  const size_t K = static_cast<size_t>(hc) * H;
  const int M = hc * (hc + 2);
  std::vector<double> xd(K);
  double sq = 0.0;
  for (size_t k = 0; k < K; ++k) {
    xd[k] = norm::bf16_value(x[k]);
    sq += xd[k] * xd[k];
  }
  const double r = 1.0 / std::sqrt(sq / static_cast<double>(K) + p.rms_eps);
  std::vector<double> a(static_cast<size_t>(M));
  for (int m = 0; m < M; ++m) {
    double d = 0.0;
    for (size_t k = 0; k < K; ++k) d += xd[k] * fn[static_cast<size_t>(m) * K + k];
    a[static_cast<size_t>(m)] = d * r * scale[m < hc ? 0 : m < 2 * hc ? 1 : 2] + base[static_cast<size_t>(m)];
  }
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  PeerToken t;
  for (int j = 0; j < hc; ++j) {
    t.pre.push_back(sig(a[static_cast<size_t>(j)]) + p.pre_eps);
    t.post.push_back(sig(a[static_cast<size_t>(hc + j)]) * p.post_mult);
  }
  std::vector<double> c(a.begin() + 2 * hc, a.end());
  auto rows = [&](bool softmax) {
    for (int j = 0; j < hc; ++j) {
      double mx = -INFINITY, s = 0.0;
      for (int k = 0; k < hc; ++k) mx = std::max(mx, c[static_cast<size_t>(j * hc + k)]);
      for (int k = 0; k < hc; ++k) {
        double& v = c[static_cast<size_t>(j * hc + k)];
        if (softmax) v = std::exp(v - mx);
        s += v;
      }
      for (int k = 0; k < hc; ++k) {
        double& v = c[static_cast<size_t>(j * hc + k)];
        v = softmax ? v / s + p.sinkhorn_eps : v / (s + p.sinkhorn_eps);
      }
    }
  };
  auto cols = [&] {
    for (int k = 0; k < hc; ++k) {
      double s = 0.0;
      for (int j = 0; j < hc; ++j) s += c[static_cast<size_t>(j * hc + k)];
      for (int j = 0; j < hc; ++j) c[static_cast<size_t>(j * hc + k)] /= s + p.sinkhorn_eps;
    }
  };
  rows(true);
  cols();
  for (int i = 1; i < p.repeat; ++i) {
    rows(false);
    cols();
  }
  t.comb = c;
  t.z.resize(H);
  std::vector<double> zd(H);
  double zs = 0.0;
  for (size_t h = 0; h < H; ++h) {
    double u = 0.0;
    for (int j = 0; j < hc; ++j) u += t.pre[static_cast<size_t>(j)] * xd[static_cast<size_t>(j) * H + h];
    t.z[h] = bf16_of_double(u);
    zd[h] = norm::bf16_value(t.z[h]);
    zs += zd[h] * zd[h];
  }
  const double s = 1.0 / std::sqrt(zs / static_cast<double>(H) + p.norm_eps);
  t.y.resize(H);
  for (size_t h = 0; h < H; ++h) t.y[h] = bf16_of_double(norm::bf16_value(bf16_of_double(zd[h] * s)) * static_cast<double>(w[h]));
  return t;
}

}  // namespace mhc
}  // namespace megamoe_ref
