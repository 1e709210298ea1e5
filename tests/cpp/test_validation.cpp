// Argument checking (SPEC.md "Argument checking"): every rejection with its message, and
// after each rejected call every output buffer still holds its poison and every input is
// unchanged. T == 0 is a no-op. CUDA tensors in a CPU-only build are kUnsupported.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using megamoe::Device;
using megamoe::DType;
using megamoe::ErrorCode;
using megamoe::QuantScheme;
using megamoe::ScaleType;
using mt::Layout;

// The reference Python function's own sentences (seed), which engines may match on.
constexpr const char* kSeedHidden128 =
    "DeepSeek V4 MegaMoE input staging requires hidden_size to be a multiple of 128.";
constexpr const char* kSeedTopkShape =
    "DeepSeek V4 MegaMoE input staging requires topk_weights and topk_ids to have the same "
    "shape.";
constexpr const char* kSeedSharedPair =
    "DeepSeek V4 MegaMoE shared input staging requires both shared_x_sf and shared_block_m.";
constexpr const char* kSeedSharedUe8m0 =
    "DeepSeek V4 MegaMoE shared input staging currently requires UE8M0-packed hidden scales.";
constexpr const char* kSeedSharedBm = "MegaMoE shared_block_m must be positive.";
constexpr const char* kSeedScheme =
    "DeepSeek V4 MegaMoE input staging requires symmetric dynamic fp8 per-group quantization "
    "with a group size dividing 128 and E8M0 or fp32 scales, got ";

/// A valid call (T = 5, H = 256, K = 3, MXFP8, is_padding, shared_x_sf with bm = 8)
/// with poisoned outputs; tests break one thing and expect a rejection.
class Validation : public ::testing::Test {
 protected:
  static constexpr int64_t T = 5, H = 256, K = 3;

  void SetUp() override { build(QuantScheme::mxfp8()); }

  void build(const QuantScheme& q) {
    p_ = mt::make_problem(T, H, K, q, DType::kBFloat16);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) mt::set_hidden(p_, t, h, static_cast<float>(t - h) * 0.25f);
    }
    p_.pad_dt = DType::kBool;
    p_.pad = {0, 1, 0, 0, 1};
    p_.bm = q.ue8m0() ? 8 : 0;
    call_ = mt::make_call(p_, mt::Layouts{});
    snapshot();
  }

  /// Remember every buffer's bytes (outputs: poison) to check nothing was written.
  void snapshot() {
    before_.clear();
    for (const auto& b : all_bufs()) before_.push_back(b.second->mem);
  }

  std::vector<std::pair<const char*, const mt::Buf*>> all_bufs() const {
    auto v = call_.inputs();
    for (const auto& o : call_.outputs()) v.push_back(o);
    return v;
  }

  ::testing::AssertionResult untouched() const {
    const auto bufs = all_bufs();
    for (size_t i = 0; i < bufs.size(); ++i) {
      auto r = mt::assert_bitwise_equal(bufs[i].first, *bufs[i].second, before_[i]);
      if (!r) return r << " (written by a rejected call)";
    }
    for (size_t i = 0; i < watched_.size(); ++i) {
      auto r = mt::assert_bitwise_equal("a substituted tensor", *watched_[i], watched_before_[i]);
      if (!r) return r << " (written by a rejected call)";
    }
    return ::testing::AssertionSuccess();
  }

  /// Buffers a test substitutes into the call (beside call_'s own): the next expect_reject
  /// checks that neither API wrote them. Returns the first one's view.
  megamoe::TensorRef watch(std::initializer_list<mt::Buf*> bufs) {
    for (mt::Buf* b : bufs) {
      watched_.push_back(b);
      watched_before_.push_back(b->mem);
    }
    return (*bufs.begin())->ref();
  }

  /// prepare_inputs (and validate) must throw @p code with a message containing every
  /// piece of @p parts, the first being its prefix when @p prefix; nothing written.
  void expect_reject(const megamoe::StageArgs& a, std::vector<std::string> parts,
                     bool prefix = false, ErrorCode code = ErrorCode::kInvalidArgument) {
    for (int api = 0; api < 2; ++api) {
      SCOPED_TRACE(api == 0 ? "prepare_inputs" : "validate");
      try {
        if (api == 0) {
          megamoe::prepare_inputs(a);
        } else {
          megamoe::validate(a);
        }
        ADD_FAILURE() << "no error; expected one containing \"" << parts.front() << "\"";
      } catch (const megamoe::Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << msg;
        if (prefix) {
          EXPECT_EQ(msg.rfind(parts.front(), 0), 0u) << "message: " << msg;
        }
        for (const std::string& s : parts) {
          EXPECT_NE(msg.find(s), std::string::npos)
              << "message \"" << msg << "\" lacks \"" << s << "\"";
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "threw a non-megamoe exception: " << e.what();
      }
      EXPECT_TRUE(untouched());
    }
    watched_.clear();
    watched_before_.clear();
  }

  megamoe::StageArgs args() const { return call_.args; }

  mt::Problem p_;
  mt::Call call_;
  std::vector<std::vector<uint8_t>> before_;
  std::vector<const mt::Buf*> watched_;
  std::vector<std::vector<uint8_t>> watched_before_;
};

TEST_F(Validation, BaselineIsValidAndMatchesReference) {
  EXPECT_NO_THROW(megamoe::validate(args()));
  EXPECT_TRUE(mt::stage_and_compare(p_, mt::Layouts{}));
}

TEST_F(Validation, HiddenSizeNotMultipleOf128) {
  for (int64_t h : {200, 64, 129, 384 + 32}) {
    SCOPED_TRACE("H=" + std::to_string(h));
    mt::Buf hs = mt::make_buf(DType::kBFloat16, T, h, Layout::kContig, false, 0);
    mt::Buf xf = mt::make_buf(DType::kFloat8E4M3, T, h, Layout::kContig, false, mt::kPoison);
    auto a = args();
    a.hidden_states = hs.ref();
    a.x_q = xf.ref();
    const std::vector<uint8_t> xf_before = xf.mem;
    expect_reject(a, {kSeedHidden128, "got " + std::to_string(h)}, true);
    EXPECT_TRUE(mt::assert_bitwise_equal("x_q", xf, xf_before));
  }
}

TEST_F(Validation, TopkShapeMismatch) {
  mt::Buf w2 = mt::make_buf(DType::kFloat32, T, K - 1, Layout::kContig, false, 0);
  auto a = args();
  a.topk_weights = w2.ref();
  expect_reject(a, {kSeedTopkShape, "(5, 2)", "(5, 3)"}, true);

  mt::Buf w4 = mt::make_buf(DType::kFloat32, T - 1, K, Layout::kContig, false, 0);
  a = args();
  a.topk_weights = w4.ref();
  expect_reject(a, {kSeedTopkShape, "(4, 3)"}, true);
}

TEST_F(Validation, SharedPairIncomplete) {
  auto a = args();
  a.shared_block_m.reset();
  expect_reject(a, {kSeedSharedPair, "shared_block_m"}, true);
  a = args();
  a.shared_x_sf.reset();
  expect_reject(a, {kSeedSharedPair, "shared_x_sf"}, true);
}

TEST_F(Validation, SharedBlockMNotPositive) {
  for (int64_t bm : {0, -1, -128}) {
    auto a = args();
    a.shared_block_m = bm;
    expect_reject(a, {kSeedSharedBm, "got " + std::to_string(bm)}, true);
  }
}

TEST_F(Validation, SharedWithFp32Scales) {
  build(QuantScheme::fp8_fp32_g128());
  mt::Buf sh = mt::make_buf(DType::kInt32, 128, 1, Layout::kContig, false, mt::kPoison);
  auto a = args();
  a.shared_x_sf = watch({&sh});
  a.shared_block_m = 8;
  expect_reject(a, {kSeedSharedUe8m0, "float32"}, true);
  // also with a correctly-shaped fp32 tensor
  mt::Buf sh2 = mt::make_buf(DType::kFloat32, 128, 2, Layout::kContig, false, mt::kPoison);
  a.shared_x_sf = watch({&sh2});
  expect_reject(a, {kSeedSharedUe8m0}, true);
}

TEST_F(Validation, SharedWrongRankOrWidth) {
  mt::Buf one_d = mt::make_buf(DType::kInt32, 256, -1, Layout::kContig, false, mt::kPoison);
  auto a = args();
  a.shared_x_sf = watch({&one_d});
  expect_reject(a, {"MegaMoE shared_x_sf must have shape (*, 2), got (256,)."}, true);

  mt::Buf wide = mt::make_buf(DType::kInt32, 128, 3, Layout::kContig, false, mt::kPoison);
  a.shared_x_sf = watch({&wide});
  expect_reject(a, {"MegaMoE shared_x_sf must have shape (*, 2), got (128, 3)."}, true);

  // The width follows the scheme: UE8M0 G = 128 with H = 512 has H/(4G) = 1 word per row.
  mt::Buf hs = mt::make_buf(DType::kBFloat16, T, 512, Layout::kContig, false, 0);
  mt::Buf xf = mt::make_buf(DType::kFloat8E4M3, T, 512, Layout::kContig, false, mt::kPoison);
  mt::Buf sf = mt::make_buf(DType::kInt32, T, 1, Layout::kContig, false, mt::kPoison);
  a = args();
  a.hidden_quant = QuantScheme::fp8_ue8m0_g128();
  a.hidden_states = hs.ref();
  a.x_q = watch({&xf, &sf});
  a.x_sf = sf.ref();
  a.shared_x_sf = call_.shared->ref();  // (128, 2)
  expect_reject(a, {"MegaMoE shared_x_sf must have shape (*, 1), got (128, 2)."}, true);
  mt::Buf narrow = mt::make_buf(DType::kInt32, 128, 1, Layout::kTransposed, false, mt::kPoison);
  a.shared_x_sf = narrow.ref();
  EXPECT_NO_THROW(megamoe::validate(a));
}

TEST_F(Validation, SharedTooFewRows) {
  mt::Buf sh = mt::make_buf(DType::kInt32, 127, 2, Layout::kContig, false, mt::kPoison);
  auto a = args();
  a.shared_x_sf = watch({&sh});
  expect_reject(a, {"MegaMoE shared_x_sf has insufficient rows: requires 128, got 127."}, true);

  // ceil(5 / 2) = 3 blocks of 128 rows.
  mt::Buf sh3 = mt::make_buf(DType::kInt32, 383, 2, Layout::kContig, false, mt::kPoison);
  a.shared_x_sf = watch({&sh3});
  a.shared_block_m = 2;
  expect_reject(a, {"MegaMoE shared_x_sf has insufficient rows: requires 384, got 383."}, true);

  // bm = 192 -> abm = 256, and a transposed view counts rows by its shape.
  mt::Buf sh4 = mt::make_buf(DType::kInt32, 255, 2, Layout::kTransposed, false, mt::kPoison);
  a.shared_x_sf = watch({&sh4});
  a.shared_block_m = 192;
  expect_reject(a, {"requires 256, got 255."});
}

TEST_F(Validation, SharedWrongDtype) {
  mt::Buf sh = mt::make_buf(DType::kFloat32, 128, 2, Layout::kContig, false, mt::kPoison);
  auto a = args();
  a.shared_x_sf = watch({&sh});
  expect_reject(a, {"megamoe: shared_x_sf: expected dtype int32, got dtype float32"}, true);
}

TEST_F(Validation, AmaxFloorBounds) {
  // fp8 with fp32 scales and NVFP4 per-token store an fp32 scale derived from the floor:
  // positive floors below 2^-100 are rejected by name (a zero group's scale would
  // underflow); the UE8M0 formats clamp their exponent and take any positive floor. A floor
  // of 0 (either sign) is accepted by every format: the unit scale (CONTRACT.md).
  const float below = std::nextafter(0x1p-100f, 0.0f);
  for (const QuantScheme& base : {QuantScheme::fp8_fp32_g128(), QuantScheme::fp8_fp32_g32(),
                                  QuantScheme::nvfp4_per_token()}) {
    for (const float floor : {below, 1e-35f, 3e-43f, std::numeric_limits<float>::denorm_min()}) {
      const QuantScheme q = base.with_amax_floor(floor);
      SCOPED_TRACE(megamoe::to_string(q));
      auto a = args();
      a.hidden_quant = q;
      expect_reject(a, {"megamoe: hidden_quant: amax_floor: ", "needs a floor >= 2^-100",
                        "or a floor of 0 (the unit scale); got", megamoe::to_string(q) + "."},
                    true);
      EXPECT_THROW(megamoe::check_scheme(q), megamoe::Error);
      EXPECT_EQ(megamoe::scheme_name(q), "unsupported");
    }
    EXPECT_NO_THROW(megamoe::check_scheme(base.with_amax_floor(0x1p-100f)));
  }
  for (const QuantScheme& base : {QuantScheme::mxfp8(), QuantScheme::fp8_ue8m0_g128(), QuantScheme::mxfp4(),
                                  QuantScheme::mxfp4(megamoe::Rounding::kNearestEven)}) {
    EXPECT_NO_THROW(megamoe::check_scheme(base.with_amax_floor(std::numeric_limits<float>::denorm_min())))
        << megamoe::to_string(base);
  }
  for (const QuantScheme& base :
       {QuantScheme::mxfp8(), QuantScheme::fp8_ue8m0_g128(), QuantScheme::fp8_fp32_g128(), QuantScheme::fp8_fp32_g32(),
        QuantScheme::mxfp8_e5m2(), QuantScheme::mxfp4(), QuantScheme::mxfp4(megamoe::Rounding::kNearestEven),
        QuantScheme::nvfp4_static(), QuantScheme::nvfp4_per_token(), mt::scheme(false, 64), mt::scheme(true, 16)}) {
    for (const float zero : {0.0f, -0.0f}) {
      const QuantScheme q = base.with_amax_floor(zero);
      SCOPED_TRACE(megamoe::to_string(q));
      EXPECT_NO_THROW(megamoe::check_scheme(q));
      EXPECT_NE(megamoe::scheme_name(q), "unsupported");
      auto a = args();
      a.hidden_quant = q;
      if (q == QuantScheme::mxfp8().with_amax_floor(zero)) {
        EXPECT_NO_THROW(megamoe::validate(a));
      }
    }
  }
}

TEST_F(Validation, UnsupportedSchemes) {
  std::vector<std::pair<const char*, QuantScheme>> bad;
  QuantScheme q;
  q = QuantScheme::mxfp8(); q.is_static = true; bad.emplace_back("static", q);
  q = QuantScheme::mxfp8(); q.symmetric = false; bad.emplace_back("asymmetric", q);
  q = QuantScheme::mxfp8(); q.scale2 = megamoe::Scale2::kStatic; bad.emplace_back("scale2", q);
  q = QuantScheme::mxfp8_e5m2(); q.scale = ScaleType::kFloat32; bad.emplace_back("e5m2 fp32 scales", q);
  q = QuantScheme::mxfp8_e5m2(); q.group_k = 128; bad.emplace_back("e5m2 G=128", q);
  q = QuantScheme::mxfp8_e5m2(); q.rounding = megamoe::Rounding::kTiesTowardZero; bad.emplace_back("e5m2 ttz", q);
  q = QuantScheme::mxfp8(); q.elem = megamoe::QuantElem::kInt8; bad.emplace_back("int8", q);
  q = QuantScheme::mxfp8(); q.amax_floor = -1e-4f; bad.emplace_back("floor < 0", q);
  q = QuantScheme::mxfp8(); q.amax_floor = -std::numeric_limits<float>::denorm_min(); bad.emplace_back("floor -denorm", q);
  q = QuantScheme::fp8_fp32_g128(); q.amax_floor = -1e-4f; bad.emplace_back("fp32 floor < 0", q);
  q = QuantScheme::mxfp8(); q.amax_floor = std::numeric_limits<float>::infinity(); bad.emplace_back("floor inf", q);
  q = QuantScheme::mxfp8(); q.amax_floor = std::numeric_limits<float>::quiet_NaN(); bad.emplace_back("floor nan", q);
  q = QuantScheme::mxfp8(); q.rounding = megamoe::Rounding::kTiesTowardZero; bad.emplace_back("fp8 ttz", q);
  // Raw bytes outside the enum (a fuzzer's 49 and 170): rejected, with no shift past 32 bits.
  q = QuantScheme::mxfp8(); q.rounding = static_cast<megamoe::Rounding>(49); bad.emplace_back("rounding 49", q);
  q = QuantScheme::mxfp8(); q.rounding = static_cast<megamoe::Rounding>(170); bad.emplace_back("rounding 170", q);
  q = QuantScheme::fp8_fp32_g128(); q.scale = ScaleType::kFloat8E4M3; bad.emplace_back("fp8 e4m3 scales", q);
  q = QuantScheme::mxfp8(); q.group_k = 48; bad.emplace_back("G=48", q);
  q = QuantScheme::mxfp8(); q.group_k = 256; bad.emplace_back("G=256", q);
  q = QuantScheme::fp8_fp32_g128(); q.group_k = 3; bad.emplace_back("G=3", q);
  q = QuantScheme::mxfp8(); q.group_k = 0; bad.emplace_back("per-token G=0", q);
  q = QuantScheme::mxfp8(); q.group_k = -1; bad.emplace_back("G=-1", q);
  q = QuantScheme::mxfp8(); q.group_m = 2; bad.emplace_back("group_m=2", q);
  q = QuantScheme::mxfp8(); q.group_m = 128; q.group_k = 128; bad.emplace_back("128x128 block", q);
  q = QuantScheme::mxfp8(); q.scale = ScaleType::kFloat16; bad.emplace_back("fp16 scale", q);
  q = QuantScheme::fp8_fp32_g128(); q.is_static = true; bad.emplace_back("static fp32", q);
  for (const auto& [name, scheme] : bad) {
    SCOPED_TRACE(name);
    auto a = args();
    a.hidden_quant = scheme;
    expect_reject(a, {kSeedScheme, megamoe::to_string(scheme) + "."}, true);
    EXPECT_THROW(megamoe::check_scheme(scheme), megamoe::Error);
  }
  // Rejected fp4 schemes name the FP4 families instead of the fp8 sentence.
  std::vector<std::pair<const char*, QuantScheme>> bad4;
  q = QuantScheme::mxfp4(); q.group_k = 16; bad4.emplace_back("mxfp4 G=16", q);
  q = QuantScheme::mxfp4(); q.scale = ScaleType::kFloat32; bad4.emplace_back("fp4 fp32 scales", q);
  q = QuantScheme::mxfp4(); q.scale2 = megamoe::Scale2::kPerToken; bad4.emplace_back("mxfp4 + scale2", q);
  q = QuantScheme::nvfp4_static(); q.rounding = megamoe::Rounding::kNearestEven; bad4.emplace_back("nvfp4 rne", q);
  q = QuantScheme::nvfp4_static(); q.scale2 = megamoe::Scale2::kNone; bad4.emplace_back("nvfp4 no scale2", q);
  q = QuantScheme::nvfp4_per_token(); q.group_k = 32; bad4.emplace_back("nvfp4 G=32", q);
  q = QuantScheme::nvfp4_per_token(); q.is_static = true; bad4.emplace_back("nvfp4 static sf", q);
  q = QuantScheme::mxfp4(); q.amax_floor = -1e-4f; bad4.emplace_back("mxfp4 floor < 0", q);
  q = QuantScheme::nvfp4_per_token(); q.amax_floor = std::numeric_limits<float>::infinity(); bad4.emplace_back("nvfp4 floor inf", q);
  for (const auto& [name, scheme] : bad4) {
    SCOPED_TRACE(name);
    auto a = args();
    a.hidden_quant = scheme;
    expect_reject(a, {"megamoe: hidden_quant: fp4 e2m1 staging supports MXFP4", megamoe::to_string(scheme) + "."}, true);
    EXPECT_THROW(megamoe::check_scheme(scheme), megamoe::Error);
  }
  for (const QuantScheme& ok : {QuantScheme::mxfp4(), QuantScheme::mxfp4(megamoe::Rounding::kNearestEven),
                                QuantScheme::nvfp4_static(), QuantScheme::nvfp4_per_token(),
                                QuantScheme::fp8_fp32_g128().with_amax_floor(1e-10f)}) {
    EXPECT_NO_THROW(megamoe::check_scheme(ok)) << megamoe::to_string(ok);
  }
  for (const QuantScheme& ok : {QuantScheme::mxfp8(), QuantScheme::fp8_ue8m0_g128(),
                                QuantScheme::fp8_fp32_g128(), QuantScheme::fp8_fp32_g32(),
                                mt::scheme(true, 1), mt::scheme(false, 64)}) {
    EXPECT_NO_THROW(megamoe::check_scheme(ok)) << megamoe::to_string(ok);
  }
}

TEST_F(Validation, Ue8m0NeedsFourGroupsPerWord) {
  // UE8M0 G = 128 needs H % 512 == 0; G = 64 needs H % 256 == 0.
  build(QuantScheme::fp8_ue8m0_g128());
  expect_reject(args(), {"megamoe: hidden_states: expected hidden_size / group_size to be a "
                         "multiple of 4 (4 scale bytes per int32 word), got 256 / 128"},
                true);
  mt::Buf hs = mt::make_buf(DType::kBFloat16, T, 128, Layout::kContig, false, 0);
  mt::Buf xf = mt::make_buf(DType::kFloat8E4M3, T, 128, Layout::kContig, false, mt::kPoison);
  auto a = args();
  a.hidden_quant = mt::scheme(true, 64);
  a.hidden_states = hs.ref();
  a.x_q = watch({&xf});
  expect_reject(a, {"got 128 / 64"});
  // fp32 scales have no packing constraint.
  build(QuantScheme::fp8_fp32_g128());
  EXPECT_NO_THROW(megamoe::validate(args()));
}

/// Names of every tensor argument, in the validator's order.
const char* const kSlots[] = {"hidden_states", "topk_weights", "topk_ids",
                              "is_padding",    "x_q",        "x_sf",
                              "topk_idx_out",  "topk_weights_out", "shared_x_sf"};

/// The tensor argument called @p n (optional ones are created when absent).
megamoe::TensorRef& slot(megamoe::StageArgs& a, const std::string& n) {
  if (n == "hidden_states") return a.hidden_states;
  if (n == "topk_weights") return a.topk_weights;
  if (n == "topk_ids") return a.topk_ids;
  if (n == "x_q") return a.x_q;
  if (n == "x_sf") return a.x_sf;
  if (n == "topk_idx_out") return a.topk_idx_out;
  if (n == "topk_weights_out") return a.topk_weights_out;
  std::optional<megamoe::TensorRef>& o = n == "is_padding" ? a.is_padding : a.shared_x_sf;
  if (!o) o.emplace();
  return *o;
}

/// One tensor argument replaced by a [rows, cols] tensor of dtype dt (cols < 0: 1-D),
/// and the message piece the rejection must contain.
struct BadTensor {
  const char* slot;
  DType dt;
  int64_t rows, cols;
  const char* expect;
};

TEST_F(Validation, WrongDtypes) {
  const BadTensor cases[] = {
      {"hidden_states", DType::kInt32, T, H, "hidden_states: expected dtype bfloat16 or float16 or float32, got dtype int32"},
      {"hidden_states", DType::kFloat8E4M3, T, H, "got dtype float8_e4m3fn"},
      {"topk_weights", DType::kInt64, T, K, "topk_weights: expected dtype float32 or bfloat16 or float16, got dtype int64"},
      {"topk_ids", DType::kFloat32, T, K, "topk_ids: expected dtype int32 or int64, got dtype float32"},
      {"topk_ids", DType::kUInt8, T, K, "topk_ids: expected dtype int32 or int64, got dtype uint8"},
      {"is_padding", DType::kInt32, T, -1, "is_padding: expected dtype bool or uint8, got dtype int32"},
      {"x_q", DType::kBFloat16, T, H, "x_q: expected dtype float8_e4m3fn or uint8, got dtype bfloat16"},
      {"x_q", DType::kBool, T, H, "x_q: expected dtype float8_e4m3fn or uint8, got dtype bool"},
      {"x_sf", DType::kFloat32, T, 2, "x_sf: expected dtype int32, got dtype float32"},
      {"x_sf", DType::kInt64, T, 2, "x_sf: expected dtype int32, got dtype int64"},
      {"topk_idx_out", DType::kInt32, T, K, "topk_idx_out: expected dtype int64, got dtype int32"},
      {"topk_weights_out", DType::kBFloat16, T, K, "topk_weights_out: expected dtype float32, got dtype bfloat16"},
      {"shared_x_sf", DType::kInt64, 128, 2, "shared_x_sf: expected dtype int32, got dtype int64"},
  };
  for (const BadTensor& c : cases) {
    SCOPED_TRACE(std::string(c.slot) + " " + megamoe::dtype_name(c.dt));
    mt::Buf b = mt::make_buf(c.dt, c.rows, c.cols, Layout::kContig, false, mt::kPoison);
    auto a = args();
    slot(a, c.slot) = watch({&b});
    expect_reject(a, {c.expect});
  }
  // fp32 scales need an fp32 x_sf.
  build(QuantScheme::fp8_fp32_g128());
  mt::Buf sf = mt::make_buf(DType::kInt32, T, 2, Layout::kContig, false, mt::kPoison);
  auto a = args();
  a.x_sf = watch({&sf});
  expect_reject(a, {"megamoe: x_sf: expected dtype float32, got dtype int32"}, true);
}

TEST_F(Validation, WrongRanks) {
  for (const std::string n : kSlots) {
    SCOPED_TRACE(n);
    const bool one_d = n == "is_padding";
    // A rank that is wrong for the slot (2-D for is_padding, 1-D for everything else),
    // with the slot's own dtype so that only the rank is wrong.
    mt::Buf b = mt::make_buf(DType::kInt32, T, one_d ? 1 : -1, Layout::kContig, false, mt::kPoison);
    auto a = args();
    megamoe::TensorRef r = watch({&b});
    r.dtype = slot(a, n).dtype;
    slot(a, n) = r;
    if (n == "shared_x_sf") {
      expect_reject(a, {"MegaMoE shared_x_sf must have shape (*, 2), got (5,)."}, true);
    } else {
      expect_reject(a, {"megamoe: " + n + ": expected " + (one_d ? "1" : "2") +
                        "-D tensor, got " + (one_d ? "2" : "1") + "-D tensor"},
                    true);
    }
  }
  // Rank 0 and a rank the TensorRef constructor rejects (3-D -> ndim -1).
  megamoe::TensorRef scalar;
  scalar.data = call_.x_q.ref().data;
  scalar.dtype = DType::kFloat8E4M3;
  auto a = args();
  a.x_q = scalar;
  expect_reject(a, {"x_q: expected 2-D tensor, got 0-D tensor"});
  megamoe::TensorRef three(call_.x_q.ref().data, DType::kFloat8E4M3, {1, T, H});
  a = args();
  a.x_q = three;
  expect_reject(a, {"x_q: expected 2-D tensor"});
}

TEST_F(Validation, WrongShapes) {
  const BadTensor cases[] = {
      {"topk_ids", DType::kInt64, T - 1, K, nullptr},  // with matching weights below
      {"is_padding", DType::kBool, T - 1, -1, "is_padding: expected shape (5,), got shape (4,)"},
      {"is_padding", DType::kBool, T + 1, -1, "is_padding: expected shape (5,), got shape (6,)"},
      {"x_q", DType::kFloat8E4M3, T, H / 2, "x_q: expected shape (5, 256), got shape (5, 128)"},
      {"x_q", DType::kFloat8E4M3, T + 1, H, "x_q: expected shape (5, 256), got shape (6, 256)"},
      {"x_q", DType::kFloat8E4M3, H, T, "x_q: expected shape (5, 256), got shape (256, 5)"},
      {"x_sf", DType::kInt32, T, 8, "x_sf: expected shape (5, 2), got shape (5, 8)"},
      {"x_sf", DType::kInt32, T - 1, 2, "x_sf: expected shape (5, 2), got shape (4, 2)"},
      {"topk_idx_out", DType::kInt64, T, K + 1, "topk_idx_out: expected shape (5, 3), got shape (5, 4)"},
      {"topk_weights_out", DType::kFloat32, T, K - 1, "topk_weights_out: expected shape (5, 3), got shape (5, 2)"},
      {"topk_weights_out", DType::kFloat32, T - 1, K, "topk_weights_out: expected shape (5, 3), got shape (4, 3)"},
  };
  for (const BadTensor& c : cases) {
    SCOPED_TRACE(c.slot);
    mt::Buf b = mt::make_buf(c.dt, c.rows, c.cols, Layout::kContig, false, mt::kPoison);
    auto a = args();
    if (c.expect == nullptr) {  // ids and weights agree with each other but not with T
      mt::Buf w = mt::make_buf(DType::kFloat32, c.rows, c.cols, Layout::kContig, false, 0);
      a.topk_ids = watch({&b, &w});
      a.topk_weights = w.ref();
      expect_reject(a, {"megamoe: topk_ids: expected shape (5, 3), got shape (4, 3)"}, true);
      continue;
    }
    slot(a, c.slot) = watch({&b});
    expect_reject(a, {c.expect});
  }
  // fp32 scales: x_sf is [T, H/G] floats.
  build(QuantScheme::fp8_fp32_g32());
  mt::Buf sf = mt::make_buf(DType::kFloat32, T, 2, Layout::kContig, false, mt::kPoison);
  auto a = args();
  a.x_sf = watch({&sf});
  expect_reject(a, {"x_sf: expected shape (5, 8), got shape (5, 2)"});
  // Negative sizes.
  megamoe::TensorRef neg = call_.hidden.ref();
  neg.shape[0] = -1;
  a = args();
  a.hidden_states = neg;
  expect_reject(a, {"hidden_states: expected non-negative sizes, got (-1, 256)"});
}

TEST_F(Validation, MixedDevices) {
  for (const std::string n : kSlots) {
    SCOPED_TRACE(n);
    auto a = args();
    slot(a, n).device = Device::cuda(0);  // the slot's own valid tensor, relabelled
    if (n == "hidden_states") {  // everything else disagrees with hidden_states
      expect_reject(a, {"megamoe: topk_weights: expected device cuda:0, got device cpu"}, true);
    } else {
      expect_reject(a, {"megamoe: " + n + ": expected device cpu, got device cuda:0"}, true);
    }
  }
  // All on CUDA but on two devices.
  auto a = args();
  for (const char* n : kSlots) slot(a, n).device = Device::cuda(0);
  a.x_sf.device = Device::cuda(1);
  expect_reject(a, {"megamoe: x_sf: expected device cuda:0, got device cuda:1"}, true);
}

// A CUDA tensor whose data pointer is not a multiple of its element size is valid: the
// CUDA backend stages it through an aligned copy (cuda/aligned.cuh; tests/cuda runs it).
// (validate reads no element: the host buffers stand in for device memory.)
TEST_F(Validation, CudaTensorsTakeAnyAddress) {
  std::vector<uint8_t> spare(64 * 1024 + 16);
  for (const std::string n : kSlots) {
    SCOPED_TRACE(n);
    auto a = args();
    for (const char* m : kSlots) slot(a, m).device = Device::cuda(0);
    megamoe::TensorRef& t = slot(a, n);
    // The same shape and strides at an odd address inside a spare buffer (nothing overlaps).
    uint8_t* base = spare.data() + (16 - reinterpret_cast<uintptr_t>(spare.data()) % 16) + 1;
    t.data = base;
    EXPECT_NO_THROW(megamoe::validate(a)) << "a CUDA tensor one byte past its element alignment";
    for (const char* m : kSlots) slot(a, m).device = Device::cpu();
    EXPECT_NO_THROW(megamoe::validate(a)) << "the CPU takes any address";
  }
}

TEST_F(Validation, CudaTensorsInCpuOnlyBuildAreUnsupported) {
  if (megamoe::has_cuda_backend()) GTEST_SKIP() << "this build has the CUDA backend";
  auto a = args();
  for (const char* n : kSlots) slot(a, n).device = Device::cuda(0);
  EXPECT_NO_THROW(megamoe::validate(a));
  try {
    megamoe::prepare_inputs(a);
    ADD_FAILURE() << "no error";
  } catch (const megamoe::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(untouched());
}

TEST_F(Validation, OutputOverlapsInput) {
  // x_q inside hidden_states' buffer: T*H bytes fit in T*H bf16 elements.
  auto a = args();
  megamoe::TensorRef x = a.x_q;
  x.data = a.hidden_states.data;
  a.x_q = x;
  expect_reject(a, {"megamoe: x_q: expected memory disjoint from hidden_states, got overlapping memory"}, true);

  // topk_weights_out over topk_weights (same dtype, same shape: in-place repack).
  a = args();
  megamoe::TensorRef w = a.topk_weights_out;
  w.data = a.topk_weights.data;
  a.topk_weights_out = w;
  expect_reject(a, {"topk_weights_out: expected memory disjoint from topk_weights"});

  // x_sf (40 bytes) starting in is_padding's leading gap and covering its 5 bytes.
  a = args();
  megamoe::TensorRef sf = a.x_sf;
  sf.data = static_cast<uint8_t*>(a.is_padding->data) - mt::kMargin;
  a.x_sf = sf;
  expect_reject(a, {"x_sf: expected memory disjoint from is_padding"});

  // topk_idx_out starting in the middle of topk_ids (negative strides reach backwards).
  a = args();
  megamoe::TensorRef idx = a.topk_idx_out;
  idx.data = static_cast<int64_t*>(a.topk_ids.data) + T * K - 1;
  idx.strides[0] = -K;
  idx.strides[1] = -1;
  a.topk_idx_out = idx;
  expect_reject(a, {"topk_idx_out: expected memory disjoint from topk_ids"});
}

TEST_F(Validation, OutputsOverlapEachOther) {
  auto a = args();
  megamoe::TensorRef w = a.topk_weights_out;
  w.data = a.topk_idx_out.data;  // fp32 [5,3] inside int64 [5,3]
  a.topk_weights_out = w;
  expect_reject(a, {"megamoe: topk_idx_out: expected memory disjoint from topk_weights_out, got overlapping memory"}, true);

  a = args();
  megamoe::TensorRef sh = *a.shared_x_sf;
  megamoe::TensorRef sf = a.x_sf;
  sf.data = static_cast<int32_t*>(sh.data) + 100;
  a.x_sf = sf;
  expect_reject(a, {"x_sf: expected memory disjoint from shared_x_sf"});

  // A transposed x_q view and x_sf carved from one scratch buffer, 3 bytes apart.
  std::vector<uint8_t> scratch(static_cast<size_t>(T * H + 64), mt::kPoison);
  const std::vector<uint8_t> scratch_before = scratch;
  a = args();
  a.x_sf.data = scratch.data();
  a.x_q = megamoe::TensorRef(scratch.data() + 3, DType::kFloat8E4M3, {T, H}, {1, T});
  expect_reject(a, {"megamoe: x_q: expected memory disjoint from x_sf, got overlapping memory"}, true);
  EXPECT_EQ(scratch, scratch_before);
}

TEST_F(Validation, OutputWithAliasingStrides) {
  struct Case {
    const char* slot;
    int64_t s0, s1;
  };
  const Case cases[] = {{"x_q", 0, 1},        {"x_q", H, 0},      {"x_q", H / 2, 1},
                        {"x_sf", 2, 0},         {"x_sf", 0, 0},       {"topk_idx_out", 0, 1},
                        {"topk_weights_out", 1, 1}, {"shared_x_sf", 0, 1}, {"shared_x_sf", 1, 64}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.slot) + " strides (" + std::to_string(c.s0) + ", " +
                 std::to_string(c.s1) + ")");
    auto a = args();
    const std::string n = c.slot;
    slot(a, n).strides[0] = c.s0;
    slot(a, n).strides[1] = c.s1;
    expect_reject(a, {"megamoe: " + n + ": expected strides that give every element its own address"}, true);
  }
  // A zero stride on an input is fine (broadcast row), and so is one on a size-1 dim of an output.
  auto a = args();
  megamoe::TensorRef hs = a.hidden_states;
  hs.strides[0] = 0;
  a.hidden_states = hs;
  EXPECT_NO_THROW(megamoe::validate(a));
}

TEST_F(Validation, NullData) {
  for (const std::string n : kSlots) {
    SCOPED_TRACE(n);
    auto a = args();
    slot(a, n).data = nullptr;
    expect_reject(a, {"megamoe: " + n + ": expected a non-null data pointer, got nullptr"}, true);
  }
}

TEST_F(Validation, ZeroTokensIsANoOp) {
  // Everything but hidden_states' rank and dtype may be wrong: the call returns at once.
  mt::Buf hs = mt::make_buf(DType::kBFloat16, 0, 100, Layout::kContig, false, 0);
  auto a = args();
  a.hidden_states = hs.ref();
  a.hidden_states.data = nullptr;
  a.hidden_quant.group_k = 48;
  a.topk_ids = megamoe::TensorRef();
  a.x_sf.dtype = DType::kFloat16;
  a.shared_block_m.reset();
  a.x_q.device = Device::cuda(3);
  EXPECT_NO_THROW(megamoe::prepare_inputs(a));
  EXPECT_NO_THROW(megamoe::validate(a));
  EXPECT_TRUE(untouched());
  // A consistent T == 0 call with real (empty) buffers, also with CUDA-labelled tensors.
  mt::Problem z = mt::make_problem(0, 256, 3, QuantScheme::mxfp8());
  mt::Call c = mt::make_call(z, mt::Layouts{});
  EXPECT_NO_THROW(megamoe::prepare_inputs(c.args));
  c.args.hidden_states.device = Device::cuda(0);
  EXPECT_NO_THROW(megamoe::prepare_inputs(c.args));
}

}  // namespace
