// reference_check.cpp: the bitwise comparison with the independent reference (see
// reference_check.h); compiled only with MEGAMOE_CLI_REFERENCE.
#include "reference_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "megamoe_reference.h"
#include "norm_reference.h"
#include "router_reference.h"

namespace megamoe_cli {
namespace {

template <typename T>
const T* as(const Tensor& t) {
  return reinterpret_cast<const T*>(t.data.data());
}

/// The reference's description of @p q (docs/CONTRACT.md "Activation formats").
megamoe_ref::Format reference_format(const megamoe::QuantScheme& q, float gs) {
  using megamoe::Scale2;
  if (q.elem == megamoe::QuantElem::kFloat8E4M3) return megamoe_ref::Format::fp8(q.ue8m0(), q.group_k, q.amax_floor);
  if (q.elem == megamoe::QuantElem::kFloat8E5M2) return megamoe_ref::Format::mxfp8_e5m2(q.amax_floor);
  if (q.scale2 == Scale2::kStatic) return megamoe_ref::Format::nvfp4_static(gs);
  if (q.scale2 == Scale2::kPerToken) return megamoe_ref::Format::nvfp4_per_token(q.amax_floor);
  if (q.scale2 == Scale2::kOnline) return megamoe_ref::Format::nvfp4_online(q.amax_floor);
  const bool rne = q.rounding == megamoe::Rounding::kNearestEven;
  return megamoe_ref::Format::mxfp4(rne ? megamoe_ref::Fp4Ties::kNearestEven : megamoe_ref::Fp4Ties::kTowardZero,
                                    q.amax_floor);
}

/// @p ref widened to @p n elements, the rest @p tail: the reference has T rows, the
/// full-buffer outputs M, whose rows T..M-1 hold what was there before (or the tail rule).
template <typename T>
std::vector<T> with_tail(const std::vector<T>& ref, int64_t n, T tail) {
  std::vector<T> v(static_cast<size_t>(n), tail);
  std::copy(ref.begin(), ref.begin() + std::min<int64_t>(n, static_cast<int64_t>(ref.size())), v.begin());
  return v;
}

std::string hex(uint64_t v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, static_cast<unsigned long long>(v));
  return buf;
}

std::string float_text(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s (%.9g)", hex(u, 8).c_str(), static_cast<double>(f));
  return buf;
}

/// Compare @p n row-major elements of width @p cols; record the first difference.
template <typename T, typename Fmt>
void compare(RefCheck& r, const char* name, const T* got, const T* want, int64_t n, int64_t cols,
             Fmt fmt) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) == 0) continue;
    if (!r.first) r.first = Mismatch{name, i / cols, i % cols, i, fmt(got[i]), fmt(want[i])};
    ++r.mismatches;
  }
}

/// The router reference's outputs (tests/reference/router_reference.h).
struct RouterRef {
  Tensor ids;      ///< I64 [T, K], -1 on padded tokens
  Tensor weights;  ///< F32 [T, K]
};

/// Route @p logits / @p bias (F32 or BF16 [T, E], F32 [E]) with the independent reference:
/// top @p K, routed scaling @p alpha, padding from in.is_padding.
RouterRef reference_router(const Tensor& logits, const Tensor& bias, const StageInputs& in, int64_t K, float alpha) {
  megamoe_router_ref::Problem p;
  p.T = logits.shape[0];
  p.E = logits.shape[1];
  p.K = K;
  p.logits = to_float(logits);
  p.bias = to_float(bias);
  p.alpha = alpha;
  if (in.is_padding) p.pad = in.is_padding->data;
  const megamoe_router_ref::Result res = megamoe_router_ref::route(p);
  RouterRef r;
  r.ids = Tensor("I64", {p.T, K}, "reference 'topk_ids'");
  r.weights = Tensor("F32", {p.T, K}, "reference 'topk_weights'");
  // T == 0: both vectors are empty and their data() may be null, which memcpy forbids.
  if (!res.ids.empty()) std::memcpy(r.ids.data.data(), res.ids.data(), res.ids.size() * sizeof(int64_t));
  if (!res.weights.empty()) {
    std::memcpy(r.weights.data.data(), res.weights.data(), res.weights.size() * sizeof(float));
  }
  return r;
}

/// Compare megamoe's public router outputs (I32 ids, F32 weights) with the reference's.
RefCheck compare_router(const RouterRef& want, const Tensor& ids, const Tensor& weights) {
  RefCheck r;
  const int64_t K = ids.shape[1], n = ids.numel();
  std::vector<int64_t> got(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) got[static_cast<size_t>(i)] = as<int32_t>(ids)[i];
  compare(r, "topk_ids", got.data(), as<int64_t>(want.ids), n, K, [](int64_t v) { return std::to_string(v); });
  compare(r, "topk_weights", as<float>(weights), as<float>(want.weights), n, K, [](float v) { return float_text(v); });
  return r;
}

/// Run megamoe_ref::stage on @p in and compare every output bitwise (shared_x_sf rows
/// through megamoe_ref::shared_row). The reference is not run when none of its outputs
/// has an element (T == 0, or H == K == 0 without x_scales): it would visit all T rows.
RefCheck compare_with_reference(const StageInputs& in, const std::vector<float>& hidden,
                                const StageOutputs& out) {
  const int64_t T = in.T(), H = in.H(), K = in.K();
  std::vector<int64_t> ids(static_cast<size_t>(in.topk_ids.numel()));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = in.topk_ids.dtype == "I32" ? as<int32_t>(in.topk_ids)[i] : as<int64_t>(in.topk_ids)[i];
  }
  const std::vector<float> w = to_float(in.topk_weights);
  std::vector<uint8_t> pad;
  if (in.is_padding) {
    for (uint8_t b : in.is_padding->data) pad.push_back(b != 0);
  }
  // The reference visits every row; when no output has an element (T == 0, or H == K == 0
  // without per-token x_scales, with T up to 2^40 rows of nothing) its result is empty and
  // the comparison below covers the outputs' zero elements without it.
  const bool has_elements = T > 0 && (H > 0 || K > 0 || out.x_scales.has_value());
  megamoe_ref::Result ref;
  // bf16 pass-through: the reference's top-k of any format (an fp8 one here), x_q below.
  const bool bf16 = out.scheme.elem == megamoe::QuantElem::kBFloat16;
  if (has_elements) {
    ref = megamoe_ref::stage(hidden.data(), T, H, ids.data(), w.data(), K, in.is_padding ? pad.data() : nullptr,
                             bf16 ? megamoe_ref::Format::fp8(true, 32) : reference_format(out.scheme, out.global_scale));
  }
  // The routed scaling factor: kept weights become fl(w * alpha), NaN weights keep their
  // bits, padded ones stay +0.0 (the reference itself copies the weights).
  if (out.routed_scaling_factor) {
    for (int64_t i = 0; i < T * K; ++i) {
      float& v = ref.w[static_cast<size_t>(i)];
      if (!pad.empty() && pad[static_cast<size_t>(i / K)]) continue;
      if (!std::isnan(v)) v = v * *out.routed_scaling_factor;
    }
  }
  // Full-buffer rows T..M-1: x outputs untouched (make_outputs fills them with
  // kUntouchedByte), top-k outputs -1 / +0.0.
  float untouched_f32;
  const uint32_t untouched_word = 0x01010101u * kUntouchedByte;
  std::memcpy(&untouched_f32, &untouched_word, 4);
  ref.x_q = with_tail(ref.x_q, out.x_fp8.numel(), kUntouchedByte);
  ref.sf_words = with_tail(ref.sf_words, out.x_sf.numel(), untouched_word);
  ref.sf_f32 = with_tail(ref.sf_f32, out.x_sf.numel(), untouched_f32);
  ref.idx = with_tail(ref.idx, out.topk_idx_out.numel(), int64_t{-1});
  ref.w = with_tail(ref.w, out.topk_weights_out.numel(), 0.0f);
  const bool packed = out.scheme.scale != megamoe::ScaleType::kFloat32;
  const char* xq_name = out.scheme.elem == megamoe::QuantElem::kFloat4E2M1 ? "x_q" : "x_fp8";
  RefCheck r;
  auto byte = [](uint8_t v) { return hex(v, 2); };
  auto word = [](uint32_t v) { return hex(v, 8); };
  auto i64 = [](int64_t v) { return std::to_string(v); };
  auto f32 = [](float v) { return float_text(v); };
  if (bf16) {
    // The input's own bits (NaN payloads of bf16 input kept), through megamoe_ref::bf16_rne.
    std::vector<uint16_t> want(static_cast<size_t>(T * H));
    const Tensor& hs = in.hidden_states;
    for (int64_t i = 0; i < T * H; ++i) {
      if (hs.dtype == "BF16") want[static_cast<size_t>(i)] = as<uint16_t>(hs)[i];
      else if (hs.dtype == "F16") want[static_cast<size_t>(i)] = megamoe_ref::bf16_rne_half(as<uint16_t>(hs)[i]);
      else want[static_cast<size_t>(i)] = megamoe_ref::bf16_rne(as<float>(hs)[i]);
    }
    want = with_tail(want, out.x_fp8.numel(), static_cast<uint16_t>(0x0101u * kUntouchedByte));
    compare(r, xq_name, as<uint16_t>(out.x_fp8), want.data(), out.x_fp8.numel(), out.x_fp8.shape[1],
            [](uint16_t v) { return hex(v, 4); });
  } else {
    compare(r, xq_name, as<uint8_t>(out.x_fp8), ref.x_q.data(), out.x_fp8.numel(), out.x_fp8.shape[1], byte);
  }
  const int64_t cols = out.x_sf.shape[1];
  if (out.x_scales) {
    ref.x_scales = with_tail(ref.x_scales, out.x_scales->numel(), untouched_f32);
    compare(r, "x_scales", as<float>(*out.x_scales), ref.x_scales.data(), out.x_scales->numel(), 1, f32);
  }
  if (packed) {
    compare(r, "x_sf", as<uint32_t>(out.x_sf), ref.sf_words.data(), out.x_sf.numel(), cols, word);
  } else {
    compare(r, "x_sf", as<float>(out.x_sf), ref.sf_f32.data(), out.x_sf.numel(), cols, f32);
  }
  if (out.scheme.scale2 == megamoe::Scale2::kOnline && has_elements) {
    compare(r, "global_scale", &out.global_scale, &ref.global_scale, 1, 1, f32);
  }
  compare(r, "topk_idx_out", as<int64_t>(out.topk_idx_out), ref.idx.data(), out.topk_idx_out.numel(), K, i64);
  compare(r, "topk_weights_out", as<float>(out.topk_weights_out), ref.w.data(), out.topk_weights_out.numel(),
          K, f32);
  if (out.shared_x_sf && cols > 0) {  // cols == 0: no elements, and T may be 2^40
    const uint32_t* sh = as<uint32_t>(*out.shared_x_sf);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = megamoe_ref::shared_row(t, out.shared_block_m);
      for (int64_t c = 0; c < cols; ++c) {
        const uint32_t got = sh[row * cols + c], want = ref.sf_words[t * cols + c];
        if (got == want) continue;
        if (!r.first) {
          r.first = Mismatch{"shared_x_sf", row, c, row * cols + c, word(got),
                             word(want) + " (x_sf of token " + std::to_string(t) + ")"};
        }
        ++r.mismatches;
      }
    }
  }
  return r;
}

/// The norm reference's rows of @p norm over x = in.hidden_states: y, and z (the new
/// residual) when there is a residual.
struct NormRef {
  Tensor y;  ///< BF16 [T, H]
  Tensor z;  ///< BF16 [T, H], or empty without a residual
};

NormRef reference_norm(const StageInputs& in, const NormRun& norm) {
  const int64_t T = in.T(), H = in.H();
  NormRef r;
  r.y = Tensor("BF16", {T, H}, "reference 'y'");
  if (norm.residual != nullptr) r.z = Tensor("BF16", {T, H}, "reference 'residual_out'");
  const std::vector<float> w = to_float(*norm.weight);
  for (int64_t t = 0; t < (H > 0 ? T : 0); ++t) {
    const uint16_t* res = norm.residual != nullptr ? as<uint16_t>(*norm.residual) + t * H : nullptr;
    const megamoe_ref::norm::Row row = megamoe_ref::norm::row(as<uint16_t>(in.hidden_states) + t * H, res, w, norm.eps);
    std::memcpy(r.y.data.data() + t * H * 2, row.y.data(), static_cast<size_t>(H) * 2);
    if (norm.residual != nullptr) std::memcpy(r.z.data.data() + t * H * 2, row.z.data(), static_cast<size_t>(H) * 2);
  }
  return r;
}

}  // namespace

bool reference_compiled() { return true; }

std::optional<RefChecks> check_reference(StageInputs& in, const std::vector<float>& hidden, const StageOutputs& out,
                                         const RouterRun* router, const NormRun* norm) {
  RefChecks c;
  if (norm != nullptr) {
    // y and residual_out against the norm reference; the staging reference then stages the
    // norm reference's y (swapped into in for the comparison only).
    NormRef nref = reference_norm(in, *norm);
    const int64_t H = in.H();
    auto bits = [](uint16_t v) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "0x%04x", v);
      return std::string(buf);
    };
    compare(c.norm, "y", as<uint16_t>(*norm->y), as<uint16_t>(nref.y), nref.y.numel(), H, bits);
    if (norm->residual_out != nullptr) {
      compare(c.norm, "residual_out", as<uint16_t>(*norm->residual_out), as<uint16_t>(nref.z), nref.z.numel(), H,
              bits);
    }
    const std::vector<float> y = to_float(nref.y);
    std::swap(in.hidden_states, nref.y);
    c.staging = compare_with_reference(in, y, out);
    std::swap(in.hidden_states, nref.y);
    return c;
  }
  if (router == nullptr) {
    c.staging = compare_with_reference(in, hidden, out);
    return c;
  }
  // The staging reference gets the router reference's ids and weights as its top-k inputs
  // (swapped in for the comparison only).
  RouterRef rref = reference_router(*router->logits, *router->bias, in, router->K, router->routed_scaling_factor);
  c.router = compare_router(rref, *router->ids, *router->weights);
  std::swap(in.topk_ids, rref.ids);
  std::swap(in.topk_weights, rref.weights);
  c.staging = compare_with_reference(in, hidden, out);
  std::swap(in.topk_ids, rref.ids);
  std::swap(in.topk_weights, rref.weights);
  return c;
}

}  // namespace megamoe_cli
