// Full-buffer mode, routing-only staging and the routed scaling factor (CPU backend):
// rows T..M-1 of the top-k outputs become -1 / +0.0 on every call, activation and scale
// rows there stay untouched, kept weights are fl(w * alpha) (then times their expert's
// scale), and routing-only calls give the top-k bytes of the equivalent full staging call.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"

namespace {

using megamoe::DType;
using megamoe::TensorRef;

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t u32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// One staging problem with M-row outputs, poisoned.
struct Buffers {
  int64_t T, M, H, K;
  std::vector<uint16_t> hs;
  std::vector<float> w;
  std::vector<int32_t> ids;
  std::vector<uint8_t> pad;
  std::vector<uint8_t> xq;
  std::vector<int32_t> sf;
  std::vector<int64_t> io;
  std::vector<float> wo;

  Buffers(int64_t t, int64_t m, int64_t h, int64_t k, uint32_t seed) : T(t), M(m), H(h), K(k) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 3.0f);
    hs.resize(static_cast<size_t>(T * H));
    for (auto& v : hs) v = bf16_bits(n(rng));
    w.resize(static_cast<size_t>(T * K));
    for (auto& v : w) v = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    if (!w.empty()) w[0] = f32(0x7FC01234u);  // a NaN weight with a payload
    ids.resize(static_cast<size_t>(T * K));
    for (auto& v : ids) v = static_cast<int32_t>(rng() % 384);
    pad.resize(static_cast<size_t>(T));
    for (auto& v : pad) v = rng() % 4 == 0 ? 1 : 0;
    xq.assign(static_cast<size_t>(M * H), 0xAB);
    sf.assign(static_cast<size_t>(M * (H / 128)), 0x5A5A5A5A);
    io.assign(static_cast<size_t>(M * K), 0x1111111111111111);
    wo.assign(static_cast<size_t>(M * K), f32(0x7F812345u));
  }

  megamoe::StageArgs args(bool full) {
    megamoe::StageArgs a;
    const int64_t R = full ? M : T;
    a.hidden_states = TensorRef(hs.data(), DType::kBFloat16, {T, H});
    a.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
    a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
    a.is_padding = TensorRef(pad.data(), DType::kUInt8, {T});
    a.x_q = TensorRef(xq.data(), DType::kFloat8E4M3, {R, H});
    a.x_sf = TensorRef(sf.data(), DType::kInt32, {R, H / 128});
    a.topk_idx_out = TensorRef(io.data(), DType::kInt64, {R, K});
    a.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {R, K});
    a.full_buffer = full;
    return a;
  }
  megamoe::RoutingArgs routing(bool full) {
    megamoe::RoutingArgs r;
    const int64_t R = full ? M : T;
    r.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
    r.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
    r.is_padding = TensorRef(pad.data(), DType::kUInt8, {T});
    r.topk_idx_out = TensorRef(io.data(), DType::kInt64, {R, K});
    r.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {R, K});
    r.full_buffer = full;
    return r;
  }
};

/// Every output byte still its poison (a rejected call writes nothing).
void expect_poisoned(const Buffers& b) {
  for (uint8_t v : b.xq) ASSERT_EQ(v, 0xAB);
  for (int32_t v : b.sf) ASSERT_EQ(v, 0x5A5A5A5A);
  for (int64_t v : b.io) ASSERT_EQ(v, 0x1111111111111111);
  for (float v : b.wo) ASSERT_EQ(u32(v), 0x7F812345u);
}

/// The expected top-k rows: kept ids widened, weights times alpha (one fp32 rounding,
/// computed here in double and rounded once), padded and tail rows -1 / +0.0.
void expect_topk(const Buffers& b, const std::optional<float>& alpha, int64_t rows = -1) {
  for (int64_t t = 0; t < (rows < 0 ? b.M : rows); ++t) {
    const bool keep = t < b.T && b.pad[static_cast<size_t>(t)] == 0;
    for (int64_t k = 0; k < b.K; ++k) {
      const size_t i = static_cast<size_t>(t * b.K + k);
      if (!keep) {
        ASSERT_EQ(b.io[i], -1) << "t=" << t << " k=" << k;
        ASSERT_EQ(u32(b.wo[i]), 0u) << "t=" << t << " k=" << k;
        continue;
      }
      ASSERT_EQ(b.io[i], b.ids[i]);
      const float w = b.w[i];
      uint32_t want = u32(w);
      if (alpha) want = u32(static_cast<float>(static_cast<double>(w) * *alpha));
      if (alpha && std::isnan(static_cast<double>(w) * *alpha)) want = 0x7FC00000u;  // Inf times 0
      if (alpha && std::isnan(w)) want = u32(w);  // a NaN weight keeps its bits
      ASSERT_EQ(u32(b.wo[i]), want) << "t=" << t << " k=" << k;
    }
  }
}

TEST(FullBuffer, TailRowsFilledEveryCallActivationRowsUntouched) {
  for (int64_t T : {0, 1, 5, 37}) {
    Buffers full(T, 64, 256, 6, 17u + static_cast<uint32_t>(T));
    Buffers ref(T, T, 256, 6, 17u + static_cast<uint32_t>(T));  // same inputs, T-row outputs
    ASSERT_NO_THROW(megamoe::prepare_inputs(full.args(true)));
    if (T > 0) {
      ASSERT_NO_THROW(megamoe::prepare_inputs(ref.args(false)));
    }
    expect_topk(full, std::nullopt);
    // Rows < T equal the plain call's bytes; rows >= T of x_q and x_sf keep their poison.
    if (T > 0) {  // (memcmp must not see the null data of an empty vector)
      ASSERT_EQ(0, std::memcmp(full.xq.data(), ref.xq.data(), static_cast<size_t>(T * 256)));
      ASSERT_EQ(0, std::memcmp(full.sf.data(), ref.sf.data(), static_cast<size_t>(T * 2 * 4)));
    }
    for (size_t i = static_cast<size_t>(T * 256); i < full.xq.size(); ++i) ASSERT_EQ(full.xq[i], 0xAB);
    for (size_t i = static_cast<size_t>(T * 2); i < full.sf.size(); ++i) ASSERT_EQ(full.sf[i], 0x5A5A5A5A);
    // No memo: a second call after the tail is scribbled on fills it again.
    for (auto& v : full.io) v = 77;
    for (auto& v : full.wo) v = f32(0x7F812345u);
    ASSERT_NO_THROW(megamoe::prepare_inputs(full.args(true)));
    expect_topk(full, std::nullopt);
  }
}

TEST(FullBuffer, ZeroTokensWithoutFullBufferStaysANoOp) {
  Buffers b(0, 16, 128, 4, 3u);
  megamoe::StageArgs a = b.args(false);
  a.topk_idx_out = TensorRef(b.io.data(), DType::kInt64, {16, 4});  // would be wrong: not read
  ASSERT_NO_THROW(megamoe::prepare_inputs(a));
  for (int64_t v : b.io) ASSERT_EQ(v, 0x1111111111111111);
}

TEST(FullBuffer, RejectsShortBuffersAndMismatchedRows) {
  Buffers b(8, 8, 128, 4, 5u);
  megamoe::StageArgs a = b.args(true);
  a.topk_idx_out = TensorRef(b.io.data(), DType::kInt64, {4, 4});
  EXPECT_THROW(megamoe::prepare_inputs(a), megamoe::Error);  // fewer rows than tokens
  expect_poisoned(b);
  a = b.args(true);
  a.topk_weights_out = TensorRef(b.wo.data(), DType::kFloat32, {7, 4});
  EXPECT_THROW(megamoe::prepare_inputs(a), megamoe::Error);  // rows differ from topk_idx_out
  expect_poisoned(b);
  a = b.args(true);
  a.x_sf = TensorRef(b.sf.data(), DType::kInt32, {7, 1});
  EXPECT_THROW(megamoe::prepare_inputs(a), megamoe::Error);
  expect_poisoned(b);
}

TEST(RoutedScaling, KeptWeightsScaledOnceMaskedStayZero) {
  for (float alpha : {1.5f, 2.5f, 0.1f, -3.0f, 1.0f, 0.0f, -0.0f, 1e-30f}) {
    Buffers b(29, 40, 128, 8, 11u);
    // Kept +-Inf (times 0: a NaN the product makes, written as 0x7FC00000) and a subnormal.
    b.pad[0] = 0;
    b.w[1] = std::numeric_limits<float>::infinity();
    b.w[2] = -std::numeric_limits<float>::infinity();
    b.w[3] = f32(0x00000ABCu);
    megamoe::StageArgs a = b.args(true);
    a.routed_scaling_factor = alpha;
    ASSERT_NO_THROW(megamoe::prepare_inputs(a));
    expect_topk(b, alpha);
    Buffers r(29, 40, 128, 8, 11u);  // the same through routing-only staging
    r.pad = b.pad;
    r.w = std::vector<float>(b.w);
    megamoe::RoutingArgs ra = r.routing(true);
    ra.routed_scaling_factor = alpha;
    ASSERT_NO_THROW(megamoe::stage_routing(ra));
    expect_topk(r, alpha);
  }
  Buffers b(4, 4, 128, 2, 1u);
  megamoe::StageArgs a = b.args(false);
  a.routed_scaling_factor = std::numeric_limits<float>::infinity();
  EXPECT_THROW(megamoe::prepare_inputs(a), megamoe::Error);
  expect_poisoned(b);
}

/// fl(a * b) by the contract's weight rule: a NaN weight keeps its bits, a NaN the product
/// makes is 0x7FC00000 (the double product of two floats is exact, so one rounding).
uint32_t weight_product(uint32_t a, float b) {
  const float fa = f32(a);
  if (std::isnan(fa)) return a;
  const double d = static_cast<double>(fa) * static_cast<double>(b);
  return std::isnan(d) ? 0x7FC00000u : u32(static_cast<float>(d));
}

// Per-expert scales: a kept entry whose id is in [0, E) gets fl(fl(w * alpha) * s[id]) (or
// fl(w * s[id]) without alpha); other ids keep their weight; padded and tail rows -1 / +0;
// any stride of the table; staging and routing-only alike.
TEST(ExpertScales, KeptWeightsOfIdsInTheTableScaledOnce) {
  const int64_t E = 200;  // ids are drawn from [0, 384): about half fall past the table
  for (int64_t stride : {1, 3, -2}) {
    for (bool with_alpha : {false, true}) {
      for (bool routing_only : {false, true}) {
        Buffers b(37, 50, 128, 6, 31u);
        b.ids[2] = -1;         // a masked id (SGLang writes -1): never scaled
        b.ids[3] = -7;
        b.ids[4] = E - 1;      // the last entry of the table
        b.ids[5] = E;          // one past it
        b.w[6] = std::numeric_limits<float>::infinity();
        b.ids[6] = 0;          // Inf times a zero scale: the product's NaN
        b.w[7] = f32(0x00000003u);
        b.ids[7] = 1;          // a subnormal weight
        b.pad[0] = b.pad[1] = 0;
        std::vector<float> table(static_cast<size_t>(E * std::abs(stride)), f32(0x7FBADBADu));
        std::mt19937 rng(5u);
        std::vector<float> s(static_cast<size_t>(E));
        for (auto& v : s) v = std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng);
        s[0] = 0.0f;
        s[1] = 1e30f;
        s[2] = std::numeric_limits<float>::quiet_NaN();  // a NaN scale: the product's NaN
        s[3] = -0.0f;
        float* base = stride > 0 ? table.data() : table.data() + (E - 1) * (-stride);
        for (int64_t e = 0; e < E; ++e) base[e * stride] = s[static_cast<size_t>(e)];
        TensorRef es(base, DType::kFloat32, {E}, {stride});
        const std::optional<float> alpha = with_alpha ? std::optional<float>(0.75f) : std::nullopt;
        if (routing_only) {
          megamoe::RoutingArgs r = b.routing(true);
          r.routed_scaling_factor = alpha;
          r.expert_scales = es;
          ASSERT_NO_THROW(megamoe::stage_routing(r));
        } else {
          megamoe::StageArgs a = b.args(true);
          a.routed_scaling_factor = alpha;
          a.expert_scales = es;
          ASSERT_NO_THROW(megamoe::prepare_inputs(a));
        }
        for (int64_t t = 0; t < b.M; ++t) {
          const bool keep = t < b.T && b.pad[static_cast<size_t>(t)] == 0;
          for (int64_t k = 0; k < b.K; ++k) {
            const size_t i = static_cast<size_t>(t * b.K + k);
            if (!keep) {
              ASSERT_EQ(b.io[i], -1);
              ASSERT_EQ(u32(b.wo[i]), 0u);
              continue;
            }
            ASSERT_EQ(b.io[i], b.ids[i]);
            uint32_t want = u32(b.w[i]);
            if (alpha) want = weight_product(want, *alpha);
            const int64_t id = b.ids[i];
            if (id >= 0 && id < E) want = weight_product(want, s[static_cast<size_t>(id)]);
            ASSERT_EQ(u32(b.wo[i]), want) << "t=" << t << " k=" << k << " id=" << id << " stride=" << stride;
          }
        }
      }
    }
  }
}

TEST(ExpertScales, BadTablesAreRejectedBeforeAnyWrite) {
  std::vector<float> ok(16, 1.0f);
  for (int c = 0; c < 4; ++c) {
    Buffers b(5, 5, 128, 2, 3u);
    megamoe::StageArgs a = b.args(false);
    std::string want;
    if (c == 0) {
      a.expert_scales = TensorRef(ok.data(), DType::kFloat32, {4, 4});
      want = "expert_scales";
    } else if (c == 1) {
      a.expert_scales = TensorRef(ok.data(), DType::kBFloat16, {16});
      want = "expert_scales";
    } else if (c == 2) {
      a.expert_scales = TensorRef(b.wo.data(), DType::kFloat32, {4});  // overlaps an output
      want = "overlap";
    } else {
      a.expert_scales = TensorRef(nullptr, DType::kFloat32, {16});
      want = "expert_scales";
    }
    try {
      megamoe::prepare_inputs(a);
      ADD_FAILURE() << "case " << c << " accepted";
    } catch (const megamoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    expect_poisoned(b);
  }
  // An empty table is valid: no id is inside it, every weight is kept as it is.
  Buffers b(5, 5, 128, 2, 3u);
  megamoe::RoutingArgs r = b.routing(false);
  r.expert_scales = TensorRef(ok.data(), DType::kFloat32, {0});
  ASSERT_NO_THROW(megamoe::stage_routing(r));
  expect_topk(b, std::nullopt);
}

TEST(RoutingOnly, EqualsTheTopkOfAFullStagingCall) {
  for (bool full : {false, true}) {
    for (int64_t T : {0, 3, 100}) {
      Buffers staged(T, 128, 128, 6, 23u), routed(T, 128, 128, 6, 23u);
      megamoe::StageArgs a = staged.args(full);
      a.routed_scaling_factor = 1.5f;
      megamoe::RoutingArgs r = routed.routing(full);
      r.routed_scaling_factor = 1.5f;
      ASSERT_NO_THROW(megamoe::prepare_inputs(a));
      ASSERT_NO_THROW(megamoe::stage_routing(r));
      ASSERT_EQ(staged.io, routed.io);
      if (!staged.wo.empty()) {
        ASSERT_EQ(0, std::memcmp(staged.wo.data(), routed.wo.data(), staged.wo.size() * 4));
      }
      for (uint8_t v : routed.xq) ASSERT_EQ(v, 0xAB);  // routing-only touches no activations
      expect_topk(routed, 1.5f, full ? routed.M : T);
      if (!full) {
        for (size_t i = static_cast<size_t>(T * 6); i < routed.io.size(); ++i) ASSERT_EQ(routed.io[i], 0x1111111111111111);
      }
    }
  }
}

// The caller's rounding mode changes no byte of routing-only staging (the scaled weights'
// products are rounded to nearest), and the caller gets it back.
TEST(RoutingOnly, CallersRoundingModeChangesNothing) {
  for (int mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    Buffers b(7, 7, 128, 4, 9u);
    for (auto& v : b.w) v = f32(0x3F800001u);  // (1 + 2^-23)^2: the product's rounding shows
    b.pad.assign(b.pad.size(), 0);
    megamoe::RoutingArgs ra = b.routing(false);
    ra.routed_scaling_factor = f32(0x3F800001u);
    const int saved = std::fegetround();
    std::fesetround(mode);
    megamoe::stage_routing(ra);
    EXPECT_EQ(std::fegetround(), mode) << "the caller's rounding mode was not restored";
    std::fesetround(saved);
    for (float v : b.wo) ASSERT_EQ(u32(v), 0x3F800002u) << "mode " << mode;
  }
}

TEST(RoutingOnly, ValidatesLikeStaging) {
  Buffers b(6, 6, 128, 3, 2u);
  megamoe::RoutingArgs r = b.routing(false);
  r.topk_weights = TensorRef(b.w.data(), DType::kFloat32, {6, 2});
  try {
    megamoe::stage_routing(r);
    ADD_FAILURE() << "accepted";
  } catch (const megamoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk_weights and topk_ids to have the same shape"), std::string::npos);
  }
  expect_poisoned(b);
  const std::vector<float> w_before = b.w;
  r = b.routing(false);
  r.topk_idx_out = TensorRef(b.w.data(), DType::kInt64, {3, 3});  // overlaps an input
  EXPECT_THROW(megamoe::stage_routing(r), megamoe::Error);
  expect_poisoned(b);
  EXPECT_EQ(0, std::memcmp(b.w.data(), w_before.data(), w_before.size() * 4));  // the overlapped input too
}

// Empty top-k (K == 0) with a huge max_tokens, or empty activations (H == 0) with a huge T:
// nothing to write, so the calls must return at once (a row loop over 2^62 rows never
// ends; found by tests/fuzz).
TEST(FullBuffer, EmptyRowsOfAHugeBufferReturnAtOnce) {
  constexpr int64_t kHuge = int64_t{1} << 62;
  std::vector<float> w(4);
  std::vector<int64_t> ids(4);
  megamoe::RoutingArgs r;
  r.topk_weights = TensorRef(w.data(), DType::kFloat32, {4, 0});
  r.topk_ids = TensorRef(ids.data(), DType::kInt64, {4, 0});
  r.topk_idx_out = TensorRef(nullptr, DType::kInt64, {kHuge, 0});
  r.topk_weights_out = TensorRef(nullptr, DType::kFloat32, {kHuge, 0});
  r.full_buffer = true;
  megamoe::stage_routing(r);

  megamoe::StageArgs a;
  a.hidden_states = TensorRef(nullptr, DType::kBFloat16, {kHuge, 0});
  a.topk_weights = TensorRef(nullptr, DType::kFloat32, {kHuge, 0});
  a.topk_ids = TensorRef(nullptr, DType::kInt64, {kHuge, 0});
  a.x_q = TensorRef(nullptr, DType::kFloat8E4M3, {kHuge, 0});
  a.x_sf = TensorRef(nullptr, DType::kInt32, {kHuge, 0});
  a.topk_idx_out = TensorRef(nullptr, DType::kInt64, {kHuge, 0});
  a.topk_weights_out = TensorRef(nullptr, DType::kFloat32, {kHuge, 0});
  megamoe::prepare_inputs(a);
  a.full_buffer = true;
  megamoe::prepare_inputs(a);
}

}  // namespace
