// gpu_buf.h: the GPU tests' host buffers and their device twins (test_norm_cuda.cu,
// test_mhc_cuda.cu): a CUDA backend call on the twins is compared byte for byte with the
// CPU backend's on the host buffers.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"

namespace megamoe_test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// One host buffer and its device twin (@p skew bytes into the allocation).
struct Buf {
  std::vector<uint8_t> host;
  uint8_t* dev = nullptr;
  void* alloc = nullptr;
  Buf(size_t bytes, uint8_t fill, size_t skew) : host(bytes, fill) {
    if (cudaMalloc(&alloc, bytes + skew + 16) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    dev = static_cast<uint8_t*>(alloc) + skew;
  }
  ~Buf() { cudaFree(alloc); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void up() { cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice); }
  std::vector<uint8_t> down() const {
    std::vector<uint8_t> r(host.size());
    cudaMemcpy(r.data(), dev, r.size(), cudaMemcpyDeviceToHost);
    return r;
  }
  /// Element i of the host buffer as an fp32, or as the bf16 truncation of @p f.
  void put_f32(size_t i, float f) { std::memcpy(&host[i * 4], &f, 4); }
  void put_bf16(size_t i, float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t b = static_cast<uint16_t>(u >> 16);
    std::memcpy(&host[i * 2], &b, 2);
  }
};

/// The staging side of a producer call: the top-k inputs (T rows of K) and every staged
/// output (M rows, poisoned), NVFP4's global scale, the non-finite counter (from 5).
struct StagedBufs {
  int64_t T, H, K, M;
  megamoe::QuantScheme q;
  megamoe::OutputShapes o;
  std::unique_ptr<Buf> tw, ti, xq, sf, xs, io, wo, gs, nf;
  StagedBufs(int64_t T_, int64_t H_, int64_t K_, int64_t M_, megamoe::QuantScheme q_, size_t skew, std::mt19937& rng)
      : T(T_), H(H_), K(K_), M(M_), q(q_), o(megamoe::output_shapes(M_, H_, K_, q_)) {
    const size_t tk = static_cast<size_t>(std::max<int64_t>(T * K, 1));
    tw = std::make_unique<Buf>(tk * 4, 0, skew);
    ti = std::make_unique<Buf>(tk * 4, 0, skew);
    for (int64_t i = 0; i < T * K; ++i) {
      const float f = static_cast<float>(rng() % 1000) / 1000.0f;
      const int32_t id = static_cast<int32_t>(rng() % 256);
      tw->put_f32(static_cast<size_t>(i), f);
      std::memcpy(&ti->host[static_cast<size_t>(i) * 4], &id, 4);
    }
    xq = std::make_unique<Buf>(static_cast<size_t>(o.x_q.shape[0] * o.x_q.shape[1] * megamoe::dtype_size(o.x_q.dtype)),
                               0xA5, 0);
    sf = std::make_unique<Buf>(static_cast<size_t>(o.x_sf.shape[0] * o.x_sf.shape[1]) * 4, 0xA5, skew);
    xs = std::make_unique<Buf>(static_cast<size_t>(M) * 4 + 4, 0xA5, skew);
    io = std::make_unique<Buf>(static_cast<size_t>(M * K) * 8 + 8, 0xA5, skew);
    wo = std::make_unique<Buf>(static_cast<size_t>(M * K) * 4 + 4, 0xA5, skew);
    gs = std::make_unique<Buf>(4, 0, skew);  // NVFP4 static's input, online's output
    gs->put_f32(0, 0.0125f);
    nf = std::make_unique<Buf>(8, 0, skew);
    const int64_t five = 5;
    std::memcpy(nf->host.data(), &five, 8);
  }
  std::vector<Buf*> all() const {
    return {tw.get(), ti.get(), xq.get(), sf.get(), xs.get(), io.get(), wo.get(), gs.get(), nf.get()};
  }
  static std::vector<const char*> names() {
    return {"topk_weights", "topk_ids",         "x_q",          "x_sf",           "x_scales",
            "topk_idx_out", "topk_weights_out", "global_scale", "nonfinite_count"};
  }
  /// StageArgs over the host (dev = false) or device buffers (full buffer when M != T).
  megamoe::StageArgs args(bool dev) const {
    using megamoe::DType;
    using megamoe::TensorRef;
    const megamoe::Device d = dev ? megamoe::Device::cuda(0) : megamoe::Device::cpu();
    auto at = [&](Buf& b) -> void* { return dev ? static_cast<void*>(b.dev) : static_cast<void*>(b.host.data()); };
    megamoe::StageArgs s;
    s.topk_weights = TensorRef(at(*tw), DType::kFloat32, {T, K}, d);
    s.topk_ids = TensorRef(at(*ti), DType::kInt32, {T, K}, d);
    s.x_q = TensorRef(at(*xq), o.x_q.dtype, {o.x_q.shape[0], o.x_q.shape[1]}, d);
    s.x_sf = TensorRef(at(*sf), o.x_sf.dtype, {o.x_sf.shape[0], o.x_sf.shape[1]}, d);
    if (o.x_scales) s.x_scales = TensorRef(at(*xs), DType::kFloat32, {M}, d);
    s.topk_idx_out = TensorRef(at(*io), DType::kInt64, {M, K}, d);
    s.topk_weights_out = TensorRef(at(*wo), DType::kFloat32, {M, K}, d);
    if (o.global_scale) s.global_scale = TensorRef(at(*gs), DType::kFloat32, {1}, d);
    s.nonfinite_count = TensorRef(at(*nf), DType::kInt64, {1}, d);
    s.hidden_quant = q;
    s.full_buffer = M != T;
    return s;
  }
};

/// @p call(stream) on a new stream: eagerly, or (@p graph) captured in a CUDA graph that is
/// replayed twice; then synchronized. @p what names the case in failures.
template <typename Call>
void run_on_stream(bool graph, const std::string& what, Call call) {
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  if (graph) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_NO_THROW(call(st)) << what;
    ASSERT_EQ(cudaStreamEndCapture(st, &g), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, st), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, st), cudaSuccess);  // replays give the same bytes
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  } else {
    ASSERT_NO_THROW(call(st)) << what;
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  }
  cudaStreamDestroy(st);
}

/// Every buffer's device bytes equal its host bytes (@p names[i] names bufs[i]).
inline void expect_same_bytes(const std::vector<Buf*>& bufs, const std::vector<const char*>& names,
                              const std::string& what) {
  for (size_t i = 0; i < bufs.size(); ++i) {
    const std::vector<uint8_t> got = bufs[i]->down();
    ASSERT_EQ(got, bufs[i]->host) << names[i] << ": " << what;
  }
}

/// A producer call, @p run(args, stage, stream), on @p call's host buffers (the CPU
/// backend), then on their device twins: eager, or (@p graph) captured with PDL and
/// replayed twice, after which the host runs once more (the counter counts as often).
/// Every byte of every buffer must then be equal; @p comparable false (a call in place,
/// whose replay reads its own output) skips the comparison. @p call has up(), args(dev,
/// a, s), all() and names().
template <typename Args, typename CallT, typename Run>
void check_producer(CallT& call, bool graph, bool comparable, const std::string& what, Run run) {
  call.up();
  Args a;
  megamoe::StageArgs s;
  call.args(false, a, s);
  ASSERT_NO_THROW(run(a, s, nullptr)) << what;
  call.args(true, a, s);
  if (graph) s.enable_pdl = true;
  run_on_stream(graph, what, [&](cudaStream_t st) { run(a, s, st); });
  if (::testing::Test::HasFatalFailure() || !comparable) return;
  if (graph) {
    call.args(false, a, s);
    ASSERT_NO_THROW(run(a, s, nullptr)) << what;
  }
  expect_same_bytes(call.all(), CallT::names(), what);
}

}  // namespace megamoe_test
