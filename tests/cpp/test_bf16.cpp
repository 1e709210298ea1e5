// bf16 pass-through staging (docs/CONTRACT.md "bf16 pass-through"): x_q is the input as
// bf16, no scales. Every case goes through megamoe::prepare_inputs on CPU tensors and is
// compared element by element with the independent reference (megamoe_ref::bf16_rne, the
// rounding written in double); the hand-written bits below are asserted on the reference
// too, so library, reference and these numbers must all agree. Outputs start as poison and
// every byte of their buffers (gaps included) is checked.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"
#include "megamoe_reference.h"

namespace {

using megamoe::DType;
using megamoe::ErrorCode;
using megamoe::QuantScheme;
using megamoe::StageArgs;
using megamoe::TensorRef;

constexpr uint8_t kPoison = 0xA5;

/// A host buffer of @p bytes poison bytes.
struct Buf {
  std::vector<uint8_t> b;
  explicit Buf(size_t bytes) : b(bytes, kPoison) {}
  void* data() { return b.data(); }
};

/// One staging call of hidden states given as raw bits of dtype @p dt ([T, H], row stride
/// @p hs0, column stride @p hs1 in elements), with x_q of row stride @p xs0 / column stride
/// @p xs1 (negative strides are not used here; the other tests cover them for every format).
struct Call {
  int64_t T, H, K, M;
  DType dt;
  int64_t hs0, hs1, xs0, xs1;
  Buf hs, ids, w, xq, idx_out, w_out, pad;
  std::vector<uint32_t> bits;  // element (t, h): fp32 bits, or 16-bit bits in the low half
  std::vector<int64_t> id;
  std::vector<float> wt;
  std::vector<uint8_t> padv;

  Call(int64_t T_, int64_t H_, int64_t K_, DType dt_, int64_t hs0_, int64_t hs1_, int64_t xs0_, int64_t xs1_,
       int64_t M_ = -1)
      : T(T_), H(H_), K(K_), M(M_ < 0 ? T_ : M_), dt(dt_), hs0(hs0_), hs1(hs1_), xs0(xs0_), xs1(xs1_),
        hs(static_cast<size_t>(span(T_, H_, hs0_, hs1_) * megamoe::dtype_size(dt_))),
        ids(static_cast<size_t>(T_ * K_ * 4)), w(static_cast<size_t>(T_ * K_ * 4)),
        xq(static_cast<size_t>(span(M, H_, xs0_, xs1_) * 2)), idx_out(static_cast<size_t>(M * K_ * 8)),
        w_out(static_cast<size_t>(M * K_ * 4)), pad(static_cast<size_t>(T_)),
        bits(static_cast<size_t>(T_ * H_)), id(static_cast<size_t>(T_ * K_)), wt(static_cast<size_t>(T_ * K_)),
        padv(static_cast<size_t>(T_)) {}

  static int64_t span(int64_t r, int64_t c, int64_t s0, int64_t s1) {
    return r == 0 || c == 0 ? 1 : (r - 1) * s0 + (c - 1) * s1 + 1;
  }
  void set(int64_t t, int64_t h, uint32_t v) {
    bits[static_cast<size_t>(t * H + h)] = v;
    const int64_t es = megamoe::dtype_size(dt);
    std::memcpy(hs.b.data() + (t * hs0 + h * hs1) * es, &v, static_cast<size_t>(es));  // little-endian low half
  }
  void fill_topk(std::mt19937& rng) {
    for (int64_t i = 0; i < T * K; ++i) {
      id[static_cast<size_t>(i)] = static_cast<int64_t>(rng() % 256);
      wt[static_cast<size_t>(i)] = static_cast<float>(rng() % 1000) / 997.0f;
      const int32_t i32 = static_cast<int32_t>(id[static_cast<size_t>(i)]);
      std::memcpy(ids.b.data() + i * 4, &i32, 4);
      std::memcpy(w.b.data() + i * 4, &wt[static_cast<size_t>(i)], 4);
    }
    for (int64_t t = 0; t < T; ++t) padv[static_cast<size_t>(t)] = t % 3 == 2 ? 1 : 0;
    if (!padv.empty()) std::memcpy(pad.b.data(), padv.data(), padv.size());
  }
  StageArgs args(bool with_pad = true) {
    StageArgs a;
    a.hidden_states = TensorRef(hs.data(), dt, {T, H}, {hs0, hs1});
    a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
    a.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
    a.x_q = TensorRef(xq.data(), DType::kBFloat16, {M, H}, {xs0, xs1});
    a.topk_idx_out = TensorRef(idx_out.data(), DType::kInt64, {M, K});
    a.topk_weights_out = TensorRef(w_out.data(), DType::kFloat32, {M, K});
    if (with_pad) a.is_padding = TensorRef(pad.data(), DType::kUInt8, {T});
    a.hidden_quant = QuantScheme::bf16();
    a.full_buffer = M != T;
    return a;
  }
  /// The reference's bf16 bits of element (t, h).
  uint16_t want(int64_t t, int64_t h) const {
    const uint32_t v = bits[static_cast<size_t>(t * H + h)];
    if (dt == DType::kBFloat16) return static_cast<uint16_t>(v);
    if (dt == DType::kFloat16) return megamoe_ref::bf16_rne_half(static_cast<uint16_t>(v));
    float f;
    std::memcpy(&f, &v, 4);
    return megamoe_ref::bf16_rne(f);
  }
  bool input_nonfinite(int64_t t, int64_t h) const {
    const uint32_t v = bits[static_cast<size_t>(t * H + h)];
    if (dt == DType::kBFloat16) return (v & 0x7F80u) == 0x7F80u;
    if (dt == DType::kFloat16) return (v & 0x7C00u) == 0x7C00u;
    return (v & 0x7F800000u) == 0x7F800000u;
  }
  uint16_t got(int64_t t, int64_t h) const {
    uint16_t g;
    std::memcpy(&g, xq.b.data() + (t * xs0 + h * xs1) * 2, 2);
    return g;
  }
  /// Every byte of x_q: rows < T the reference's, everything else (gaps, tail rows) poison.
  void check_xq() const {
    std::vector<bool> written(xq.b.size(), false);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(got(t, h), want(t, h)) << "t=" << t << " h=" << h << " input bits " << std::hex
                                         << bits[static_cast<size_t>(t * H + h)];
        const size_t off = static_cast<size_t>((t * xs0 + h * xs1) * 2);
        written[off] = written[off + 1] = true;
      }
    }
    for (size_t i = 0; i < xq.b.size(); ++i) {
      if (!written[i]) {
        ASSERT_EQ(xq.b[i], kPoison) << "x_q byte " << i << " outside the staged rows";
      }
    }
  }
  /// The top-k outputs: kept rows copied, padded rows -1 / +0, tail rows -1 / +0.
  void check_topk(bool with_pad, std::optional<float> alpha = std::nullopt) const {
    for (int64_t t = 0; t < M; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        int64_t gi;
        float gw;
        std::memcpy(&gi, idx_out.b.data() + (t * K + k) * 8, 8);
        std::memcpy(&gw, w_out.b.data() + (t * K + k) * 4, 4);
        const bool empty = t >= T || (with_pad && padv[static_cast<size_t>(t)] != 0);
        const float w0 = t < T ? wt[static_cast<size_t>(t * K + k)] : 0.0f;
        const float ww = empty ? 0.0f : alpha ? static_cast<float>(static_cast<double>(w0) * *alpha) : w0;
        ASSERT_EQ(gi, empty ? -1 : id[static_cast<size_t>(t * K + k)]) << t << "," << k;
        uint32_t a, b;
        std::memcpy(&a, &gw, 4);
        std::memcpy(&b, &ww, 4);
        ASSERT_EQ(a, b) << t << "," << k;
      }
    }
  }
};

// ---------------------------------------------------------------------------------------
// The reference's rule against bits written by hand.

struct Edge {
  uint32_t in;    // fp32 bits, or fp16 / bf16 bits
  uint16_t want;  // bf16 bits
  const char* what;
};

const Edge kFp32Edges[] = {
    {0x3F800000u, 0x3F80, "1.0 exact"},
    {0x3F808000u, 0x3F80, "tie between 0x3F80 and 0x3F81: to the even 0x3F80"},
    {0x3F818000u, 0x3F82, "tie between 0x3F81 and 0x3F82: to the even 0x3F82"},
    {0x3F808001u, 0x3F81, "just above a tie: up"},
    {0x3F807FFFu, 0x3F80, "just below a tie: down"},
    {0xBF818000u, 0xBF82, "negative tie to even"},
    {0x7F7FFFFFu, 0x7F80, "fp32 max overflows to +Inf"},
    {0xFF7FFFFFu, 0xFF80, "-fp32 max overflows to -Inf"},
    {0x7F7F7FFFu, 0x7F7F, "below bf16 max's upper midpoint: bf16 max"},
    {0x7F7F8000u, 0x7F80, "bf16 max's upper midpoint: the tie goes to the even Inf"},
    {0x7F800000u, 0x7F80, "+Inf"},
    {0xFF800000u, 0xFF80, "-Inf"},
    {0x00000000u, 0x0000, "+0"},
    {0x80000000u, 0x8000, "-0"},
    {0x00000001u, 0x0000, "smallest fp32 subnormal rounds to +0"},
    {0x80000001u, 0x8000, "negative tiny rounds to -0"},
    {0x00008000u, 0x0000, "tie between 0 and the smallest bf16 subnormal: to 0"},
    {0x00018000u, 0x0002, "subnormal tie to the even 0x0002"},
    {0x00010000u, 0x0001, "smallest bf16 subnormal exact"},
    {0x007FFFFFu, 0x0080, "largest fp32 subnormal rounds up to the smallest normal"},
    {0x7F800001u, 0x7FC0, "signalling NaN"},
    {0x7FC00000u, 0x7FC0, "quiet NaN"},
    {0xFFC00000u, 0x7FC0, "negative quiet NaN: the sign is dropped (torch's CPU rule)"},
    {0xFFFFFFFFu, 0x7FC0, "negative NaN, every payload bit"},
    {0x7F80FFFFu, 0x7FC0, "NaN whose truncation would be Inf's bits"},
};
const Edge kFp16Edges[] = {
    {0x3C00, 0x3F80, "1.0"},
    {0x0001, 0x3380, "smallest fp16 subnormal 2^-24, exact in bf16"},
    {0x8001, 0xB380, "negative smallest subnormal"},
    {0x7BFF, 0x4780, "fp16 max 65504 rounds up to 65536"},
    {0x3C01, 0x3F80, "1 + 2^-10 rounds down (below the bf16 midpoint)"},
    {0x3C04, 0x3F80, "1 + 2^-8: the tie between 0x3F80 and 0x3F81, to the even"},
    {0x3C0C, 0x3F82, "1 + 3 * 2^-8: the tie between 0x3F81 and 0x3F82, to the even"},
    {0x8000, 0x8000, "-0"},
    {0x7C00, 0x7F80, "+Inf"},
    {0xFC00, 0xFF80, "-Inf"},
    {0x7C01, 0x7FC0, "signalling NaN"},
    {0xFE00, 0x7FC0, "negative quiet NaN"},
    {0xFFFF, 0x7FC0, "negative NaN, every payload bit"},
};
const uint16_t kBf16Edges[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80,
                               0x7F81, 0xFF81, 0x7FC0, 0xFFC0, 0x7FFF, 0xFFFF, 0x3F80, 0x4049};

TEST(Bf16Reference, EdgesWrittenByHand) {
  for (const Edge& e : kFp32Edges) {
    float f;
    std::memcpy(&f, &e.in, 4);
    EXPECT_EQ(megamoe_ref::bf16_rne(f), e.want) << e.what;
  }
  for (const Edge& e : kFp16Edges) EXPECT_EQ(megamoe_ref::bf16_rne_half(static_cast<uint16_t>(e.in)), e.want) << e.what;
}

/// One call over @p edges of dtype @p dt (one per column of a 128-wide row, the rest 1.0).
void stage_edges(DType dt, const std::vector<std::pair<uint32_t, uint16_t>>& edges) {
  const int64_t H = 128;
  Call c(1, H, 2, dt, H, 1, H, 1);
  for (int64_t h = 0; h < H; ++h) {
    const uint32_t one = dt == DType::kFloat32 ? 0x3F800000u : dt == DType::kFloat16 ? 0x3C00u : 0x3F80u;
    c.set(0, h, h < static_cast<int64_t>(edges.size()) ? edges[static_cast<size_t>(h)].first : one);
  }
  std::mt19937 rng(1);
  c.fill_topk(rng);
  megamoe::prepare_inputs(c.args());
  c.check_xq();
  for (size_t i = 0; i < edges.size(); ++i) {
    EXPECT_EQ(c.got(0, static_cast<int64_t>(i)), edges[i].second) << "edge " << i << " input " << std::hex << edges[i].first;
  }
}

template <size_t N>
std::vector<std::pair<uint32_t, uint16_t>> pairs(const Edge (&edges)[N]) {
  std::vector<std::pair<uint32_t, uint16_t>> e;
  for (const Edge& x : edges) e.emplace_back(x.in, x.want);
  return e;
}

TEST(Bf16Golden, Fp32Edges) { stage_edges(DType::kFloat32, pairs(kFp32Edges)); }

TEST(Bf16Golden, Fp16Edges) { stage_edges(DType::kFloat16, pairs(kFp16Edges)); }

TEST(Bf16Golden, Bf16BitsCopiedExactlyNaNPayloadsIncluded) {
  std::vector<std::pair<uint32_t, uint16_t>> e;
  for (uint16_t b : kBf16Edges) e.emplace_back(b, b);
  stage_edges(DType::kBFloat16, e);
}

// ---------------------------------------------------------------------------------------
// Randomized: every dtype, contiguous and strided layouts, several sizes (threads at the
// largest), random bit patterns (NaN, Inf, subnormals included) and planted ties.

struct Layout {
  const char* name;
  bool hs_strided, xq_strided, xq_transposed;
};

TEST(Bf16Random, EveryElementAgainstTheReference) {
  const Layout layouts[] = {{"contiguous", false, false, false},
                            {"strided input", true, false, false},
                            {"strided x_q", false, true, false},
                            {"transposed x_q", true, false, true}};
  const DType dts[] = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
  const int64_t sizes[][2] = {{1, 128}, {3, 256}, {17, 384}, {700, 512}};
  std::mt19937 rng(20261207);
  for (const Layout& l : layouts) {
    for (DType dt : dts) {
      for (const auto& sz : sizes) {
        const int64_t T = sz[0], H = sz[1], K = 3;
        const int64_t hs0 = l.hs_strided ? 2 * H + 6 : H, hs1 = l.hs_strided ? 2 : 1;
        const int64_t xs0 = l.xq_transposed ? 1 : l.xq_strided ? H + 8 : H;
        const int64_t xs1 = l.xq_transposed ? T : l.xq_strided ? 1 : 1;
        Call c(T, H, K, dt, hs0, hs1, xs0, xs1);
        int64_t nonfinite = 0;
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t h = 0; h < H; ++h) {
            uint32_t v = rng();
            if (dt == DType::kFloat32 && rng() % 4 == 0) v = (v & 0xFFFF0000u) | 0x8000u;  // a tie
            if (dt != DType::kFloat32) v &= 0xFFFFu;
            c.set(t, h, v);
            nonfinite += c.input_nonfinite(t, h) ? 1 : 0;
          }
        }
        c.fill_topk(rng);
        StageArgs a = c.args();
        int64_t count = 5;
        a.nonfinite_count = TensorRef(&count, DType::kInt64, {1});
        SCOPED_TRACE(std::string(l.name) + " " + megamoe::dtype_name(dt) + " T=" + std::to_string(T) +
                     " H=" + std::to_string(H));
        megamoe::prepare_inputs(a);
        c.check_xq();
        c.check_topk(true);
        EXPECT_EQ(count, 5 + nonfinite);
      }
    }
  }
}

TEST(Bf16Random, TopkEqualsAnotherFormatsAndAlphaApplies) {
  // The routing part is the other formats': the same top-k bytes as an MXFP8 call.
  const int64_t T = 9, H = 256, K = 4;
  Call c(T, H, K, DType::kBFloat16, H, 1, H, 1);
  std::mt19937 rng(7);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) c.set(t, h, 0x3F80u + (rng() % 64));
  c.fill_topk(rng);
  StageArgs a = c.args();
  a.routed_scaling_factor = 2.5f;
  megamoe::prepare_inputs(a);
  c.check_topk(true, 2.5f);
  std::vector<uint8_t> xq8(static_cast<size_t>(T * H)), idx(static_cast<size_t>(T * K * 8)), w(static_cast<size_t>(T * K * 4));
  std::vector<int32_t> sf(static_cast<size_t>(T * H / 128));
  StageArgs b = a;
  b.hidden_quant = QuantScheme::mxfp8();
  b.x_q = TensorRef(xq8.data(), DType::kFloat8E4M3, {T, H});
  b.x_sf = TensorRef(sf.data(), DType::kInt32, {T, H / 128});
  b.topk_idx_out = TensorRef(idx.data(), DType::kInt64, {T, K});
  b.topk_weights_out = TensorRef(w.data(), DType::kFloat32, {T, K});
  megamoe::prepare_inputs(b);
  EXPECT_EQ(0, std::memcmp(idx.data(), c.idx_out.b.data(), idx.size()));
  EXPECT_EQ(0, std::memcmp(w.data(), c.w_out.b.data(), w.size()));
}

TEST(Bf16Random, FullBufferTailAndUntouchedRows) {
  for (int64_t T : {0, 1, 5}) {
    const int64_t H = 128, K = 2, M = 8;
    Call c(T, H, K, DType::kFloat32, H, 1, H, 1, M);
    std::mt19937 rng(3);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) c.set(t, h, rng());
    c.fill_topk(rng);
    SCOPED_TRACE("T=" + std::to_string(T));
    megamoe::prepare_inputs(c.args());
    c.check_xq();  // rows T..M-1 poison
    c.check_topk(true);
  }
}

TEST(Bf16Random, RouteAndStageStagesTheSameBytes) {
  // route_and_stage: the router's top-k, then the bf16 copy, as prepare_inputs on that top-k.
  const int64_t T = 6, H = 256, K = 4, E = 64;
  Call c(T, H, K, DType::kFloat16, H, 1, H, 1);
  std::mt19937 rng(9);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) c.set(t, h, rng() & 0xFFFFu);
  std::vector<float> logits(static_cast<size_t>(T * E));
  for (float& l : logits) l = static_cast<float>(rng() % 1000) / 100.0f;
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> w(static_cast<size_t>(T * K));
  megamoe::RouterArgs r;
  r.router_logits = TensorRef(logits.data(), DType::kFloat32, {T, E});
  r.top_k = K;
  r.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
  r.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
  StageArgs a = c.args(false);
  megamoe::route_and_stage(r, a);
  c.check_xq();
  // The staged top-k is the router's public top-k, widened.
  for (int64_t i = 0; i < T * K; ++i) {
    int64_t gi;
    std::memcpy(&gi, c.idx_out.b.data() + i * 8, 8);
    EXPECT_EQ(gi, ids[static_cast<size_t>(i)]);
  }
}

TEST(Bf16Random, TZeroReturnsAtOnce) {
  Call c(0, 128, 2, DType::kBFloat16, 128, 1, 128, 1);
  megamoe::prepare_inputs(c.args());
  for (uint8_t b : c.idx_out.b) EXPECT_EQ(b, kPoison);
}

TEST(Bf16Random, FloorIsIgnored) {
  const int64_t T = 2, H = 128;
  Call c(T, H, 1, DType::kFloat32, H, 1, H, 1);
  std::mt19937 rng(11);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) c.set(t, h, rng() & 0x80FFFFFFu);  // tiny values
  c.fill_topk(rng);
  for (float floor : {0.0f, 1e-10f, 0.5f, 1e4f}) {
    std::fill(c.xq.b.begin(), c.xq.b.end(), kPoison);
    StageArgs a = c.args();
    a.hidden_quant = QuantScheme::bf16().with_amax_floor(floor);
    megamoe::prepare_inputs(a);
    c.check_xq();
    EXPECT_EQ(megamoe::scheme_name(a.hidden_quant), "bf16");
  }
}

// ---------------------------------------------------------------------------------------
// Schemes, shapes, argument checks (nothing written on a rejected call).

TEST(Bf16Shapes, OutputShapes) {
  const megamoe::OutputShapes o = megamoe::output_shapes(5, 384, 6, QuantScheme::bf16());
  EXPECT_EQ(o.x_q.dtype, DType::kBFloat16);
  EXPECT_EQ(o.x_q.shape[0], 5);
  EXPECT_EQ(o.x_q.shape[1], 384);
  EXPECT_EQ(o.x_sf.ndim, 2);
  EXPECT_EQ(o.x_sf.shape[0], 5);
  EXPECT_EQ(o.x_sf.shape[1], 0);
  EXPECT_EQ(o.topk_idx_out.shape[1], 6);
  EXPECT_FALSE(o.x_scales.has_value());
  EXPECT_FALSE(o.global_scale.has_value());
  EXPECT_THROW(megamoe::output_shapes(5, 200, 6, QuantScheme::bf16()), megamoe::Error);
  try {
    megamoe::output_shapes(5, 384, 6, QuantScheme::bf16(), 64);
    ADD_FAILURE() << "shared_block_m accepted";
  } catch (const megamoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(megamoe::scheme_name(QuantScheme::bf16()), "bf16");
}

TEST(Bf16Shapes, SchemesThatAreNotBf16) {
  QuantScheme q = QuantScheme::bf16();
  q.group_k = 32;  // a group on a format without scales
  EXPECT_EQ(megamoe::scheme_name(q), "unsupported");
  EXPECT_THROW(megamoe::check_scheme(q), megamoe::Error);
  q = QuantScheme::bf16();
  q.scale = megamoe::ScaleType::kUE8M0;
  EXPECT_EQ(megamoe::scheme_name(q), "unsupported");
  q = QuantScheme::bf16();
  q.rounding = megamoe::Rounding::kTiesTowardZero;
  EXPECT_EQ(megamoe::scheme_name(q), "unsupported");
  q = QuantScheme::bf16().with_amax_floor(-1.0f);
  EXPECT_EQ(megamoe::scheme_name(q), "unsupported");
  q = QuantScheme::mxfp8();
  q.scale = megamoe::ScaleType::kNone;  // e4m3 without scales
  EXPECT_EQ(megamoe::scheme_name(q), "unsupported");
  q = QuantScheme::mxfp8();
  q.group_k = 0;
  EXPECT_EQ(megamoe::scheme_name(q), "unsupported");
  QuantScheme rne = QuantScheme::bf16();
  rne.rounding = megamoe::Rounding::kNearestEven;
  EXPECT_EQ(megamoe::scheme_name(rne), "bf16");
}

/// @p mutate makes a bf16 call invalid: it must throw an Error whose message has @p needle,
/// with x_q and the top-k outputs untouched.
template <typename F>
void expect_rejected(const char* needle, F mutate) {
  Call c(2, 128, 2, DType::kBFloat16, 128, 1, 128, 1);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t h = 0; h < 128; ++h) c.set(t, h, 0x3F80u);
  std::mt19937 rng(5);
  c.fill_topk(rng);
  StageArgs a = c.args();
  mutate(a);
  try {
    megamoe::prepare_inputs(a);
    ADD_FAILURE() << "accepted; expected an error naming " << needle;
  } catch (const megamoe::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (uint8_t b : c.xq.b) ASSERT_EQ(b, kPoison);
  for (uint8_t b : c.idx_out.b) ASSERT_EQ(b, kPoison);
}

TEST(Bf16Validation, XsfEmptyOrAbsentOnly) {
  // Accepted: no tensor, or (T, 0) of any dtype.
  for (int form = 0; form < 3; ++form) {
    Call c(2, 128, 2, DType::kBFloat16, 128, 1, 128, 1);
    std::mt19937 rng(5);
    c.fill_topk(rng);
    StageArgs a = c.args();
    int32_t dummy = 0;
    if (form == 1) a.x_sf = TensorRef(&dummy, DType::kInt32, {2, 0});
    if (form == 2) a.x_sf = TensorRef(nullptr, DType::kFloat32, {2, 0});
    EXPECT_NO_THROW(megamoe::prepare_inputs(a)) << "form " << form;
  }
  static int32_t words[16];
  expect_rejected("x_sf", [](StageArgs& a) { a.x_sf = TensorRef(words, DType::kInt32, {2, 1}); });
  expect_rejected("x_sf", [](StageArgs& a) { a.x_sf = TensorRef(words, DType::kInt32, {3, 0}); });
  expect_rejected("x_sf", [](StageArgs& a) { a.x_sf = TensorRef(words, DType::kInt32, {2}); });
  expect_rejected("no scales", [](StageArgs& a) { a.x_sf = TensorRef(words, DType::kFloat32, {2, 4}); });
  // Every other format needs its scales: an absent x_sf is named there.
  static uint8_t fp8[256];
  expect_rejected("writes scales", [](StageArgs& a) {
    a.hidden_quant = QuantScheme::mxfp8();
    a.x_q = TensorRef(fp8, DType::kFloat8E4M3, {2, 128});
    a.x_sf = TensorRef();
  });
}

TEST(Bf16Validation, NoSharedNoSecondLevelScales) {
  static int32_t words[4096];
  static float scalars[8];
  expect_rejected("shared_x_sf", [](StageArgs& a) {
    a.shared_x_sf = TensorRef(words, DType::kInt32, {128, 1});
    a.shared_block_m = 64;
  });
  expect_rejected("shared_block_m", [](StageArgs& a) { a.shared_block_m = 64; });
  expect_rejected("global_scale", [](StageArgs& a) { a.global_scale = TensorRef(scalars, DType::kFloat32, {1}); });
  expect_rejected("x_scales", [](StageArgs& a) { a.x_scales = TensorRef(scalars, DType::kFloat32, {2}); });
}

TEST(Bf16Validation, XqDtypeAndShape) {
  expect_rejected("x_q", [](StageArgs& a) { a.x_q.dtype = DType::kUInt8; });
  expect_rejected("x_q", [](StageArgs& a) { a.x_q.dtype = DType::kFloat16; });
  expect_rejected("x_q", [](StageArgs& a) { a.x_q.dtype = DType::kFloat8E4M3; });
  expect_rejected("x_q", [](StageArgs& a) { a.x_q.shape[1] = 64; });
  expect_rejected("x_q", [](StageArgs& a) { a.x_q.shape[0] = 1; });
  expect_rejected("hidden_states", [](StageArgs& a) { a.hidden_states.dtype = DType::kInt32; });
  expect_rejected("bf16", [](StageArgs& a) { a.hidden_quant.group_k = 32; });
}

}  // namespace
