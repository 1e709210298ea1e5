// router_cases.h: the router tests' problems, shared by the CPU tests (test_router.cpp)
// and the GPU tests (tests/cuda/test_router_cuda.cu): host tensors with poisoned bytes, a
// Spec that builds both the library's RouterArgs and the reference's arrays, the named
// cases (planted ties, NaN / Inf logits, hash layers, EPLB, ...) and staging buffers.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "megamoe/megamoe.h"
#include "router_reference.h"

namespace router_cases {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::RouterArgs;
using megamoe::StageArgs;
using megamoe::TensorRef;
namespace ref = megamoe_router_ref;

/// Logits (bits) whose fast score path cannot decide (core::router_score_fast returns
/// false: a double near an fp32 midpoint), found by bench/router_accuracy.cpp --only scores
/// and a scan of [2^-7, 2^5) both signs: e^x next to 1 + 2^-24, and others near 0.
constexpr uint32_t kScoreFallbackLogits[] = {0x337FFFF0u, 0x33800000u, 0x33800007u, 0x3C273496u, 0x3C423862u,
                                             0x3C5F7364u, 0xBC2A461Au, 0xBC7B48EDu, 0xBCB8F40Fu, 0xBCD2CF27u};

inline uint32_t u32(float f) { return ref::bits(f); }
inline float f32(uint32_t u) { return ref::from_bits(u); }

inline uint16_t to_bf16(float f) {
  const uint32_t u = u32(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t h) { return f32(static_cast<uint32_t>(h) << 16); }

/// A host tensor: its own bytes (poisoned) and a view with row-major or given strides.
struct Tensor {
  std::vector<uint8_t> mem;
  TensorRef ref;
  Tensor() = default;
  /// Row-major, @p poison in every byte.
  Tensor(DType dt, std::vector<int64_t> shape, uint8_t poison = 0xCD) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    mem.assign(static_cast<size_t>(std::max<int64_t>(1, n) * megamoe::dtype_size(dt)), poison);
    ref.data = mem.data();
    ref.dtype = dt;
    ref.ndim = static_cast<int>(shape.size());
    int64_t st = 1;
    for (int d = ref.ndim - 1; d >= 0; --d) {
      ref.shape[d] = shape[static_cast<size_t>(d)];
      ref.strides[d] = st;
      st *= shape[static_cast<size_t>(d)];
    }
  }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(mem.data());
  }
  template <typename T>
  T at(int64_t i, int64_t j = 0) const {
    T v;
    const int64_t off = (ref.ndim > 0 ? i * ref.strides[0] : 0) + (ref.ndim > 1 ? j * ref.strides[1] : 0);
    std::memcpy(&v, static_cast<const uint8_t*>(ref.data) + off * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  }
  template <typename T>
  void set(int64_t i, int64_t j, T v) {
    const int64_t off = (ref.ndim > 0 ? i * ref.strides[0] : 0) + (ref.ndim > 1 ? j * ref.strides[1] : 0);
    std::memcpy(static_cast<uint8_t*>(ref.data) + off * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
  }
};

/// A [rows, cols] float tensor (fp32 or bf16) holding @p v (row-major values), laid out
/// row-major or transposed (column-major).
inline Tensor real_tensor(DType dt, int64_t rows, int64_t cols, const std::vector<float>& v, bool transposed = false) {
  Tensor t(dt, {rows, cols});
  if (transposed) {
    t.ref.strides[0] = 1;
    t.ref.strides[1] = rows;
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const float x = v[static_cast<size_t>(i * cols + j)];
      if (dt == DType::kBFloat16) t.set<uint16_t>(i, j, to_bf16(x));
      else t.set<float>(i, j, x);
    }
  }
  return t;
}

/// Values as the library reads them (bf16 rounding applied).
inline std::vector<float> as_read(DType dt, std::vector<float> v) {
  if (dt == DType::kBFloat16) {
    for (float& x : v) x = from_bf16(to_bf16(x));
  }
  return v;
}

// ---------------------------------------------------------------------------------------
// A router problem: the reference's arrays and the library's tensors, built from one spec.

struct Spec {
  int64_t T = 8, E = 256, K = 6;
  DType logits_dt = DType::kFloat32, bias_dt = DType::kFloat32, ids_dt = DType::kInt32;
  bool transposed_logits = false;
  std::vector<float> logits;  // [T, E]
  std::optional<std::vector<float>> bias;
  std::optional<float> alpha;  // RouterArgs::routed_scaling_factor (absent: no scaling)
  std::optional<std::vector<uint8_t>> pad;
  // hash layers
  std::optional<std::vector<int32_t>> tid2eid;  // [V, K]
  int64_t V = 0;
  std::vector<int64_t> input_ids;
  DType input_ids_dt = DType::kInt32;
  // EPLB
  std::optional<std::vector<int32_t>> l2p;  // [E, R]
  std::vector<int32_t> replicas;
  int64_t R = 0, P = 0;
  DType load_dt = DType::kInt64;
  bool record = true;
  bool transposed_l2p = false;  // the map as a column-major [E, R] view (strides 1, E)
  bool count = false;
};

/// The library's tensors of a Spec (kept alive with the args).
struct Built {
  Tensor logits, bias, ids, weights, tid2eid, input_ids, l2p, replicas, load, record, nonfinite, pad;
  RouterArgs args;
};

inline std::unique_ptr<Built> build(const Spec& s, bool with_pad_in_router = true) {
  auto b = std::make_unique<Built>();
  b->logits = real_tensor(s.logits_dt, s.T, s.E, s.logits, s.transposed_logits);
  b->args.router_logits = b->logits.ref;
  if (s.bias) {
    b->bias = real_tensor(s.bias_dt, 1, s.E, *s.bias);
    b->bias.ref.ndim = 1;
    b->bias.ref.shape[0] = s.E;
    b->bias.ref.strides[0] = 1;
    b->args.e_score_correction_bias = b->bias.ref;
  }
  b->args.top_k = s.K;
  b->args.routed_scaling_factor = s.alpha;
  b->ids = Tensor(s.ids_dt, {s.T, s.K});
  b->weights = Tensor(DType::kFloat32, {s.T, s.K});
  b->args.topk_ids = b->ids.ref;
  b->args.topk_weights = b->weights.ref;
  if (s.tid2eid) {
    b->tid2eid = Tensor(DType::kInt32, {s.V, s.K});
    std::memcpy(b->tid2eid.mem.data(), s.tid2eid->data(), s.tid2eid->size() * 4);
    b->input_ids = Tensor(s.input_ids_dt, {s.T});
    for (int64_t t = 0; t < s.T; ++t) {
      if (s.input_ids_dt == DType::kInt32) b->input_ids.set<int32_t>(t, 0, static_cast<int32_t>(s.input_ids[static_cast<size_t>(t)]));
      else b->input_ids.set<int64_t>(t, 0, s.input_ids[static_cast<size_t>(t)]);
    }
    b->args.tid2eid = b->tid2eid.ref;
    b->args.input_ids = b->input_ids.ref;
  }
  if (s.l2p) {
    if (s.transposed_l2p) {
      b->l2p = Tensor(DType::kInt32, {s.R, s.E});
      for (int64_t e = 0; e < s.E; ++e) {
        for (int64_t j = 0; j < s.R; ++j) b->l2p.set<int32_t>(j, e, (*s.l2p)[static_cast<size_t>(e * s.R + j)]);
      }
      b->l2p.ref.shape[0] = s.E;
      b->l2p.ref.shape[1] = s.R;
      b->l2p.ref.strides[0] = 1;
      b->l2p.ref.strides[1] = s.E;
    } else {
      b->l2p = Tensor(DType::kInt32, {s.E, s.R});
      std::memcpy(b->l2p.mem.data(), s.l2p->data(), s.l2p->size() * 4);
    }
    b->replicas = Tensor(DType::kInt32, {s.E});
    std::memcpy(b->replicas.mem.data(), s.replicas.data(), s.replicas.size() * 4);
    b->load = Tensor(s.load_dt, {s.P}, 0);
    b->record = Tensor(DType::kInt32, {1}, 0);
    b->record.set<int32_t>(0, 0, s.record ? 7 : 0);
    b->args.logical_to_physical_map = b->l2p.ref;
    b->args.logical_replica_count = b->replicas.ref;
    b->args.expert_load_view = b->load.ref;
    b->args.record_enabled = b->record.ref;
  }
  if (s.count) {
    b->nonfinite = Tensor(DType::kInt64, {1}, 0);
    b->nonfinite.set<int64_t>(0, 0, 1000);
    b->args.nonfinite_count = b->nonfinite.ref;
  }
  if (s.pad) {
    b->pad = Tensor(DType::kUInt8, {s.T});
    std::memcpy(b->pad.mem.data(), s.pad->data(), s.pad->size());
    if (with_pad_in_router) b->args.is_padding = b->pad.ref;
  }
  return b;
}

inline ref::Problem reference_problem(const Spec& s) {
  ref::Problem p;
  p.T = s.T;
  p.E = s.E;
  p.K = s.K;
  p.logits = as_read(s.logits_dt, s.logits);
  if (s.bias) p.bias = as_read(s.bias_dt, *s.bias);
  p.alpha = s.alpha;
  if (s.pad) p.pad = *s.pad;
  if (s.tid2eid) {
    p.tid2eid = *s.tid2eid;
    p.V = s.V;
    p.input_ids = s.input_ids;
  }
  if (s.l2p) {
    p.l2p = *s.l2p;
    p.replicas = s.replicas;
    p.R = s.R;
    p.P = s.P;
    p.record = s.record;
  }
  return p;
}

inline std::string hex(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08X", u);
  return b;
}

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline Spec random_spec(int64_t T, int64_t E, int64_t K, uint32_t seed) {
  Spec s;
  s.T = T;
  s.E = E;
  s.K = K;
  s.logits = randn(static_cast<size_t>(T * E), seed);
  s.bias = randn(static_cast<size_t>(E), seed + 1, 0.5f);
  return s;
}

// ---------------------------------------------------------------------------------------
// Named cases (each test states what it checks beyond the reference).

/// Equal biased scores straddling the K-th place: ids 200, 17, 90, 3, 250 share the top
/// score, 64 and 128 the next one (the random logits stay far below): ids 3 17 90 200 250 64.
inline Spec planted_ties_spec() {
  Spec s = random_spec(6, 256, 6, 11);
  for (float& b : *s.bias) b = 0.25f;
  for (int64_t t = 0; t < s.T; ++t) {
    float* row = s.logits.data() + t * s.E;
    for (int64_t e : {200, 17, 90, 3, 250}) row[e] = 90.0f;
    for (int64_t e : {128, 64}) row[e] = 85.0f;
  }
  return s;
}

/// The top experts clustered in a few 32-expert columns (ids 0..39 far above the rest, the
/// rest with pairs of equal logits): CUDA's single-token selection sees more than 32 experts
/// at its threshold and falls back to the rounds; ids 40.. alone (the second token) give a
/// threshold with ties between warps.
inline Spec clustered_spec() {
  Spec s = random_spec(2, 256, 8, 14);
  for (int64_t e = 0; e < s.E; ++e) {
    s.logits[e] = e < 40 ? 30.0f + 0.125f * static_cast<float>(e % 7) : static_cast<float>((e / 2) % 9);
    s.logits[s.E + e] = e < 40 ? -50.0f : static_cast<float>((e / 2) % 9);
  }
  for (float& b : *s.bias) b = 0.0f;
  return s;
}

/// A tie made by the bias: different logits (ids 5 and 10), equal fl(s + bias).
inline Spec bias_tie_spec(float (*score)(float)) {
  Spec u = random_spec(1, 64, 4, 12);
  for (float& b : *u.bias) b = 0.0f;
  u.logits[10] = 1.0f;
  u.logits[5] = 2.0f;
  (*u.bias)[10] = score(2.0f) - score(1.0f) + 100.0f;
  (*u.bias)[5] = 100.0f;
  return u;
}

/// Every logit 0.5: ids 0..K-1. The default shape has K above the warps holding experts
/// (the CUDA kernels' general selection); at E = 256, K = 6 all 256 experts tie at the
/// one-token selection's threshold, more than the 32 it compacts, which is its fallback.
inline Spec all_equal_spec(int64_t T = 3, int64_t E = 200, int64_t K = 8, uint32_t seed = 13) {
  Spec s = random_spec(T, E, K, seed);
  for (float& x : s.logits) x = 0.5f;
  for (float& b : *s.bias) b = -1.0f;
  return s;
}

/// Logits rising with the id, a bias falling faster: the lowest ids win.
inline Spec reversed_bias_spec() {
  Spec s = random_spec(4, 100, 5, 14);
  for (int64_t t = 0; t < s.T; ++t) {
    for (int64_t e = 0; e < s.E; ++e) s.logits[static_cast<size_t>(t * s.E + e)] = 0.05f * static_cast<float>(e);
  }
  for (int64_t e = 0; e < s.E; ++e) (*s.bias)[static_cast<size_t>(e)] = -0.5f * static_cast<float>(e);
  return s;
}

/// NaN and +-Inf logits and biases (counted): row 0 mixed, row 1 all NaN, row 2 numbers
/// only at ids 1, 21, 41, 61, row 3 two +inf, row 4 a -inf and a NaN bias (expert 21's
/// biased score is then NaN in every row).
inline Spec nan_inf_spec() {
  Spec s = random_spec(6, 64, 6, 15);
  s.count = true;
  float* r0 = s.logits.data();
  r0[3] = NAN;
  r0[7] = INFINITY;
  r0[9] = -INFINITY;
  r0[11] = ref::from_bits(0xFFC01234u);  // a negative NaN with a payload
  for (int64_t e = 0; e < 64; ++e) s.logits[static_cast<size_t>(64 + e)] = NAN;
  for (int64_t e = 0; e < 64; ++e) s.logits[static_cast<size_t>(128 + e)] = e % 20 == 1 ? 1.0f * e : NAN;
  s.logits[static_cast<size_t>(192 + 4)] = INFINITY;
  s.logits[static_cast<size_t>(192 + 40)] = INFINITY;
  (*s.bias)[20] = -INFINITY;
  (*s.bias)[21] = NAN;
  s.logits[static_cast<size_t>(256 + 20)] = 50.0f;
  s.logits[static_cast<size_t>(256 + 21)] = 60.0f;
  return s;
}

/// Logits around the softplus threshold (20), the exp overflow (88.7) and underflow (-104).
inline Spec extremes_spec() {
  Spec s = random_spec(4, 128, 8, 16);
  for (size_t i = 0; i < s.logits.size(); ++i) {
    const float base[] = {20.0f, -20.0f, 88.7f, -103.9f, 0.0f, 1e-30f};
    s.logits[i] = std::nextafter(base[i % 6], (i / 6) % 2 ? 1e9f : -1e9f) * (1.0f + 1e-6f * static_cast<float>(i / 12));
  }
  return s;
}

/// Padded tokens 1, 4, 6, 9 (nonzero bytes of any value).
inline Spec padding_spec() {
  Spec s = random_spec(10, 256, 6, 17);
  s.pad = std::vector<uint8_t>{0, 1, 0, 0, 2, 0, 1, 0, 0, 255};
  return s;
}

/// A hash layer: 12 tokens, a 50-row table with two invalid entries (row 1: -1 and 256,
/// ids -1, weights 0, nothing in the sum), and two invalid token ids (tokens 3 and 4: the
/// token behaves as padded).
inline Spec hash_spec(uint32_t seed) {
  Spec s = random_spec(12, 256, 6, seed);
  s.bias.reset();
  s.V = 50;
  std::mt19937 rng(seed);
  s.tid2eid = std::vector<int32_t>(static_cast<size_t>(s.V * s.K));
  for (int32_t& e : *s.tid2eid) e = static_cast<int32_t>(rng() % 256);
  (*s.tid2eid)[7] = -1;   // invalid entries: id -1, weight 0, nothing in the sum
  (*s.tid2eid)[8] = 256;
  for (int64_t t = 0; t < s.T; ++t) s.input_ids.push_back(static_cast<int64_t>(rng() % 50));
  s.input_ids[0] = 1;     // the row with the invalid entries
  s.input_ids[3] = 50;    // out of range: the token behaves as padded
  s.input_ids[4] = -2;
  return s;
}

/// EPLB: T tokens (every 4th padded), E experts, top K, R slots with 1..R replicas,
/// E + 64 physical experts, recording on.
inline Spec eplb_spec(uint32_t seed, int64_t R, int64_t T = 23, int64_t E = 256, int64_t K = 8) {
  Spec s = random_spec(T, E, K, seed);
  s.R = R;
  s.P = E + 64;
  std::mt19937 rng(seed);
  s.l2p = std::vector<int32_t>(static_cast<size_t>(s.E * R));
  for (int32_t& p : *s.l2p) p = static_cast<int32_t>(rng() % static_cast<uint32_t>(s.P));
  s.replicas.resize(static_cast<size_t>(s.E));
  for (int64_t e = 0; e < s.E; ++e) s.replicas[static_cast<size_t>(e)] = static_cast<int32_t>(1 + e % R);
  s.pad = std::vector<uint8_t>(static_cast<size_t>(s.T), 0);
  for (int64_t t = 0; t < s.T; t += 4) (*s.pad)[static_cast<size_t>(t)] = 1;
  return s;
}


/// Replica counts and physical ids outside their ranges (device data): counts -2..4 with
/// R = 3 (clamped to [1, 3]), physical ids -1 and beyond P (written, not recorded).
inline Spec eplb_out_of_range_spec() {
  Spec s = eplb_spec(25, 3);
  for (int64_t e = 0; e < s.E; ++e) s.replicas[static_cast<size_t>(e)] = static_cast<int32_t>(e % 7) - 2;
  (*s.l2p)[0] = -1;
  (*s.l2p)[4] = 1000000;
  for (int64_t e = 0; e < s.E; e += 3) (*s.l2p)[static_cast<size_t>(e * 3)] = e % 2 ? -1 : 5000;
  return s;
}

/// A hash layer with EPLB.
inline Spec hash_eplb_spec() {
  Spec s = hash_spec(26);
  Spec e = eplb_spec(27, 2);
  s.l2p = e.l2p;
  s.replicas = e.replicas;
  s.R = e.R;
  s.P = e.P;
  return s;
}

/// Every named case and a spread of random DeepSeek-shaped ones, for the backend
/// comparisons (GPU == CPU); @p score is the library's score (for the bias tie).
inline std::vector<std::pair<std::string, Spec>> catalog(float (*score)(float)) {
  std::vector<std::pair<std::string, Spec>> c;
  uint32_t seed = 100;
  for (auto [E, K] : {std::pair<int64_t, int64_t>{256, 6}, {256, 8}, {384, 6}, {384, 8}}) {
    // Up to T = 1500 the fused kernel's router blocks take one token each, from 1057 the
    // router kernel's several (router_tokens_per_block on a 132-SM GPU); 2500 both.
    for (int64_t T : {1, 7, 64, 300, 1500, 2500}) {
      Spec s = random_spec(T, E, K, seed++);
      s.logits_dt = seed % 2 ? DType::kBFloat16 : DType::kFloat32;
      s.bias_dt = seed % 3 ? DType::kFloat32 : DType::kBFloat16;
      s.ids_dt = seed % 5 < 2 ? DType::kInt64 : DType::kInt32;
      s.alpha = 1.5f;
      s.count = T % 2 == 1;
      c.emplace_back("random E=" + std::to_string(E) + " K=" + std::to_string(K) + " T=" + std::to_string(T), s);
    }
  }
  for (auto [E, K] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {33, 16}, {200, 6}, {257, 9}, {511, 16}, {512, 16},
                      {512, 1}}) {
    c.emplace_back("E=" + std::to_string(E) + " K=" + std::to_string(K),
                   random_spec(5, E, K, static_cast<uint32_t>(E * 31 + K)));
  }
  Spec nb = random_spec(19, 384, 8, 7);
  nb.bias.reset();
  c.emplace_back("no bias", nb);
  nb.transposed_logits = true;
  c.emplace_back("transposed logits", nb);
  c.emplace_back("planted ties", planted_ties_spec());
  c.emplace_back("clustered", clustered_spec());
  c.emplace_back("bias tie", bias_tie_spec(score));
  c.emplace_back("all equal", all_equal_spec());
  c.emplace_back("all equal decode", all_equal_spec(2, 256, 6, 21));
  c.emplace_back("reversed bias", reversed_bias_spec());
  c.emplace_back("nan inf", nan_inf_spec());
  c.emplace_back("extremes", extremes_spec());
  c.emplace_back("padding", padding_spec());
  for (DType idt : {DType::kInt32, DType::kInt64}) {
    Spec h = hash_spec(18);
    h.input_ids_dt = idt;
    h.count = true;
    c.emplace_back(std::string("hash ") + megamoe::dtype_name(idt), h);
  }
  // 1..5 and 7 slots: small maps (a row of a few slots is the usual EPLB state) and wider.
  for (int64_t R : {1, 2, 3, 4, 5, 7}) {
    for (bool record : {true, false}) {
      Spec e = eplb_spec(static_cast<uint32_t>(19 + R), R);
      e.record = record;
      e.load_dt = R % 2 ? DType::kInt32 : DType::kInt64;
      c.emplace_back("eplb R=" + std::to_string(R) + (record ? " record" : " no record"), e);
    }
  }
  // Decode shapes (one token a router block: the CUDA kernels' single-token selection) at
  // E = 200 / 256 / 384 / 512, a column-major map.
  for (auto [T, E, K, R] : {std::array<int64_t, 4>{1, 384, 6, 4}, {5, 384, 6, 2}, {3, 512, 8, 3}, {3, 512, 8, 4},
                            {2, 200, 6, 3}, {1, 256, 6, 1}}) {
    Spec e = eplb_spec(static_cast<uint32_t>(T * 1000 + E + R), R, T, E, K);
    e.load_dt = R % 2 ? DType::kInt64 : DType::kInt32;
    e.logits_dt = E % 3 ? DType::kBFloat16 : DType::kFloat32;
    c.emplace_back("eplb decode T=" + std::to_string(T) + " E=" + std::to_string(E) + " R=" + std::to_string(R), e);
  }
  Spec tm = eplb_spec(31, 3, 4, 256, 6);
  tm.transposed_l2p = true;
  c.emplace_back("eplb column-major map", tm);
  c.emplace_back("eplb out of range", eplb_out_of_range_spec());
  c.emplace_back("hash eplb", hash_eplb_spec());
  return c;
}

/// The staging half of a route_and_stage call.
struct StageCase {
  QuantScheme scheme = QuantScheme::mxfp8();
  int64_t H = 512;
  int64_t M = 0;  // full-buffer rows (0: no full buffer)
  std::optional<int64_t> shared_bm;
  bool count = false;
  bool pad = true;
  DType hidden_dt = DType::kBFloat16;
  bool strided_hidden = false;  // rows H + 3 apart: unaligned, the generic kernel on CUDA
  bool mn_major_sf = false;     // x_sf transposed (token-fastest), the tile shape on CUDA
  bool pdl = false;
};

/// Staging buffers of one call, every output poisoned with the same byte.
struct StageBufs {
  Tensor hs, xq, xsf, idx, w, shared, xscales, gs, nonfinite, pad;
  StageArgs args;
  /// Every tensor a call may write.
  std::vector<const Tensor*> outputs() const { return {&xq, &xsf, &idx, &w, &shared, &xscales, &nonfinite}; }
};

/// The output poisons of the fused checks: each the other's complement, so that no output
/// byte equals both (a byte left unwritten differs from one of them).
constexpr uint8_t kStagePoisons[] = {0xCD, 0x32};

inline std::unique_ptr<StageBufs> stage_bufs(const StageCase& c, int64_t T, int64_t K, const std::vector<uint8_t>* pad,
                                             uint8_t poison = kStagePoisons[0]) {
  auto b = std::make_unique<StageBufs>();
  const int64_t rows = c.M > 0 ? c.M : T;
  const megamoe::OutputShapes sh = megamoe::output_shapes(rows, c.H, K, c.scheme, c.shared_bm);
  std::vector<float> hv = randn(static_cast<size_t>(T * c.H), 99, 17.0f);
  if (!hv.empty()) hv[0] = NAN;
  if (c.strided_hidden) {
    b->hs = real_tensor(c.hidden_dt, T, c.H + 3, std::vector<float>(static_cast<size_t>(T * (c.H + 3)), 1.0f));
    b->hs.ref.shape[1] = c.H;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < c.H; ++h) {
        const float x = hv[static_cast<size_t>(t * c.H + h)];
        if (c.hidden_dt == DType::kBFloat16) b->hs.set<uint16_t>(t, h, to_bf16(x));
        else b->hs.set<float>(t, h, x);
      }
    }
  } else {
    b->hs = real_tensor(c.hidden_dt, T, c.H, hv);
  }
  b->xq = Tensor(sh.x_q.dtype, {sh.x_q.shape[0], sh.x_q.shape[1]}, poison);
  b->xsf = Tensor(sh.x_sf.dtype, {sh.x_sf.shape[0], sh.x_sf.shape[1]}, poison);
  if (c.mn_major_sf) {
    b->xsf.ref.strides[0] = 1;
    b->xsf.ref.strides[1] = sh.x_sf.shape[0];
  }
  b->idx = Tensor(DType::kInt64, {rows, K}, poison);
  b->w = Tensor(DType::kFloat32, {rows, K}, poison);
  b->args.hidden_states = b->hs.ref;
  b->args.x_q = b->xq.ref;
  b->args.x_sf = b->xsf.ref;
  b->args.topk_idx_out = b->idx.ref;
  b->args.topk_weights_out = b->w.ref;
  b->args.hidden_quant = c.scheme;
  b->args.full_buffer = c.M > 0;
  b->args.enable_pdl = c.pdl;
  if (c.shared_bm) {
    const megamoe::OutputShapes s2 = megamoe::output_shapes(T, c.H, K, c.scheme, c.shared_bm);
    b->shared = Tensor(DType::kInt32, {s2.shared_x_sf->shape[0], s2.shared_x_sf->shape[1]}, poison);
    b->args.shared_x_sf = b->shared.ref;
    b->args.shared_block_m = c.shared_bm;
  }
  if (sh.x_scales) {
    b->xscales = Tensor(DType::kFloat32, {rows}, poison);
    b->args.x_scales = b->xscales.ref;
  }
  if (sh.global_scale) {
    b->gs = Tensor(DType::kFloat32, {1});
    b->gs.set<float>(0, 0, 0.37f);
    b->args.global_scale = b->gs.ref;
  }
  if (c.count) {
    b->nonfinite = Tensor(DType::kInt64, {1}, 0);
    b->args.nonfinite_count = b->nonfinite.ref;
  }
  if (pad != nullptr) {
    b->pad = Tensor(DType::kBool, {T});
    std::memcpy(b->pad.mem.data(), pad->data(), pad->size());
    b->args.is_padding = b->pad.ref;
  }
  return b;
}

/// prepare_inputs with a router's outputs (@p ids, @p weights: [T, K] row-major, the
/// reference's) as its top-k inputs, into buffers poisoned with @p poison; @p hidden, when
/// given, replaces the case's own hidden states. The staging the fused calls must equal.
inline std::unique_ptr<StageBufs> stage_with_topk(const StageCase& c, int64_t T, int64_t K,
                                                  const std::vector<uint8_t>* pad, uint8_t poison,
                                                  const std::vector<int64_t>& ids, const std::vector<float>& weights,
                                                  const TensorRef* hidden = nullptr) {
  auto plain = stage_bufs(c, T, K, pad, poison);
  if (hidden != nullptr) plain->args.hidden_states = *hidden;
  Tensor id(DType::kInt64, {T, K}), w(DType::kFloat32, {T, K});
  std::memcpy(id.mem.data(), ids.data(), ids.size() * 8);
  std::memcpy(w.mem.data(), weights.data(), weights.size() * 4);
  plain->args.topk_ids = id.ref;
  plain->args.topk_weights = w.ref;
  megamoe::prepare_inputs(plain->args);
  return plain;
}

/// H == 0 (valid: a multiple of 128) through route_and_stage: no activation to stage, the
/// top-k still staged (all M rows in full-buffer mode); NVFP4 per-token still writes its
/// scales from the floor.
inline std::vector<std::pair<Spec, StageCase>> empty_hidden_cases() {
  std::vector<std::pair<Spec, StageCase>> v;
  StageCase c;
  c.H = 0;
  c.M = 20;
  v.emplace_back(random_spec(9, 256, 6, 60), c);
  c.M = 0;
  v.emplace_back(random_spec(9, 256, 6, 61), c);
  c.scheme = QuantScheme::nvfp4_per_token();
  v.emplace_back(random_spec(9, 256, 6, 62), c);
  return v;
}

}  // namespace router_cases
