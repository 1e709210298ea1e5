// gate_cases.h: the gate tests' problems, shared by the CPU tests (test_gate.cpp) and the
// GPU tests (tests/cuda/test_gate_cuda.cu): y and the gate weight (values as the library
// reads them) in a chosen layout with poisoned storage, the router spec on top, hash layers
// and EPLB.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "megamoe/megamoe.h"
#include "router_cases.h"

namespace router_cases {

/// A gate problem: sizes, the layouts of y, the weight and logits_out, the values' seed and scales.
struct GateCase {
  int64_t T = 4, E = 64, H = 2048, K = 6;
  bool w_f32 = false;
  int y_layout = 0;  // 0 row-major, 1 rows H + 5 apart, 2 column-major
  int w_layout = 0;  // 0 row-major, 1 rows H + 3 apart, 2 column-major
  int l_layout = 0;  // logits_out: 0 row-major, 1 rows E + 2 apart, 2 column-major, -1 none
  uint32_t seed = 1;
  float y_scale = 1.0f, w_scale = 0.05f;
};

/// Storage for a [rows, cols] tensor in @p layout: poisoned bytes, the view's strides.
inline Tensor laid_out(DType dt, int64_t rows, int64_t cols, int layout, int pad, uint8_t poison) {
  if (layout == 0) return Tensor(dt, {rows, cols}, poison);
  if (layout == 1) {
    Tensor t(dt, {rows, cols + pad}, poison);
    t.ref.shape[1] = cols;
    return t;
  }
  Tensor t(dt, {cols, rows}, poison);
  t.ref.shape[0] = rows;
  t.ref.shape[1] = cols;
  t.ref.strides[0] = 1;
  t.ref.strides[1] = rows;
  return t;
}

struct GateBufs {
  std::vector<float> yv, wv;  // values as the library reads them, row-major
  Tensor y, w, logits;
  megamoe::GateArgs args;
};

inline std::unique_ptr<GateBufs> gate_bufs(const GateCase& c, uint8_t poison = 0xCD) {
  auto b = std::make_unique<GateBufs>();
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  b->yv.resize(static_cast<size_t>(c.T * c.H));
  b->wv.resize(static_cast<size_t>(c.E * c.H));
  for (float& v : b->yv) v = from_bf16(to_bf16(nd(rng) * c.y_scale));
  for (float& v : b->wv) v = nd(rng) * c.w_scale;
  if (!c.w_f32) {
    for (float& v : b->wv) v = from_bf16(to_bf16(v));
  }
  b->y = laid_out(DType::kBFloat16, c.T, c.H, c.y_layout, 5, 0x7B);
  b->w = laid_out(c.w_f32 ? DType::kFloat32 : DType::kBFloat16, c.E, c.H, c.w_layout, 3, 0x7B);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t h = 0; h < c.H; ++h) b->y.set<uint16_t>(t, h, to_bf16(b->yv[static_cast<size_t>(t * c.H + h)]));
  }
  for (int64_t e = 0; e < c.E; ++e) {
    for (int64_t h = 0; h < c.H; ++h) {
      const float v = b->wv[static_cast<size_t>(e * c.H + h)];
      if (c.w_f32) b->w.set<float>(e, h, v);
      else b->w.set<uint16_t>(e, h, to_bf16(v));
    }
  }
  b->args.y = b->y.ref;
  b->args.weight = b->w.ref;
  if (c.l_layout >= 0) {
    b->logits = laid_out(DType::kFloat32, c.T, c.E, c.l_layout, 2, poison);
    b->args.logits_out = b->logits.ref;
  }
  return b;
}

/// Write y / weight values back into the tensors (after a test edits yv / wv).
inline void rewrite(GateBufs& b, const GateCase& c) {
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t h = 0; h < c.H; ++h) b.y.set<uint16_t>(t, h, to_bf16(b.yv[static_cast<size_t>(t * c.H + h)]));
  }
  for (int64_t e = 0; e < c.E; ++e) {
    for (int64_t h = 0; h < c.H; ++h) {
      const float v = b.wv[static_cast<size_t>(e * c.H + h)];
      if (c.w_f32) b.w.set<float>(e, h, v);
      else b.w.set<uint16_t>(e, h, to_bf16(v));
    }
  }
  for (float& v : b.yv) v = from_bf16(to_bf16(v));
  if (!c.w_f32) {
    for (float& v : b.wv) v = from_bf16(to_bf16(v));
  }
}

/// A router spec for the gate: the reference logits, bias and the options of @p base.
inline Spec router_spec(const GateCase& c, const std::vector<float>& logits, uint32_t seed) {
  Spec s = random_spec(c.T, c.E, c.K, seed);
  s.logits = logits;
  return s;
}

/// Hash layers on @p s (V rows, two invalid entries and one invalid token id where T > 3).
inline void add_hash(Spec& s, uint32_t seed) {
  s.bias.reset();
  s.V = 40;
  std::mt19937 rng(seed);
  s.tid2eid = std::vector<int32_t>(static_cast<size_t>(s.V * s.K));
  for (int32_t& e : *s.tid2eid) e = static_cast<int32_t>(rng() % static_cast<uint32_t>(s.E));
  (*s.tid2eid)[0] = -1;
  (*s.tid2eid)[static_cast<size_t>(s.K * s.V - 1)] = static_cast<int32_t>(s.E);
  s.input_ids.clear();
  for (int64_t t = 0; t < s.T; ++t) s.input_ids.push_back(static_cast<int64_t>(rng() % 40));
  s.input_ids[0] = 0;
  if (s.T > 3) s.input_ids[3] = 40;
}

/// EPLB on @p s: R slots, P = E + 32 physical experts, recording on.
inline void add_eplb(Spec& s, uint32_t seed, int64_t R) {
  std::mt19937 rng(seed);
  s.R = R;
  s.P = s.E + 32;
  s.l2p = std::vector<int32_t>(static_cast<size_t>(s.E * R));
  for (int32_t& p : *s.l2p) p = static_cast<int32_t>(rng() % static_cast<uint32_t>(s.P));
  s.replicas.resize(static_cast<size_t>(s.E));
  for (int64_t e = 0; e < s.E; ++e) s.replicas[static_cast<size_t>(e)] = static_cast<int32_t>(1 + e % R);
}

}  // namespace router_cases
