// mhc_pre_and_stage on the CPU backend: post_mix, comb_mix, pre_mix, layer_input and y
// against the independent mHC reference (tests/reference/mhc_reference.h), every element
// and every gap byte of poisoned strided outputs; the staged bytes against prepare_inputs
// of the reference's y (every format, full-buffer tails); y against rmsnorm_and_stage of
// the call's own layer_input; golden edge rows; a bound against a float64 rendering of the
// peer's (vLLM's) mathematics; errors that write nothing; CUDA tensors refused by a build
// without the CUDA backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"
#include "mhc_reference.h"
#include "test_util.h"

namespace {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::TensorRef;
using mt::Buf;
using mt::Layout;
namespace mref = megamoe_ref::mhc;

constexpr uint8_t kOutPoison = 0xEE;  ///< mHC outputs' poison (bf16 0xEEEE, fp32 -3.7e28)

uint16_t bf16_trunc(float f) {  // inputs only: truncation is enough to make bf16 values
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

template <typename V>
std::vector<uint8_t> bytes_of(const std::vector<V>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(V));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// Buffer of a [rows, cols] (cols < 0: 1-D) view in layout @p l holding the dense elements @p dense.
template <typename V>
Buf input_buf(DType dt, int64_t rows, int64_t cols, Layout l, const std::vector<V>& dense) {
  Buf b = mt::make_buf(dt, rows, cols, l, false, mt::kGapFill);
  mt::scatter(b, bytes_of(dense));
  return b;
}

/// Expected image of a poisoned output: its gaps as they are, its elements @p dense.
template <typename V>
std::vector<uint8_t> image(const Buf& b, const std::vector<V>& dense) {
  Buf e = b;
  mt::scatter(e, bytes_of(dense));
  return e.mem;
}

/// One mHC problem: dense values, their strided buffers, poisoned outputs.
struct MhcCase {
  int64_t T, H, K;
  int hc, M;
  bool wf32, with_pre_in;
  mref::Params prm;
  std::vector<uint16_t> x;     // [T][K] bf16 bits
  std::vector<float> fn;       // [M][K]
  float scale[3];
  std::vector<float> base;     // [M]
  std::vector<uint16_t> wb;    // [H] (bf16 weight)
  std::vector<float> wf;       // [H] (fp32 weight)
  std::vector<float> pre_in;   // [T][hc]
  Layout in_layout, out_layout;
  Buf res, fnb, scb, baseb, wbuf, pinb;
  Buf post, comb, pre, z, y;

  MhcCase(int64_t t, int64_t h, int streams, uint32_t seed, Layout in = Layout::kContig, Layout out = Layout::kContig,
          bool f32w = false, bool pin = false)
      : T(t), H(h), K(streams * h), hc(streams), M(streams * (streams + 2)), wf32(f32w), with_pre_in(pin),
        in_layout(in), out_layout(out) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    x.resize(static_cast<size_t>(T * K));
    for (auto& v : x) v = bf16_trunc(n(rng) * 1.5f);
    fn.resize(static_cast<size_t>(M * K));
    for (auto& v : fn) v = n(rng) * 0.02f;
    for (float& s : scale) s = 0.05f + std::uniform_real_distribution<float>(0.0f, 0.5f)(rng);
    base.resize(static_cast<size_t>(M));
    for (auto& v : base) v = n(rng) * 0.3f;
    wb.resize(static_cast<size_t>(H));
    wf.resize(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) {
      wf[static_cast<size_t>(j)] = 0.5f + std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
      wb[static_cast<size_t>(j)] = bf16_trunc(wf[static_cast<size_t>(j)]);
    }
    pre_in.resize(static_cast<size_t>(T * hc));
    for (auto& v : pre_in) v = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    build();
  }
  /// (Re)build every buffer from the dense values; outputs poisoned.
  void build() {
    res = input_buf(DType::kBFloat16, T, K, in_layout, x);
    fnb = input_buf(DType::kFloat32, M, K, in_layout, fn);
    scb = input_buf(DType::kFloat32, 3, -1, in_layout, std::vector<float>(scale, scale + 3));
    baseb = input_buf(DType::kFloat32, M, -1, in_layout, base);
    wbuf = wf32 ? input_buf(DType::kFloat32, H, -1, in_layout, wf) : input_buf(DType::kBFloat16, H, -1, in_layout, wb);
    pinb = input_buf(DType::kFloat32, T, hc, in_layout, pre_in);
    post = mt::make_buf(DType::kFloat32, T, hc, out_layout, false, kOutPoison);
    comb = mt::make_buf(DType::kFloat32, T, int64_t{hc} * hc, out_layout, false, kOutPoison);
    pre = mt::make_buf(DType::kFloat32, T, hc, out_layout, false, kOutPoison);
    z = mt::make_buf(DType::kBFloat16, T, H, out_layout, false, kOutPoison);
    y = mt::make_buf(DType::kBFloat16, T, H, out_layout, false, kOutPoison);
  }
  megamoe::MhcPreArgs args(bool want_pre, bool want_z, bool want_y) {
    megamoe::MhcPreArgs a;
    a.residual = res.ref();
    a.fn = fnb.ref();
    a.hc_scale = scb.ref();
    a.hc_base = baseb.ref();
    a.norm_weight = wbuf.ref();
    a.rms_eps = prm.rms_eps;
    a.hc_pre_eps = prm.pre_eps;
    a.hc_sinkhorn_eps = prm.sinkhorn_eps;
    a.hc_post_mult_value = prm.post_mult;
    a.sinkhorn_repeat = prm.repeat;
    a.norm_eps = prm.norm_eps;
    if (with_pre_in) a.pre_mix_in = pinb.ref();
    a.post_mix = post.ref();
    a.comb_mix = comb.ref();
    if (want_pre) a.pre_mix = pre.ref();
    if (want_z) a.layer_input = z.ref();
    if (want_y) a.y = y.ref();
    return a;
  }
  std::vector<float> weights() const {
    std::vector<float> r(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) r[static_cast<size_t>(j)] = wf32 ? wf[static_cast<size_t>(j)] : megamoe_ref::norm::bf16_value(wb[static_cast<size_t>(j)]);
    return r;
  }
  /// The reference, concatenated over tokens.
  mref::Token reference() const {
    mref::Token all;
    const std::vector<float> w = weights();
    for (int64_t t = 0; t < T; ++t) {
      const mref::Token r = mref::token(&x[static_cast<size_t>(t * K)], hc, static_cast<size_t>(H), fn, scale, base,
                                        with_pre_in ? &pre_in[static_cast<size_t>(t * hc)] : nullptr, w, prm);
      all.pre.insert(all.pre.end(), r.pre.begin(), r.pre.end());
      all.post.insert(all.post.end(), r.post.begin(), r.post.end());
      all.comb.insert(all.comb.end(), r.comb.begin(), r.comb.end());
      all.z.insert(all.z.end(), r.z.begin(), r.z.end());
      all.y.insert(all.y.end(), r.y.begin(), r.y.end());
    }
    return all;
  }
};

/// The staging outputs of one call for any scheme (built from output_shapes), poisoned.
struct Staged {
  Buf xq, sf, io, wo;
  std::optional<Buf> xs, gs;
  std::vector<float> w;
  std::vector<int32_t> ids;
  megamoe::StageArgs args(int64_t T, int64_t H, int64_t K, const QuantScheme& q, int64_t rows, Layout l,
                          uint32_t seed) {
    std::mt19937 rng(seed);
    w.resize(static_cast<size_t>(T * K));
    ids.resize(static_cast<size_t>(T * K));
    for (auto& v : w) v = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    for (auto& v : ids) v = static_cast<int32_t>(rng() % 256);
    const megamoe::OutputShapes o = megamoe::output_shapes(rows, H, K, q);
    xq = mt::make_buf(o.x_q.dtype, o.x_q.shape[0], o.x_q.shape[1], l, false, 0xA5);
    sf = mt::make_buf(o.x_sf.dtype, o.x_sf.shape[0], o.x_sf.shape[1], l, false, 0xA5);
    io = mt::make_buf(DType::kInt64, rows, K, l, false, 0x5A);
    wo = mt::make_buf(DType::kFloat32, rows, K, l, false, 0xA5);
    megamoe::StageArgs a;
    a.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
    a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
    a.x_q = xq.ref();
    a.x_sf = sf.ref();
    a.topk_idx_out = io.ref();
    a.topk_weights_out = wo.ref();
    if (o.x_scales) {
      xs = mt::make_buf(DType::kFloat32, rows, -1, l, false, 0xA5);
      a.x_scales = xs->ref();
    }
    if (q.scale2 == megamoe::Scale2::kStatic) {
      gs = mt::make_scalar(DType::kFloat32, false, false, 0x7F, 0.75f);
      a.global_scale = gs->ref();
    } else if (q.scale2 == megamoe::Scale2::kOnline) {
      gs = mt::make_scalar(DType::kFloat32, false, false, 0xA5, uint32_t{0xA5A5A5A5u});
      a.global_scale = gs->ref();
    }
    a.hidden_quant = q;
    a.full_buffer = rows != T;
    return a;
  }
  std::vector<const Buf*> outputs() const {
    std::vector<const Buf*> v = {&xq, &sf, &io, &wo};
    if (xs) v.push_back(&*xs);
    if (gs) v.push_back(&*gs);
    return v;
  }
};

const QuantScheme kSchemes[] = {QuantScheme::mxfp8(),
                                QuantScheme::fp8_fp32_g128(),
                                QuantScheme::fp8_ue8m0_g128(),
                                QuantScheme::fp8_fp32_g32(),
                                QuantScheme::mxfp4(),
                                QuantScheme::mxfp4(megamoe::Rounding::kNearestEven),
                                QuantScheme::nvfp4_per_token(),
                                QuantScheme::nvfp4_static(),
                                QuantScheme::nvfp4_online(),
                                QuantScheme::mxfp8_e5m2(),
                                QuantScheme::bf16()};
constexpr uint32_t kNumSchemes = sizeof(kSchemes) / sizeof(kSchemes[0]);

/// Scheme @p i of the list, usable at width @p H: UE8M0 scales of 128 columns pack four to
/// a word (H % 512 == 0), else their fp32 twin.
QuantScheme scheme_for(uint32_t i, int64_t H) {
  const QuantScheme& q = kSchemes[i % kNumSchemes];
  return q == QuantScheme::fp8_ue8m0_g128() && H % 512 != 0 ? QuantScheme::fp8_fp32_g128() : q;
}

/// Runs the fused call and checks every mHC output (elements and gaps) against the
/// reference and every staged byte against prepare_inputs of the reference's y.
void run_and_check(MhcCase& c, const QuantScheme& q, bool want_pre, bool want_z, bool want_y, int64_t rows,
                   Layout stage_layout = Layout::kContig) {
  SCOPED_TRACE("T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " hc=" + std::to_string(c.hc) + " " +
               mt::scheme_tag(q) + " rows=" + std::to_string(rows));
  const mref::Token r = c.reference();
  const std::vector<uint8_t> post0 = c.post.mem, pre0 = c.pre.mem, z0 = c.z.mem, y0 = c.y.mem;
  Staged fused, plain;
  const megamoe::StageArgs s = fused.args(c.T, c.H, 4, q, rows, stage_layout, 7u);
  ASSERT_NO_THROW(megamoe::mhc_pre_and_stage(c.args(want_pre, want_z, want_y), s));
  EXPECT_TRUE(mt::assert_bitwise_equal("post_mix", c.post, image(c.post, r.post)));
  EXPECT_TRUE(mt::assert_bitwise_equal("comb_mix", c.comb, image(c.comb, r.comb)));
  EXPECT_TRUE(mt::assert_bitwise_equal("pre_mix", c.pre, want_pre ? image(c.pre, r.pre) : pre0));
  EXPECT_TRUE(mt::assert_bitwise_equal("layer_input", c.z, want_z ? image(c.z, r.z) : z0));
  EXPECT_TRUE(mt::assert_bitwise_equal("y", c.y, want_y ? image(c.y, r.y) : y0));
  // prepare_inputs of the reference's rows: the same bytes, gaps included.
  megamoe::StageArgs p = plain.args(c.T, c.H, 4, q, rows, stage_layout, 7u);
  std::vector<uint16_t> yr = r.y;
  p.hidden_states = TensorRef(yr.data(), DType::kBFloat16, {c.T, c.H});
  ASSERT_NO_THROW(megamoe::prepare_inputs(p));
  const auto fo = fused.outputs(), po = plain.outputs();
  for (size_t i = 0; i < fo.size(); ++i) {
    EXPECT_TRUE(mt::assert_bitwise_equal("staged output", *fo[i], po[i]->mem)) << "output " << i;
  }
}

TEST(MhcPreAndStage, MatchesTheReferenceEveryFormatStreamCountAndLayout) {
  const Layout layouts[] = {Layout::kContig, Layout::kPadded, Layout::kNegCols, Layout::kStride2, Layout::kTransposed,
                            Layout::kNegRows};
  uint32_t seed = 1;
  for (int hc : {1, 2, 3, 4, 6, 8, 16}) {
    for (int64_t H : {128, 384, 1152}) {
      for (int64_t T : {1, 3, 9}) {
        const Layout in = layouts[seed % 6], out = layouts[(seed / 2 + 3) % 6];
        MhcCase c(T, H, hc, seed, in, out, seed % 2 == 1, seed % 3 == 2);
        c.prm.repeat = 1 + static_cast<int>(seed % 24);
        run_and_check(c, scheme_for(seed, H), seed % 2 == 0, seed % 3 != 0, seed % 4 != 1, seed % 5 == 2 ? T + 3 : T,
                      layouts[(seed + 1) % 6]);
        ++seed;
      }
    }
  }
}

TEST(MhcPreAndStage, DeepSeekV4ShapesEveryFormat) {
  // hc = 4, H = 4096 and 7168 (28672 mixed columns, not a multiple of 1024 per stream for
  // 7168 / 1024 = 7 chunks of the staging), twenty Sinkhorn rounds, post multiplier 2.
  uint32_t seed = 100;
  for (int64_t H : {4096, 7168}) {
    for (uint32_t i = 0; i < kNumSchemes; ++i) {
      MhcCase c(2, H, 4, seed++);
      run_and_check(c, scheme_for(i, H), true, true, seed % 2 == 0, c.T);
    }
  }
}

TEST(MhcPreAndStage, YIsRmsNormOfTheCallsOwnLayerInput) {
  // The fused call equals mHC pre, then rmsnorm_and_stage of its layer_input, bit for bit.
  for (bool wf32 : {false, true}) {
    MhcCase c(7, 640, 4, 40u + static_cast<uint32_t>(wf32), Layout::kPadded, Layout::kNegCols, wf32);
    Staged fused, normed;
    ASSERT_NO_THROW(megamoe::mhc_pre_and_stage(c.args(false, true, true),
                                               fused.args(c.T, c.H, 3, QuantScheme::fp8_fp32_g128(), c.T, Layout::kContig, 3u)));
    megamoe::RmsNormArgs n;
    n.x = c.z.ref();
    n.weight = c.wbuf.ref();
    n.eps = c.prm.norm_eps;
    Buf y2 = mt::make_buf(DType::kBFloat16, c.T, c.H, Layout::kNegCols, false, kOutPoison);
    n.y = y2.ref();
    ASSERT_NO_THROW(megamoe::rmsnorm_and_stage(n, normed.args(c.T, c.H, 3, QuantScheme::fp8_fp32_g128(), c.T,
                                                              Layout::kContig, 3u)));
    EXPECT_TRUE(mt::assert_bitwise_equal("y", c.y, y2.mem));
    const auto fo = fused.outputs(), no = normed.outputs();
    for (size_t i = 0; i < fo.size(); ++i) EXPECT_TRUE(mt::assert_bitwise_equal("staged", *fo[i], no[i]->mem));
  }
}

TEST(MhcPreAndStage, GoldenEdgeRows) {
  MhcCase c(8, 256, 4, 9u);
  auto set_stream = [&](int64_t t, int j, uint16_t v) {
    for (int64_t h = 0; h < c.H; ++h) c.x[static_cast<size_t>(t * c.K + j * c.H + h)] = v;
  };
  for (int j = 0; j < 4; ++j) {
    set_stream(0, j, 0x0000);                         // a zero row: mixes 0, logits = base, z = y = 0
    set_stream(1, j, j % 2 ? 0x7F7F : 0xFF7F);       // bf16 max: the sum of squares overflows, r = 0
    set_stream(2, j, 0x0001);                         // subnormal streams
  }
  set_stream(3, 2, 0x7FC0);                           // NaN in one stream: everything NaN
  c.x[static_cast<size_t>(4 * c.K + 1 * c.H + 5)] = 0x7F80;  // +Inf in one stream
  set_stream(5, 0, 0x3F80);                           // streams of +-1, 2, ...
  set_stream(5, 1, 0xBF80);
  set_stream(5, 2, 0x4000);
  set_stream(5, 3, 0x8000);                           // -0
  set_stream(6, 1, 0x8000);                           // a negative-zero stream among random ones
  c.build();
  run_and_check(c, QuantScheme::mxfp8(), true, true, true, c.T);
  const mref::Token r = c.reference();
  auto u32 = [](float f) { return megamoe_ref::detail::bits_of(f); };
  for (int64_t h = 0; h < c.H; ++h) EXPECT_EQ(r.y[static_cast<size_t>(h)], 0x0000);  // zero row
  for (int i = 0; i < 16; ++i) EXPECT_EQ(u32(r.comb[static_cast<size_t>(3 * 16 + i)]), 0x7FC00000u);  // NaN row
  for (int j = 0; j < 4; ++j) EXPECT_EQ(u32(r.post[static_cast<size_t>(3 * 4 + j)]), 0x7FC00000u);
  EXPECT_EQ(r.y[static_cast<size_t>(3 * c.H)], 0x7FC0);
  // The zero row's logits are the biases: its post gates are sigmoid(base) * 2.
  for (int j = 0; j < 4; ++j) {
    const float g = c.base[static_cast<size_t>(4 + j)];
    EXPECT_NEAR(r.post[static_cast<size_t>(j)], 2.0 / (1.0 + std::exp(-static_cast<double>(g))), 1e-6);
  }
}

TEST(MhcPreAndStage, CountsTheNonFiniteValuesOfY) {
  // A NaN stream makes its token's y all NaN; the counter adds y's non-finite values (as
  // prepare_inputs of y does), not the residual's.
  MhcCase c(4, 256, 4, 14u);
  for (int64_t h = 0; h < c.H; ++h) c.x[static_cast<size_t>(2 * c.K + 3 * c.H + h)] = 0x7FC0;
  c.x[static_cast<size_t>(1 * c.K + 7)] = 0x7F80;  // +Inf in token 1's first stream
  c.build();
  const mref::Token r = c.reference();
  int64_t want = 5;  // the counter's start
  for (uint16_t v : r.y) want += (v & 0x7F80) == 0x7F80;
  EXPECT_GE(want, 5 + c.H);
  Staged st;
  megamoe::StageArgs s = st.args(c.T, c.H, 2, QuantScheme::mxfp8(), c.T, Layout::kContig, 1u);
  int64_t count = 5;
  s.nonfinite_count = TensorRef(&count, DType::kInt64, {1});
  ASSERT_NO_THROW(megamoe::mhc_pre_and_stage(c.args(false, false, false), s));
  EXPECT_EQ(count, want);
}

TEST(MhcPreAndStage, EpsEdgesAndEqualLogits) {
  // fn = 0 and base = 0: every comb logit equal, so Sinkhorn keeps every entry equal (the
  // sums run in the same order on the same values), and the pre gates are 1/2 + eps.
  MhcCase c(3, 128, 4, 11u);
  std::fill(c.fn.begin(), c.fn.end(), 0.0f);
  std::fill(c.base.begin(), c.base.end(), 0.0f);
  c.build();
  run_and_check(c, QuantScheme::mxfp8(), true, true, true, c.T);
  const mref::Token r = c.reference();
  for (int64_t t = 0; t < c.T; ++t) {
    for (int i = 1; i < 16; ++i) EXPECT_EQ(r.comb[static_cast<size_t>(t * 16 + i)], r.comb[static_cast<size_t>(t * 16)]);
    EXPECT_NEAR(r.comb[static_cast<size_t>(t * 16)], 0.25, 1e-5);
    EXPECT_EQ(r.pre[static_cast<size_t>(t * 4)], mref::add(0.5f, 1e-6f));
  }
  // rms_eps = 0 on a zero row: r = 1 / sqrt(0) = Inf, 0 * Inf = NaN in every mix.
  MhcCase e(2, 128, 2, 12u);
  e.prm.rms_eps = 0.0f;
  e.prm.sinkhorn_eps = 0.0f;
  e.prm.norm_eps = 0.0f;
  e.prm.pre_eps = -0.25f;
  for (int64_t k = 0; k < e.K; ++k) e.x[static_cast<size_t>(k)] = 0x0000;
  e.build();
  run_and_check(e, QuantScheme::fp8_fp32_g128(), true, true, true, e.T);
  const mref::Token er = e.reference();
  EXPECT_TRUE(std::isnan(er.post[0]));
  EXPECT_EQ(er.y[0], 0x7FC0);
  EXPECT_FALSE(std::isnan(er.post[2]));  // the second token (random streams) is finite
  // Huge logits: the softmax's max subtraction keeps them finite; -Inf-ish ones vanish.
  MhcCase h(2, 128, 3, 13u);
  for (float& v : h.base) v = 1e30f;
  h.base[static_cast<size_t>(2 * 3 + 1)] = -1e30f;
  h.build();
  run_and_check(h, QuantScheme::mxfp8(), true, true, true, h.T);
}

TEST(MhcPreAndStage, DelayedFormTakesThePreMixIn) {
  // DeepSeek-V4.1's delayed form: the weighted sum uses pre_mix_in; pre_mix is still this
  // step's gates. A one-hot pre_mix_in gives the first stream itself (model entry).
  MhcCase c(5, 256, 4, 21u, Layout::kStride2, Layout::kPadded, false, true);
  for (int64_t t = 0; t < c.T; ++t)
    for (int j = 0; j < 4; ++j) c.pre_in[static_cast<size_t>(t * 4 + j)] = j == 0 ? 1.0f : 0.0f;
  c.build();
  run_and_check(c, QuantScheme::mxfp8(), true, true, true, c.T);
  const mref::Token r = c.reference();
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h) ASSERT_EQ(r.z[static_cast<size_t>(t * c.H + h)], c.x[static_cast<size_t>(t * c.K + h)]);
}

/// ulp distance of two finite floats of the same sign class.
int64_t ulps(float a, double b) {
  const float bf = static_cast<float>(b);
  auto key = [](float f) {
    const int32_t i = static_cast<int32_t>(megamoe_ref::detail::bits_of(f));
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::llabs(key(a) - key(bf));
}

int64_t bf16_ulps(uint16_t a, uint16_t b) {
  auto key = [](uint16_t v) { return (v & 0x8000) ? -int64_t{v & 0x7FFF} : int64_t{v}; };
  return std::llabs(key(a) - key(b));
}

TEST(MhcPreAndStage, TracksAFloat64RenderingOfThePeer) {
  // vLLM's mhc_pre_torch then rms_norm, in float64 (mhc_reference.h peer()): the contract's
  // fp32 results within the bounds below (docs/CONTRACT.md states them), most exactly equal.
  int64_t max_gate = 0, max_comb = 0, max_y = 0, n_gate = 0, eq_gate = 0, n_comb = 0, eq_comb = 0, n_y = 0, eq_y = 0;
  uint32_t seed = 300;
  for (int64_t H : {512, 4096, 7168}) {
    for (int rep = 0; rep < 3; ++rep) {
      MhcCase c(4, H, 4, seed++);
      const mref::Token r = c.reference();
      const std::vector<float> w = c.weights();
      for (int64_t t = 0; t < c.T; ++t) {
        const mref::PeerToken pt = mref::peer(&c.x[static_cast<size_t>(t * c.K)], 4, static_cast<size_t>(H), c.fn, c.scale,
                                              c.base, w, c.prm);
        for (int j = 0; j < 4; ++j) {
          for (const auto& [got, want] : {std::make_pair(r.pre[static_cast<size_t>(t * 4 + j)], pt.pre[static_cast<size_t>(j)]),
                                          std::make_pair(r.post[static_cast<size_t>(t * 4 + j)], pt.post[static_cast<size_t>(j)])}) {
            const int64_t u = ulps(got, want);
            max_gate = std::max(max_gate, u);
            eq_gate += u == 0;
            ++n_gate;
          }
        }
        for (int i = 0; i < 16; ++i) {
          const int64_t u = ulps(r.comb[static_cast<size_t>(t * 16 + i)], pt.comb[static_cast<size_t>(i)]);
          max_comb = std::max(max_comb, u);
          eq_comb += u == 0;
          ++n_comb;
        }
        for (int64_t h = 0; h < H; ++h) {
          const int64_t u = bf16_ulps(r.y[static_cast<size_t>(t * H + h)], pt.y[static_cast<size_t>(h)]);
          max_y = std::max(max_y, u);
          eq_y += u == 0;
          ++n_y;
        }
      }
    }
  }
  RecordProperty("max_ulp_gates", static_cast<int>(max_gate));
  RecordProperty("max_ulp_comb", static_cast<int>(max_comb));
  RecordProperty("max_ulp_y_bf16", static_cast<int>(max_y));
  std::printf("peer float64: gates max %lld ulp (%lld/%lld equal), comb max %lld ulp (%lld/%lld equal), "
              "y max %lld bf16 ulp (%lld/%lld equal)\n",
              static_cast<long long>(max_gate), static_cast<long long>(eq_gate), static_cast<long long>(n_gate),
              static_cast<long long>(max_comb), static_cast<long long>(eq_comb), static_cast<long long>(n_comb),
              static_cast<long long>(max_y), static_cast<long long>(eq_y), static_cast<long long>(n_y));
  // Measured: gates 4 ulp, comb 13 ulp, y 3 bf16 ulp (six values in 141312 differ): a
  // mix's fp32 sum over 28672 terms moves a gate by ulps, which moves a bf16 rounding of z
  // now and then; twice the measured bounds.
  EXPECT_LE(max_gate, 8);
  EXPECT_LE(max_comb, 32);
  EXPECT_LE(max_y, 4);
  EXPECT_GE(eq_y * 1000, n_y * 999);
}

TEST(MhcPreAndStage, ZeroTokensFillOnlyTheTail) {
  MhcCase c(0, 256, 4, 3u);
  Staged st;
  const megamoe::StageArgs s = st.args(0, c.H, 4, QuantScheme::mxfp8(), 7, Layout::kContig, 1u);
  const std::vector<uint8_t> xq0 = st.xq.mem, post0 = c.post.mem;
  ASSERT_NO_THROW(megamoe::mhc_pre_and_stage(c.args(true, true, true), s));
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t k = 0; k < 4; ++k) ASSERT_EQ(st.io.get<int64_t>(i, k), -1);
  EXPECT_EQ(st.xq.mem, xq0);
  EXPECT_EQ(c.post.mem, post0);
}

TEST(MhcPreAndStage, ExplainNamesTheStepsAndRunsNothing) {
  MhcCase c(3, 256, 4, 4u);
  Staged st;
  const megamoe::StageArgs s = st.args(c.T, c.H, 2, QuantScheme::mxfp8(), c.T, Layout::kContig, 1u);
  const std::vector<uint8_t> xq0 = st.xq.mem, post0 = c.post.mem;
  const std::string e = megamoe::explain(c.args(false, false, true), s);
  EXPECT_NE(e.find("cpu backend: mhc_pre T=3 H=256 hc_mult=4 sinkhorn_repeat=20"), std::string::npos) << e;
  EXPECT_NE(e.find("then cpu backend: mxfp8"), std::string::npos) << e;
  EXPECT_EQ(st.xq.mem, xq0);
  EXPECT_EQ(c.post.mem, post0);
  megamoe::MhcPreArgs bad = c.args(false, false, false);
  bad.sinkhorn_repeat = 0;
  EXPECT_THROW(megamoe::explain(bad, s), megamoe::Error);
}

TEST(MhcPreAndStage, CudaTensorsAreRefusedWithoutTheCudaBackend) {
  // A CUDA build runs them (tests/cuda/test_mhc_cuda.cu); these host buffers only stand in.
  if (megamoe::has_cuda_backend()) GTEST_SKIP() << "this build has the CUDA backend";
  MhcCase c(2, 128, 4, 5u);
  Staged st;
  megamoe::StageArgs s = st.args(c.T, c.H, 2, QuantScheme::mxfp8(), c.T, Layout::kContig, 1u);
  megamoe::MhcPreArgs a = c.args(true, true, true);
  const megamoe::Device gpu{megamoe::Device::Type::kCUDA, 0};
  for (TensorRef* t : {&a.residual, &a.fn, &a.hc_scale, &a.hc_base, &a.norm_weight, &a.post_mix, &a.comb_mix,
                       &*a.pre_mix, &*a.layer_input, &*a.y, &s.topk_weights, &s.topk_ids, &s.x_q, &s.x_sf,
                       &s.topk_idx_out, &s.topk_weights_out})
    t->device = gpu;
  const std::vector<uint8_t> post0 = c.post.mem, y0 = c.y.mem, xq0 = st.xq.mem;
  const megamoe::Status st_ = megamoe::try_mhc_pre_and_stage(a, s);
  EXPECT_FALSE(st_.ok);
  EXPECT_EQ(st_.code, megamoe::ErrorCode::kUnsupported) << st_.message;
  EXPECT_NE(st_.message.find("mhc_pre_and_stage"), std::string::npos) << st_.message;
  EXPECT_EQ(c.post.mem, post0);
  EXPECT_EQ(c.y.mem, y0);
  EXPECT_EQ(st.xq.mem, xq0);
  EXPECT_NO_THROW(megamoe::validate_mhc_pre(a, s));
}

TEST(MhcPreAndStage, ErrorsWriteNothing) {
  struct Bad {
    const char* what;
    void (*edit)(megamoe::MhcPreArgs&, megamoe::StageArgs&, MhcCase&);
  };
  const Bad bad[] = {
      {"residual: expected dtype bfloat16", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.residual.dtype = DType::kFloat16; }},
      {"residual: expected shape (5, 1024)", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.residual.shape[1] = 1000; }},
      {"post_mix: expected shape (T, hc_mult) with 1 <= hc_mult <= 16", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.post_mix.shape[1] = 17; }},
      {"norm_weight: expected shape (H,) with H >= 1", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.norm_weight.shape[0] = 0; }},
      {"norm_weight: expected dtype", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.norm_weight.dtype = DType::kInt32; }},
      {"fn: expected shape (24, 1024)", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.fn.shape[0] = 23; }},
      {"fn: expected dtype float32", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.fn.dtype = DType::kBFloat16; }},
      {"hc_scale: expected shape (3,)", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.hc_scale.shape[0] = 2; }},
      {"hc_base: expected shape (24,)", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.hc_base.shape[0] = 16; }},
      {"rms_eps: expected a finite value >= 0", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.rms_eps = -1e-6f; }},
      {"hc_pre_eps: expected a finite value", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.hc_pre_eps = std::numeric_limits<float>::infinity(); }},
      {"hc_sinkhorn_eps: expected a finite value >= 0", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.hc_sinkhorn_eps = std::numeric_limits<float>::quiet_NaN(); }},
      {"hc_post_mult_value: expected a finite value", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.hc_post_mult_value = -std::numeric_limits<float>::infinity(); }},
      {"norm_eps: expected a finite value >= 0", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.norm_eps = -1.0f; }},
      {"sinkhorn_repeat: expected 1 to 65536 rounds", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.sinkhorn_repeat = 0; }},
      {"pre_mix_in: expected shape (5, 4)", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase& c) { m.pre_mix_in = c.pinb.ref(); m.pre_mix_in->shape[1] = 3; }},
      {"comb_mix: expected shape (5, 16)", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.comb_mix.shape[1] = 4; }},
      {"comb_mix: expected dtype float32", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.comb_mix.dtype = DType::kBFloat16; }},
      {"layer_input: expected shape (5, 256)", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.layer_input->shape[1] = 128; }},
      {"y: expected dtype bfloat16", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.y->dtype = DType::kFloat32; }},
      {"x_sf: expected shape", [](megamoe::MhcPreArgs&, megamoe::StageArgs& s, MhcCase&) { s.x_sf.shape[1] = 3; }},
      {"y: expected memory disjoint from residual", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase& c) { m.y = TensorRef(c.res.ref().data, DType::kBFloat16, {5, 256}); }},
      {"post_mix: expected memory disjoint from x_q", [](megamoe::MhcPreArgs& m, megamoe::StageArgs& s, MhcCase&) { m.post_mix.data = s.x_q.data; }},
      {"post_mix: expected memory disjoint from comb_mix", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.comb_mix.data = m.post_mix.data; }},
      {"post_mix: expected strides that give every element its own address", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.post_mix.strides[1] = 0; }},
      {"residual: expected a non-null data pointer", [](megamoe::MhcPreArgs& m, megamoe::StageArgs&, MhcCase&) { m.residual.data = nullptr; }},
  };
  for (const Bad& b : bad) {
    MhcCase c(5, 256, 4, 12u);
    Staged st;
    megamoe::StageArgs s = st.args(c.T, c.H, 2, QuantScheme::mxfp8(), c.T, Layout::kContig, 1u);
    megamoe::MhcPreArgs m = c.args(true, true, true);
    b.edit(m, s, c);
    const std::vector<uint8_t> res0 = c.res.mem, post0 = c.post.mem, comb0 = c.comb.mem, pre0 = c.pre.mem,
                               z0 = c.z.mem, y0 = c.y.mem, xq0 = st.xq.mem, sf0 = st.sf.mem, io0 = st.io.mem;
    try {
      megamoe::mhc_pre_and_stage(m, s);
      ADD_FAILURE() << b.what << ": accepted";
    } catch (const megamoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.what), std::string::npos) << e.what();
      EXPECT_EQ(e.code(), megamoe::ErrorCode::kInvalidArgument) << e.what();
    }
    EXPECT_EQ(c.res.mem, res0) << b.what;
    EXPECT_EQ(c.post.mem, post0) << b.what;
    EXPECT_EQ(c.comb.mem, comb0) << b.what;
    EXPECT_EQ(c.pre.mem, pre0) << b.what;
    EXPECT_EQ(c.z.mem, z0) << b.what;
    EXPECT_EQ(c.y.mem, y0) << b.what;
    EXPECT_EQ(st.xq.mem, xq0) << b.what;
    EXPECT_EQ(st.sf.mem, sf0) << b.what;
    EXPECT_EQ(st.io.mem, io0) << b.what;
  }
}

}  // namespace
