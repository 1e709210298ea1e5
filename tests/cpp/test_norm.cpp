// rmsnorm_and_stage on the CPU backend: y and the new residual against the independent
// norm reference (tests/reference/norm_reference.h), the staged bytes against
// prepare_inputs of the reference's y (the fused call stages its own rows exactly) and,
// for MXFP8, against the independent staging reference; in-place forms, strides, edge
// values, and errors that write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"
#include "megamoe_reference.h"
#include "norm_reference.h"

namespace {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::TensorRef;
namespace nref = megamoe_ref::norm;

uint16_t bf16_of(float f) {  // inputs only: truncation is enough to make bf16 values
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

/// A norm problem: rows [T, H] stored with row stride @p ld (>= H) and column stride @p cs.
struct NormCase {
  int64_t T, H, K, ld, cs;
  bool residual, wf32;
  float eps = 1e-6f;
  std::vector<uint16_t> x, res, yb, rob;  // strided storage
  std::vector<uint16_t> wb;
  std::vector<float> wf;
  std::vector<float> w;        // top-k weights
  std::vector<int32_t> ids;

  NormCase(int64_t t, int64_t h, int64_t k, bool r, bool f32w, uint32_t seed, int64_t cs_ = 1)
      : T(t), H(h), K(k), ld(h * cs_ + 3), cs(cs_), residual(r), wf32(f32w) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 2.0f);
    x.assign(static_cast<size_t>(std::max<int64_t>(T * ld, 1)), 0xDEAD);
    res = x;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < H; ++j) {
        x[static_cast<size_t>(i * ld + j * cs)] = bf16_of(n(rng));
        res[static_cast<size_t>(i * ld + j * cs)] = bf16_of(n(rng) * 0.5f);
      }
    yb.assign(x.size(), 0xBEEF);
    rob.assign(x.size(), 0xBEEF);
    wb.resize(static_cast<size_t>(H));
    wf.resize(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) {
      wf[static_cast<size_t>(j)] = 0.5f + std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
      wb[static_cast<size_t>(j)] = bf16_of(wf[static_cast<size_t>(j)]);
    }
    w.resize(static_cast<size_t>(T * K));
    ids.resize(static_cast<size_t>(T * K));
    for (auto& v : w) v = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    for (auto& v : ids) v = static_cast<int32_t>(rng() % 256);
  }
  TensorRef view(std::vector<uint16_t>& b) { return TensorRef(b.data(), DType::kBFloat16, {T, H}, {ld, cs}); }
  megamoe::RmsNormArgs args(bool want_y, bool want_ro) {
    megamoe::RmsNormArgs a;
    a.x = view(x);
    if (residual) a.residual = view(res);
    a.weight = wf32 ? TensorRef(wf.data(), DType::kFloat32, {H}) : TensorRef(wb.data(), DType::kBFloat16, {H});
    a.eps = eps;
    if (want_y) a.y = view(yb);
    if (want_ro) a.residual_out = view(rob);
    return a;
  }
  std::vector<float> weights() const {
    std::vector<float> r(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) r[static_cast<size_t>(j)] = wf32 ? wf[static_cast<size_t>(j)] : nref::bf16_value(wb[static_cast<size_t>(j)]);
    return r;
  }
  /// The reference rows (dense [T, H]).
  void reference(std::vector<uint16_t>& z, std::vector<uint16_t>& y) const {
    z.resize(static_cast<size_t>(T * H));
    y.resize(static_cast<size_t>(T * H));
    const std::vector<float> wt = weights();
    std::vector<uint16_t> xr(static_cast<size_t>(H)), rr(static_cast<size_t>(H));
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < H; ++j) {
        xr[static_cast<size_t>(j)] = x[static_cast<size_t>(i * ld + j * cs)];
        rr[static_cast<size_t>(j)] = res[static_cast<size_t>(i * ld + j * cs)];
      }
      const nref::Row r = nref::row(xr.data(), residual ? rr.data() : nullptr, wt, eps);
      std::copy(r.z.begin(), r.z.end(), z.begin() + i * H);
      std::copy(r.y.begin(), r.y.end(), y.begin() + i * H);
    }
  }
};

/// Staging outputs of one call, poisoned.
struct Staged {
  std::vector<uint8_t> xq;
  std::vector<uint8_t> sf;  // bytes of int32 words or fp32 scales
  std::vector<float> xs;
  std::vector<int64_t> io;
  std::vector<float> wo;
  megamoe::StageArgs args(NormCase& c, const QuantScheme& q, int64_t rows) {
    const megamoe::OutputShapes o = megamoe::output_shapes(rows, c.H, c.K, q);
    xq.assign(static_cast<size_t>(o.x_q.shape[0] * o.x_q.shape[1]), 0xA5);
    sf.assign(static_cast<size_t>(o.x_sf.shape[0] * o.x_sf.shape[1] * 4), 0xA5);
    io.assign(static_cast<size_t>(rows * c.K), 0x5A5A);
    wo.assign(static_cast<size_t>(rows * c.K), -3.0f);
    megamoe::StageArgs a;
    a.topk_weights = TensorRef(c.w.data(), DType::kFloat32, {c.T, c.K});
    a.topk_ids = TensorRef(c.ids.data(), DType::kInt32, {c.T, c.K});
    a.x_q = TensorRef(xq.data(), o.x_q.dtype, {o.x_q.shape[0], o.x_q.shape[1]});
    a.x_sf = TensorRef(sf.data(), o.x_sf.dtype, {o.x_sf.shape[0], o.x_sf.shape[1]});
    a.topk_idx_out = TensorRef(io.data(), DType::kInt64, {rows, c.K});
    a.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {rows, c.K});
    if (o.x_scales) {
      xs.assign(static_cast<size_t>(rows), -5.0f);
      a.x_scales = TensorRef(xs.data(), DType::kFloat32, {rows});
    }
    a.hidden_quant = q;
    a.full_buffer = rows != c.T;
    return a;
  }
  bool operator==(const Staged& o) const {
    // Floats by their bits (NaN weights compare equal to themselves); empty vectors have no
    // data pointer to compare.
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    };
    return xq == o.xq && sf == o.sf && io == o.io && same(wo, o.wo) && same(xs, o.xs);
  }
};

/// The bits at the view positions of strided storage, densely.
std::vector<uint16_t> dense(const NormCase& c, const std::vector<uint16_t>& b) {
  std::vector<uint16_t> d(static_cast<size_t>(c.T * c.H));
  for (int64_t i = 0; i < c.T; ++i)
    for (int64_t j = 0; j < c.H; ++j) d[static_cast<size_t>(i * c.H + j)] = b[static_cast<size_t>(i * c.ld + j * c.cs)];
  return d;
}

/// Runs the fused call and checks y, residual_out and every staged byte.
void run_and_check(NormCase& c, const QuantScheme& q, bool want_y, bool want_ro, int64_t rows) {
  std::vector<uint16_t> z_ref, y_ref;
  c.reference(z_ref, y_ref);
  Staged fused, plain;
  megamoe::StageArgs s = fused.args(c, q, rows);
  megamoe::RmsNormArgs n = c.args(want_y, want_ro && c.residual);
  ASSERT_NO_THROW(megamoe::rmsnorm_and_stage(n, s));
  if (want_y) {
    ASSERT_EQ(dense(c, c.yb), y_ref) << "y";
  }
  if (want_ro && c.residual) {
    ASSERT_EQ(dense(c, c.rob), z_ref) << "residual_out";
  }
  // prepare_inputs of the reference's rows: the same bytes.
  megamoe::StageArgs p = plain.args(c, q, rows);
  p.hidden_states = TensorRef(y_ref.data(), DType::kBFloat16, {c.T, c.H});
  ASSERT_NO_THROW(megamoe::prepare_inputs(p));
  ASSERT_TRUE(fused == plain) << "staged bytes differ from prepare_inputs(y)";
}

TEST(RmsNormAndStage, MatchesTheReferenceEveryFormatAndForm) {
  const QuantScheme schemes[] = {QuantScheme::mxfp8(), QuantScheme::fp8_fp32_g128(), QuantScheme::mxfp4(),
                                 QuantScheme::nvfp4_per_token(), QuantScheme::mxfp8_e5m2()};
  uint32_t seed = 1;
  for (int64_t T : {1, 5, 37}) {
    for (int64_t H : {128, 384, 2048, 7168}) {
      for (bool residual : {false, true}) {
        for (bool wf32 : {false, true}) {
          const QuantScheme& q = schemes[seed % 5];
          const bool want_y = seed % 2 == 0, want_ro = seed % 3 != 0;
          NormCase c(T, H, 6, residual, wf32, seed, seed % 4 == 3 ? 2 : 1);
          run_and_check(c, q, want_y, want_ro, seed % 3 == 1 ? T + 5 : T);
          ++seed;
        }
      }
    }
  }
}

TEST(RmsNormAndStage, Mxfp8BytesEqualTheIndependentStagingReference) {
  NormCase c(9, 512, 4, true, false, 77u);
  std::vector<uint16_t> z_ref, y_ref;
  c.reference(z_ref, y_ref);
  Staged got;
  megamoe::StageArgs s = got.args(c, QuantScheme::mxfp8(), c.T);
  ASSERT_NO_THROW(megamoe::rmsnorm_and_stage(c.args(false, false), s));
  std::vector<float> hidden(y_ref.size());
  for (size_t i = 0; i < y_ref.size(); ++i) hidden[i] = nref::bf16_value(y_ref[i]);
  std::vector<int64_t> ids(c.ids.begin(), c.ids.end());
  const megamoe_ref::Result r =
      megamoe_ref::stage(hidden.data(), c.T, c.H, ids.data(), c.w.data(), c.K, nullptr, megamoe_ref::Format::fp8(true, 32));
  ASSERT_EQ(got.xq, r.x_q);
  ASSERT_EQ(0, std::memcmp(got.sf.data(), r.sf_words.data(), got.sf.size()));
}

TEST(RmsNormAndStage, InPlaceOutputsAreTheInputsViews) {
  for (bool residual : {false, true}) {
    NormCase c(6, 256, 3, residual, false, 5u);
    std::vector<uint16_t> z_ref, y_ref;
    c.reference(z_ref, y_ref);
    Staged st;
    megamoe::StageArgs s = st.args(c, QuantScheme::mxfp8(), c.T);
    megamoe::RmsNormArgs n = c.args(false, false);
    n.y = n.x;  // vLLM's fused_add_rms_norm: the normalized rows over the input
    if (residual) n.residual_out = n.residual;
    ASSERT_NO_THROW(megamoe::rmsnorm_and_stage(n, s));
    ASSERT_EQ(dense(c, c.x), y_ref);
    if (residual) {
      ASSERT_EQ(dense(c, c.res), z_ref);
    }
  }
  // A shifted view of x is not x: rejected, nothing written.
  NormCase c(4, 128, 2, false, false, 6u);
  Staged st;
  megamoe::StageArgs s = st.args(c, QuantScheme::mxfp8(), c.T);
  megamoe::RmsNormArgs n = c.args(false, false);
  n.y = TensorRef(c.x.data() + 1, DType::kBFloat16, {c.T, c.H}, {c.ld, c.cs});
  const std::vector<uint16_t> before = c.x;
  EXPECT_THROW(megamoe::rmsnorm_and_stage(n, s), megamoe::Error);
  EXPECT_EQ(c.x, before);
}

TEST(RmsNormAndStage, EdgeRows) {
  NormCase c(6, 128, 2, false, false, 9u);
  for (int64_t j = 0; j < c.H; ++j) {
    c.x[static_cast<size_t>(0 * c.ld + j)] = 0x0000;                  // a zero row: y = 0
    c.x[static_cast<size_t>(1 * c.ld + j)] = j % 2 ? 0x7F7F : 0xFF7F;  // bf16 max: the sum overflows to Inf, s = 0
    c.x[static_cast<size_t>(2 * c.ld + j)] = 0x0001;                  // subnormals
  }
  c.x[static_cast<size_t>(3 * c.ld + 7)] = 0x7FC0;  // NaN: the whole row NaN
  c.x[static_cast<size_t>(4 * c.ld + 9)] = 0x7F80;  // +Inf: s = 0, that element NaN, others +-0
  run_and_check(c, QuantScheme::mxfp8(), true, false, c.T);
  std::vector<uint16_t> z_ref, y_ref;
  c.reference(z_ref, y_ref);
  EXPECT_EQ(y_ref[0], 0x0000);
  EXPECT_EQ(y_ref[static_cast<size_t>(3 * c.H)], 0x7FC0);
  EXPECT_EQ(y_ref[static_cast<size_t>(4 * c.H + 9)], 0x7FC0);
  // eps = 0 on a zero row: 1 / sqrt(0) = Inf, 0 * Inf = NaN.
  NormCase e(2, 128, 2, false, true, 10u);
  e.eps = 0.0f;
  for (int64_t j = 0; j < e.H; ++j) e.x[static_cast<size_t>(j)] = 0x8000;
  run_and_check(e, QuantScheme::fp8_fp32_g128(), true, false, e.T);
  std::vector<uint16_t> ez, ey;
  e.reference(ez, ey);
  EXPECT_EQ(ey[0], 0x7FC0);
}

TEST(RmsNormAndStage, ZeroTokensFillOnlyTheTail) {
  NormCase c(0, 256, 4, true, false, 3u);
  Staged st;
  megamoe::StageArgs s = st.args(c, QuantScheme::mxfp8(), 7);
  megamoe::RmsNormArgs n = c.args(false, false);
  n.x = TensorRef(c.x.data(), DType::kBFloat16, {0, 256});
  n.residual = TensorRef(c.res.data(), DType::kBFloat16, {0, 256});
  ASSERT_NO_THROW(megamoe::rmsnorm_and_stage(n, s));
  for (int64_t v : st.io) ASSERT_EQ(v, -1);
  for (uint8_t v : st.xq) ASSERT_EQ(v, 0xA5);
}

TEST(RmsNormAndStage, ExplainNamesTheNormThenTheStaging) {
  NormCase c(3, 256, 2, true, false, 4u);
  Staged st;
  megamoe::StageArgs s = st.args(c, QuantScheme::mxfp8(), c.T);
  const std::string e = megamoe::explain(c.args(false, true), s);
  EXPECT_NE(e.find("cpu backend: rmsnorm T=3 H=256 with residual"), std::string::npos) << e;
  EXPECT_NE(e.find("then cpu backend: mxfp8"), std::string::npos) << e;
  for (uint8_t v : st.xq) ASSERT_EQ(v, 0xA5);  // nothing runs
  megamoe::RmsNormArgs bad = c.args(false, false);
  bad.eps = -1.0f;
  EXPECT_THROW(megamoe::explain(bad, s), megamoe::Error);
}

TEST(RmsNormAndStage, ErrorsWriteNothing) {
  struct Bad {
    const char* what;
    void (*edit)(megamoe::RmsNormArgs&, megamoe::StageArgs&, NormCase&);
  };
  static std::vector<uint16_t> other(4096, 0);
  const Bad bad[] = {
      {"x: expected dtype bfloat16", [](megamoe::RmsNormArgs& n, megamoe::StageArgs&, NormCase&) { n.x.dtype = DType::kFloat16; }},
      {"residual: expected shape", [](megamoe::RmsNormArgs& n, megamoe::StageArgs&, NormCase&) { n.residual->shape[0] = 3; }},
      {"weight: expected shape (256,)", [](megamoe::RmsNormArgs& n, megamoe::StageArgs&, NormCase&) { n.weight.shape[0] = 128; }},
      {"weight: expected dtype", [](megamoe::RmsNormArgs& n, megamoe::StageArgs&, NormCase&) { n.weight.dtype = DType::kInt32; }},
      {"eps: expected a finite value >= 0", [](megamoe::RmsNormArgs& n, megamoe::StageArgs&, NormCase&) { n.eps = -1e-6f; }},
      {"eps: expected a finite value >= 0", [](megamoe::RmsNormArgs& n, megamoe::StageArgs&, NormCase&) { n.eps = std::numeric_limits<float>::quiet_NaN(); }},
      {"residual_out: expected none", [](megamoe::RmsNormArgs& n, megamoe::StageArgs&, NormCase& c) { n.residual.reset(); n.residual_out = c.view(c.rob); }},
      {"x_q: expected memory disjoint from y", [](megamoe::RmsNormArgs& n, megamoe::StageArgs& s, NormCase&) { n.y = TensorRef(s.x_q.data, DType::kBFloat16, {5, 256}); }},
      {"x_sf: expected shape", [](megamoe::RmsNormArgs&, megamoe::StageArgs& s, NormCase&) { s.x_sf.shape[1] = 3; }},
      {"residual_out: expected memory disjoint from x", [](megamoe::RmsNormArgs& n, megamoe::StageArgs&, NormCase& c) { n.residual_out = c.view(c.x); }},
  };
  for (const Bad& b : bad) {
    NormCase c(5, 256, 2, true, false, 12u);
    Staged st;
    megamoe::StageArgs s = st.args(c, QuantScheme::mxfp8(), c.T);
    megamoe::RmsNormArgs n = c.args(true, true);
    b.edit(n, s, c);
    const std::vector<uint16_t> x0 = c.x, r0 = c.res;
    try {
      megamoe::rmsnorm_and_stage(n, s);
      ADD_FAILURE() << b.what << ": accepted";
    } catch (const megamoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.what), std::string::npos) << e.what();
    }
    for (uint16_t v : c.yb) ASSERT_EQ(v, 0xBEEF) << b.what;
    for (uint16_t v : c.rob) ASSERT_EQ(v, 0xBEEF) << b.what;
    for (uint8_t v : st.xq) ASSERT_EQ(v, 0xA5) << b.what;
    ASSERT_EQ(c.x, x0);
    ASSERT_EQ(c.res, r0);
  }
}

}  // namespace
