// test_device_target.cpp: device::stage_target, the host half of the device API: the
// StageTarget it returns carries exactly the call's outputs and options (pointers, strides,
// sizes, flags), it checks everything prepare_inputs checks, and it refuses what a producer
// cannot stage (host tensors, NVFP4 online, outputs off their element size). No memory is
// touched: the CUDA pointers here are never dereferenced. The GPU half (a producer staging
// through the API, byte for byte) is tests/cuda/test_device_api.cu.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "megamoe/megamoe.h"

namespace {

using megamoe::DType;
using megamoe::ErrorCode;
using megamoe::QuantScheme;
using megamoe::TensorRef;

/// Disjoint fake device addresses, 4 KiB-aligned slots far apart.
void* slot(int i) { return reinterpret_cast<void*>(uintptr_t{0x100000000ull} + static_cast<uintptr_t>(i) * 0x10000000ull); }

struct Args {
  megamoe::StageArgs s;
  megamoe::OutputShapes o;
  Args(int64_t T, int64_t H, int64_t K, QuantScheme q, int64_t M = -1) {
    const megamoe::Device d = megamoe::Device::cuda(0);
    if (M < 0) M = T;
    o = megamoe::output_shapes(M, H, K, q);
    s.hidden_states = TensorRef(nullptr, DType::kBFloat16, {T, H}, d);
    s.topk_weights = TensorRef(slot(1), DType::kFloat32, {T, K}, d);
    s.topk_ids = TensorRef(slot(2), DType::kInt32, {T, K}, d);
    s.x_q = TensorRef(slot(3), o.x_q.dtype, {o.x_q.shape[0], o.x_q.shape[1]}, d);
    s.x_sf = TensorRef(slot(4), o.x_sf.dtype, {o.x_sf.shape[0], o.x_sf.shape[1]}, d);
    s.topk_idx_out = TensorRef(slot(5), DType::kInt64, {M, K}, d);
    s.topk_weights_out = TensorRef(slot(6), DType::kFloat32, {M, K}, d);
    if (o.x_scales) s.x_scales = TensorRef(slot(7), DType::kFloat32, {M}, d);
    if (o.global_scale) s.global_scale = TensorRef(slot(8), DType::kFloat32, {1}, d);
    s.hidden_quant = q;
    s.full_buffer = M != T;
  }
};

ErrorCode code_of(const megamoe::StageArgs& s, std::string* msg) {
  try {
    (void)megamoe::device::stage_target(s);
  } catch (const megamoe::Error& e) {
    *msg = e.what();
    return e.code();
  }
  ADD_FAILURE() << "stage_target accepted the call";
  return ErrorCode::kInternal;
}

TEST(DeviceTarget, CarriesTheOutputsAndOptions) {
  Args a(37, 7168, 6, QuantScheme::mxfp8(), 64);
  a.s.x_sf = TensorRef(slot(4), DType::kInt32, {64, 56}, {1, 64}, megamoe::Device::cuda(0));  // MN-major
  a.s.topk_ids = TensorRef(slot(2), DType::kInt64, {37, 6}, megamoe::Device::cuda(0));
  a.s.topk_weights = TensorRef(slot(1), DType::kBFloat16, {37, 6}, {1, 37}, megamoe::Device::cuda(0));
  a.s.is_padding = TensorRef(slot(9), DType::kBool, {37}, megamoe::Device::cuda(0));
  a.s.routed_scaling_factor = 2.5f;
  a.s.expert_scales = TensorRef(slot(10), DType::kFloat32, {256}, {2}, megamoe::Device::cuda(0));
  a.s.nonfinite_count = TensorRef(slot(11), DType::kInt64, {1}, megamoe::Device::cuda(0));
  const megamoe::OutputShapes sh = megamoe::output_shapes(37, 7168, 6, QuantScheme::mxfp8(), 96);
  a.s.shared_x_sf = TensorRef(slot(12), DType::kInt32, {sh.shared_x_sf->shape[0], 56}, megamoe::Device::cuda(0));
  a.s.shared_block_m = 96;
  const megamoe::device::StageTarget t = megamoe::device::stage_target(a.s);
  EXPECT_EQ(t.T, 37);
  EXPECT_EQ(t.M, 64);
  EXPECT_EQ(t.H, 7168);
  EXPECT_EQ(t.K, 6);
  EXPECT_EQ(t.G, 32);
  EXPECT_TRUE(t.full_buffer);
  EXPECT_EQ(t.x_q, slot(3));
  EXPECT_EQ(t.xq_s0, 7168);
  EXPECT_EQ(t.xq_s1, 1);
  EXPECT_EQ(t.x_sf, slot(4));
  EXPECT_EQ(t.sf_s0, 1);
  EXPECT_EQ(t.sf_s1, 64);
  EXPECT_EQ(t.shared_sf, slot(12));
  EXPECT_EQ(t.shared_bm, 96);
  EXPECT_EQ(t.ids, slot(2));
  EXPECT_EQ(t.w, slot(1));
  EXPECT_EQ(t.w_s0, 1);
  EXPECT_EQ(t.w_s1, 37);
  EXPECT_EQ(t.pad, slot(9));
  EXPECT_EQ(t.idx_out, slot(5));
  EXPECT_EQ(t.w_out, slot(6));
  EXPECT_EQ(t.flags, megamoe::device::kFlagIdsI64 | megamoe::device::kFlagWBF16 | megamoe::device::kFlagAlpha |
                         megamoe::device::kFlagExpertScales);
  EXPECT_EQ(t.alpha, 2.5f);
  EXPECT_EQ(t.escale, slot(10));
  EXPECT_EQ(t.es_s0, 2);
  EXPECT_EQ(t.n_experts, 256);
  EXPECT_EQ(t.nonfinite, slot(11));
  EXPECT_EQ(t.x_scales, nullptr);
  EXPECT_EQ(t.gscale, nullptr);
}

TEST(DeviceTarget, SecondLevelScalesAndTheFormatsWithoutScales) {
  const megamoe::device::StageTarget pt = megamoe::device::stage_target(Args(5, 256, 2, QuantScheme::nvfp4_per_token()).s);
  EXPECT_EQ(pt.x_scales, slot(7));
  EXPECT_EQ(pt.G, 16);
  EXPECT_EQ(pt.xq_s0, 128);  // two values a byte
  const megamoe::device::StageTarget st = megamoe::device::stage_target(Args(5, 256, 2, QuantScheme::nvfp4_static()).s);
  EXPECT_EQ(st.gscale, slot(8));
  const megamoe::device::StageTarget bf = megamoe::device::stage_target(Args(5, 256, 2, QuantScheme::bf16()).s);
  EXPECT_EQ(bf.G, 0);
  EXPECT_EQ(bf.x_sf, nullptr);
  EXPECT_EQ(bf.xq_s0, 256);
  const megamoe::device::StageTarget fp = megamoe::device::stage_target(Args(5, 256, 2, QuantScheme::fp8_fp32_g128()).s);
  EXPECT_EQ(fp.G, 128);
  EXPECT_NE(fp.format, bf.format);
}

TEST(DeviceTarget, WithoutTokens) {
  Args none(0, 256, 2, QuantScheme::mxfp8());
  const megamoe::device::StageTarget t = megamoe::device::stage_target(none.s);
  EXPECT_EQ(t.T, 0);
  EXPECT_EQ(t.M, 0);
  EXPECT_EQ(t.x_q, nullptr);  // a call that returns at once carries nothing
  Args tail(0, 256, 2, QuantScheme::mxfp8(), 16);
  const megamoe::device::StageTarget u = megamoe::device::stage_target(tail.s);
  EXPECT_EQ(u.T, 0);
  EXPECT_EQ(u.M, 16);
  EXPECT_TRUE(u.full_buffer);
  EXPECT_EQ(u.ids, nullptr);  // the tail reads no top-k input
  EXPECT_EQ(u.idx_out, slot(5));
}

TEST(DeviceTarget, ChecksAsPrepareInputsDoes) {
  std::string m;
  Args bad(5, 256, 2, QuantScheme::mxfp8());
  bad.s.x_q = TensorRef(slot(3), DType::kUInt8, {5, 255}, megamoe::Device::cuda(0));
  EXPECT_EQ(code_of(bad.s, &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("x_q"), std::string::npos) << m;
  Args overlap(5, 256, 2, QuantScheme::mxfp8());
  overlap.s.topk_weights_out = TensorRef(slot(5), DType::kFloat32, {5, 2}, megamoe::Device::cuda(0));
  EXPECT_EQ(code_of(overlap.s, &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("overlapping"), std::string::npos) << m;
  Args h(5, 256, 2, QuantScheme::mxfp8());
  h.s.hidden_states = TensorRef(nullptr, DType::kBFloat16, {5, 200}, megamoe::Device::cuda(0));
  EXPECT_EQ(code_of(h.s, &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("multiple of 128"), std::string::npos) << m;
}

TEST(DeviceTarget, RefusesWhatAProducerCannotStage) {
  std::string m;
  Args host(5, 256, 2, QuantScheme::mxfp8());
  for (TensorRef* t : {&host.s.hidden_states, &host.s.topk_weights, &host.s.topk_ids, &host.s.x_q, &host.s.x_sf,
                       &host.s.topk_idx_out, &host.s.topk_weights_out}) {
    t->device = megamoe::Device::cpu();
  }
  EXPECT_EQ(code_of(host.s, &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("CUDA"), std::string::npos) << m;
  Args online(5, 256, 2, QuantScheme::nvfp4_online());
  EXPECT_EQ(code_of(online.s, &m), ErrorCode::kUnsupported);
  EXPECT_NE(m.find("nvfp4_online"), std::string::npos) << m;
  Args off(5, 256, 2, QuantScheme::mxfp8());
  off.s.x_sf.data = static_cast<char*>(slot(4)) + 2;  // int32 words off their size
  EXPECT_EQ(code_of(off.s, &m), ErrorCode::kUnsupported);
  EXPECT_NE(m.find("element size"), std::string::npos) << m;
  // The try form of the library's other calls is the Status; stage_target throws only
  // megamoe::Error (checked above for every refusal).
}

}  // namespace
