// The API surface beyond prepare_inputs: non-throwing entries, error-code names, TensorRef
// from runtime arrays and from DLPack, and the public shape rule.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"
#if __has_include(<dlpack/dlpack.h>)
#include "megamoe/dlpack.h"
#define MEGAMOE_TEST_DLPACK 1
#endif

namespace {

using megamoe::DType;
using megamoe::ErrorCode;
using megamoe::QuantScheme;
using megamoe::TensorRef;

TEST(Api, ErrorCodeNames) {
  EXPECT_STREQ(megamoe::to_string(ErrorCode::kInvalidArgument), "invalid_argument");
  EXPECT_STREQ(megamoe::to_string(ErrorCode::kUnsupported), "unsupported");
  EXPECT_STREQ(megamoe::to_string(ErrorCode::kCuda), "cuda");
  EXPECT_STREQ(megamoe::to_string(ErrorCode::kOutOfMemory), "out_of_memory");
  EXPECT_STREQ(megamoe::to_string(ErrorCode::kInternal), "internal");
}

TEST(Api, NonThrowingEntriesReportTheError) {
  std::vector<uint16_t> hs(2 * 100, 0);
  megamoe::StageArgs a;
  a.hidden_states = TensorRef(hs.data(), DType::kBFloat16, {2, 100});
  const megamoe::Status s = megamoe::try_prepare_inputs(a);
  EXPECT_FALSE(s.ok);
  EXPECT_FALSE(static_cast<bool>(s));
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message.find("hidden_size to be a multiple of 128"), std::string::npos) << s.message;
  EXPECT_FALSE(megamoe::try_validate(a).ok);
  megamoe::StageArgs empty;
  empty.hidden_states = TensorRef(nullptr, DType::kBFloat16, {0, 128});
  const megamoe::Status ok = megamoe::try_prepare_inputs(empty);
  EXPECT_TRUE(ok.ok);
  EXPECT_TRUE(ok.message.empty());
  megamoe::RoutingArgs r;  // rank-0 topk_ids
  EXPECT_FALSE(megamoe::try_stage_routing(r).ok);
}

TEST(Api, TensorRefFromRuntimeArrays) {
  int64_t shape[2] = {3, 5}, strides[2] = {1, 3};
  TensorRef t = TensorRef::from_arrays(nullptr, DType::kFloat32, 2, shape, strides);
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.shape[1], 5);
  EXPECT_EQ(t.strides[1], 3);
  TensorRef c = TensorRef::from_arrays(nullptr, DType::kFloat32, 2, shape, nullptr);
  EXPECT_EQ(c.strides[0], 5);
  EXPECT_EQ(c.strides[1], 1);
  EXPECT_TRUE(c.is_contiguous());
  int64_t s3[3] = {1, 2, 3};
  EXPECT_EQ(TensorRef::from_arrays(nullptr, DType::kFloat32, 3, s3, nullptr).ndim, 3);  // rejected by rank
  int64_t huge[2] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(TensorRef::from_arrays(nullptr, DType::kFloat32, 2, huge, nullptr).numel(), INT64_MAX);
  // A rank beyond kMaxRank stores no sizes: its text and contiguity read none (ASan would
  // see the reads past shape[1]).
  const TensorRef r3 = TensorRef::from_arrays(nullptr, DType::kFloat32, 3, s3, nullptr);
  EXPECT_EQ(r3.shape_str(), "(a 3-D shape)");
  EXPECT_FALSE(r3.is_contiguous());
  // A negative size is never small, even next to a zero one.
  int64_t neg[2] = {0, -1};
  EXPECT_EQ(TensorRef::from_arrays(nullptr, DType::kFloat32, 2, neg, nullptr).numel(), INT64_MAX);
}

// explain() says what prepare_inputs does with no tokens: nothing, or (full buffer) the tail.
TEST(Api, ExplainWithoutTokens) {
  std::vector<float> hs(256), w(1);
  std::vector<int32_t> ids(1);
  std::vector<uint8_t> xq(4 * 256);
  std::vector<int32_t> sf(4 * 2);
  std::vector<int64_t> io(4 * 2, 7);
  std::vector<float> wo(4 * 2);
  megamoe::StageArgs a;
  a.hidden_states = TensorRef(hs.data(), DType::kFloat32, {0, 256});
  EXPECT_EQ(megamoe::explain(a), "cpu backend: nothing to do (T == 0)");
  a.topk_weights = TensorRef(w.data(), DType::kFloat32, {0, 2});
  a.topk_ids = TensorRef(ids.data(), DType::kInt32, {0, 2});
  a.x_q = TensorRef(xq.data(), DType::kFloat8E4M3, {4, 256});
  a.x_sf = TensorRef(sf.data(), DType::kInt32, {4, 2});
  a.topk_idx_out = TensorRef(io.data(), DType::kInt64, {4, 2});
  a.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {4, 2});
  a.full_buffer = true;
  EXPECT_EQ(megamoe::explain(a), "cpu backend: the top-k repack fills the full-buffer tail (T == 0)");
  megamoe::prepare_inputs(a);  // and it does
  for (int64_t v : io) EXPECT_EQ(v, -1);
}

// explain() of the routing-only call and of the router's: validated like the call, then
// the launch as text; invalid arguments throw the call's error and nothing is run.
TEST(Api, ExplainRoutingAndRouterCalls) {
  const int64_t T = 3, E = 16, K = 2, H = 128;
  std::vector<float> w(T * K, 0.5f), logits(T * E, 1.0f), hs(T * H, 1.0f), wo(T * K), rw(T * K);
  std::vector<int32_t> ids(T * K, 1), rid(T * K), sf(T * 1);
  std::vector<int64_t> io(T * K, 7);
  std::vector<uint8_t> xq(T * H);
  megamoe::RoutingArgs r;
  r.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
  r.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
  r.topk_idx_out = TensorRef(io.data(), DType::kInt64, {T, K});
  r.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {T, K});
  EXPECT_EQ(megamoe::explain(r), "cpu backend: top-k repack of 3 x 2 entries on the calling thread");
  for (int64_t v : io) EXPECT_EQ(v, 7) << "explain ran the call";
  megamoe::RoutingArgs bad = r;
  bad.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {T, K + 1});
  EXPECT_THROW(megamoe::explain(bad), megamoe::Error);

  megamoe::RouterArgs g;
  g.router_logits = TensorRef(logits.data(), DType::kFloat32, {T, E});
  g.top_k = K;
  g.topk_ids = TensorRef(rid.data(), DType::kInt32, {T, K});
  g.topk_weights = TensorRef(rw.data(), DType::kFloat32, {T, K});
  EXPECT_EQ(megamoe::explain(g), "cpu backend: route T=3 E=16 K=2: the router over token rows (worker threads for large calls)");
  megamoe::StageArgs a;
  a.hidden_states = TensorRef(hs.data(), DType::kFloat32, {T, H});
  a.x_q = TensorRef(xq.data(), DType::kFloat8E4M3, {T, H});
  a.x_sf = TensorRef(sf.data(), DType::kInt32, {T, 1});
  a.topk_idx_out = TensorRef(io.data(), DType::kInt64, {T, K});
  a.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {T, K});
  EXPECT_EQ(megamoe::explain(g, a),
            "cpu backend: route_and_stage T=3 E=16 K=2: the router over token rows (worker threads for large "
            "calls), then the staging of its outputs (mxfp8)");
  for (int64_t v : io) EXPECT_EQ(v, 7) << "explain ran the call";
  megamoe::RouterArgs bad_g = g;
  bad_g.top_k = E + 1;
  EXPECT_THROW(megamoe::explain(bad_g), megamoe::Error);
  EXPECT_THROW(megamoe::explain(bad_g, a), megamoe::Error);
  g.router_logits = TensorRef(logits.data(), DType::kFloat32, {0, E});
  g.topk_ids = TensorRef(rid.data(), DType::kInt32, {0, K});
  g.topk_weights = TensorRef(rw.data(), DType::kFloat32, {0, K});
  EXPECT_EQ(megamoe::explain(g), "cpu backend: nothing to do (T == 0)");
}

#ifdef MEGAMOE_TEST_DLPACK
TEST(Api, TensorRefFromDlpack) {
  std::vector<float> buf(12);
  int64_t shape[2] = {3, 4}, strides[2] = {4, 1};
  DLTensor d{};
  d.data = buf.data();
  d.device = DLDevice{kDLCPU, 0};
  d.ndim = 2;
  d.dtype = DLDataType{kDLFloat, 32, 1};
  d.shape = shape;
  d.strides = strides;
  d.byte_offset = 4;
  TensorRef t = megamoe::from_dlpack(d);
  EXPECT_EQ(t.data, static_cast<void*>(buf.data() + 1));
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.shape[0], 3);
  EXPECT_EQ(t.strides[0], 4);
  d.dtype = DLDataType{kDLBfloat, 16, 1};
  EXPECT_EQ(megamoe::from_dlpack(d).dtype, DType::kBFloat16);
  d.dtype = DLDataType{10, 8, 1};  // DLPack 1.0 float8_e4m3fn
  EXPECT_EQ(megamoe::from_dlpack(d).dtype, DType::kFloat8E4M3);
  d.device = DLDevice{kDLCUDA, 2};
  EXPECT_EQ(megamoe::from_dlpack(d).device, megamoe::Device::cuda(2));
  d.device = DLDevice{static_cast<DLDeviceType>(10), 0};  // ROCm
  EXPECT_THROW(megamoe::from_dlpack(d), megamoe::Error);
  d.device = DLDevice{kDLCPU, 0};
  d.dtype = DLDataType{kDLFloat, 64, 1};
  EXPECT_THROW(megamoe::from_dlpack(d, "hidden_states"), megamoe::Error);
  d.dtype = DLDataType{kDLFloat, 32, 4};
  EXPECT_THROW(megamoe::from_dlpack(d), megamoe::Error);
}
#endif

TEST(Api, OutputShapesOfEveryFormat) {
  using megamoe::output_shapes;
  const auto m = output_shapes(4, 7168, 8, QuantScheme::mxfp8(), 128);
  EXPECT_EQ(m.x_q.shape_str(), "(4, 7168)");
  EXPECT_EQ(m.x_q.dtype, DType::kFloat8E4M3);
  EXPECT_EQ(m.x_sf.shape_str(), "(4, 56)");
  EXPECT_EQ(m.x_sf.dtype, DType::kInt32);
  EXPECT_EQ(m.topk_idx_out.shape_str(), "(4, 8)");
  ASSERT_TRUE(m.shared_x_sf.has_value());
  EXPECT_EQ(m.shared_x_sf->shape_str(), "(128, 56)");
  EXPECT_FALSE(m.x_scales.has_value());
  const auto f = output_shapes(4, 7168, 8, QuantScheme::fp8_fp32_g128());
  EXPECT_EQ(f.x_sf.shape_str(), "(4, 56)");
  EXPECT_EQ(f.x_sf.dtype, DType::kFloat32);
  const auto x4 = output_shapes(4, 7168, 8, QuantScheme::mxfp4());
  EXPECT_EQ(x4.x_q.shape_str(), "(4, 3584)");
  EXPECT_EQ(x4.x_sf.shape_str(), "(4, 56)");
  const auto nv = output_shapes(4, 7168, 8, QuantScheme::nvfp4_per_token());
  EXPECT_EQ(nv.x_sf.shape_str(), "(4, 112)");
  ASSERT_TRUE(nv.x_scales.has_value());
  EXPECT_EQ(nv.x_scales->shape_str(), "(4,)");
  EXPECT_TRUE(output_shapes(4, 7168, 8, QuantScheme::nvfp4_static()).global_scale.has_value());
  EXPECT_THROW(output_shapes(4, 7168, 8, QuantScheme::nvfp4_static(), 64), megamoe::Error);  // UE8M0 only
  EXPECT_THROW(output_shapes(4, 100, 8, QuantScheme::mxfp8()), megamoe::Error);
  EXPECT_THROW(output_shapes(-1, 128, 8, QuantScheme::mxfp8()), megamoe::Error);
  EXPECT_THROW(output_shapes(4, 128, 8, QuantScheme::mxfp8(), INT64_MAX), megamoe::Error);
  EXPECT_EQ(output_shapes(0, 128, 8, QuantScheme::mxfp8(), INT64_MAX).shared_x_sf->shape[0], 0);
}

}  // namespace
