// test_norm_cuda.cu: rmsnorm_and_stage on the GPU equals the CPU backend byte for byte (the
// CPU backend is checked against the independent reference by tests/cpp/test_norm.cpp):
// every buffer of the call, elements and poisoned gaps, eager and under CUDA-graph capture
// with PDL (replayed on new inputs); residual, fp32 and bf16 weights, y given or not, in
// place, strided rows, tensors off their element size, full buffer, several formats.
// Every test SKIPs without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"

namespace {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::TensorRef;

bool have_gpu() {
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
  void up() { cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice); }
  std::vector<uint8_t> down() const {
    std::vector<uint8_t> r(host.size());
    cudaMemcpy(r.data(), dev, r.size(), cudaMemcpyDeviceToHost);
    return r;
  }
};

struct Case {
  int64_t T, H, K = 6, M;
  bool residual, wf32, want_y, in_place;
  int64_t cs = 1;     // column stride of x / residual / y / residual_out
  size_t skew = 0;    // 1: every wider tensor off its element size
  QuantScheme q = QuantScheme::mxfp8();
};

/// The call's buffers (host and device), filled with inputs and poison.
struct Call {
  Case c;
  int64_t ld;
  std::unique_ptr<Buf> x, res, w, y, ro, tw, ti, xq, sf, xs, io, wo, gs, nf;
  megamoe::OutputShapes o;
  explicit Call(const Case& k, uint32_t seed) : c(k), ld(k.H * k.cs + 5) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 2.0f);
    const size_t rows = static_cast<size_t>(std::max<int64_t>(c.T * ld, 1)) * 2;
    x = std::make_unique<Buf>(rows, 0xEE, c.skew);
    res = std::make_unique<Buf>(rows, 0xEE, c.skew);
    for (size_t i = 0; i < rows / 2; ++i) {
      float f = n(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint16_t b = static_cast<uint16_t>(u >> 16);
      std::memcpy(&x->host[2 * i], &b, 2);
      f = n(rng) * 0.5f;
      std::memcpy(&u, &f, 4);
      const uint16_t r = static_cast<uint16_t>(u >> 16);
      std::memcpy(&res->host[2 * i], &r, 2);
    }
    if (c.T > 2) {  // a NaN row and an Inf element: the rules of the contract on both backends
      const uint16_t nan = 0x7FC1, inf = 0x7F80;
      std::memcpy(&x->host[static_cast<size_t>(1 * ld) * 2], &nan, 2);
      std::memcpy(&x->host[static_cast<size_t>(2 * ld + 3 * c.cs) * 2], &inf, 2);
    }
    w = std::make_unique<Buf>(static_cast<size_t>(c.H) * 4, 0, c.skew);
    for (int64_t j = 0; j < c.H; ++j) {
      const float f = 0.5f + static_cast<float>(rng() % 1000) / 1000.0f;
      if (c.wf32) {
        std::memcpy(&w->host[static_cast<size_t>(j) * 4], &f, 4);
      } else {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        const uint16_t b = static_cast<uint16_t>(u >> 16);
        std::memcpy(&w->host[static_cast<size_t>(j) * 2], &b, 2);
      }
    }
    y = std::make_unique<Buf>(rows, 0xB7, c.skew);
    ro = std::make_unique<Buf>(rows, 0xB7, c.skew);
    tw = std::make_unique<Buf>(static_cast<size_t>(std::max<int64_t>(c.T * c.K, 1)) * 4, 0, c.skew);
    ti = std::make_unique<Buf>(static_cast<size_t>(std::max<int64_t>(c.T * c.K, 1)) * 4, 0, c.skew);
    for (int64_t i = 0; i < c.T * c.K; ++i) {
      const float f = static_cast<float>(rng() % 1000) / 1000.0f;
      const int32_t id = static_cast<int32_t>(rng() % 256);
      std::memcpy(&tw->host[static_cast<size_t>(i) * 4], &f, 4);
      std::memcpy(&ti->host[static_cast<size_t>(i) * 4], &id, 4);
    }
    o = megamoe::output_shapes(c.M, c.H, c.K, c.q);
    xq = std::make_unique<Buf>(static_cast<size_t>(o.x_q.shape[0] * o.x_q.shape[1] * megamoe::dtype_size(o.x_q.dtype)),
                               0xA5, 0);
    sf = std::make_unique<Buf>(static_cast<size_t>(o.x_sf.shape[0] * o.x_sf.shape[1]) * 4, 0xA5, c.skew);
    xs = std::make_unique<Buf>(static_cast<size_t>(c.M) * 4 + 4, 0xA5, c.skew);
    io = std::make_unique<Buf>(static_cast<size_t>(c.M * c.K) * 8 + 8, 0xA5, c.skew);
    wo = std::make_unique<Buf>(static_cast<size_t>(c.M * c.K) * 4 + 4, 0xA5, c.skew);
    gs = std::make_unique<Buf>(4, 0, c.skew);  // NVFP4 static's input, online's output
    const float g = 0.0125f;
    std::memcpy(gs->host.data(), &g, 4);
    nf = std::make_unique<Buf>(8, 0, c.skew);  // the non-finite counter, from 5
    const int64_t five = 5;
    std::memcpy(nf->host.data(), &five, 8);
  }
  std::vector<Buf*> all() { return {x.get(), res.get(), w.get(), y.get(), ro.get(), tw.get(), ti.get(), xq.get(), sf.get(), xs.get(), io.get(), wo.get(), gs.get(), nf.get()}; }
  void up() {
    for (Buf* b : all()) b->up();
  }
  /// The call's arguments over the host (dev = false) or device buffers.
  void args(bool dev, megamoe::RmsNormArgs& n, megamoe::StageArgs& s) {
    const megamoe::Device d = dev ? megamoe::Device::cuda(0) : megamoe::Device::cpu();
    auto at = [&](Buf& b) -> void* { return dev ? static_cast<void*>(b.dev) : static_cast<void*>(b.host.data()); };
    auto rows = [&](Buf& b) { return TensorRef(at(b), DType::kBFloat16, {c.T, c.H}, {ld, c.cs}, d); };
    n = megamoe::RmsNormArgs{};
    n.x = rows(*x);
    if (c.residual) n.residual = rows(*res);
    n.weight = TensorRef(at(*w), c.wf32 ? DType::kFloat32 : DType::kBFloat16, {c.H}, d);
    n.eps = 1e-6f;
    if (c.in_place) {
      n.y = n.x;
      if (c.residual) n.residual_out = n.residual;
    } else {
      if (c.want_y) n.y = rows(*y);
      if (c.residual) n.residual_out = rows(*ro);
    }
    s = megamoe::StageArgs{};
    s.topk_weights = TensorRef(at(*tw), DType::kFloat32, {c.T, c.K}, d);
    s.topk_ids = TensorRef(at(*ti), DType::kInt32, {c.T, c.K}, d);
    s.x_q = TensorRef(at(*xq), o.x_q.dtype, {o.x_q.shape[0], o.x_q.shape[1]}, d);
    s.x_sf = TensorRef(at(*sf), o.x_sf.dtype, {o.x_sf.shape[0], o.x_sf.shape[1]}, d);
    if (o.x_scales) s.x_scales = TensorRef(at(*xs), DType::kFloat32, {c.M}, d);
    s.topk_idx_out = TensorRef(at(*io), DType::kInt64, {c.M, c.K}, d);
    s.topk_weights_out = TensorRef(at(*wo), DType::kFloat32, {c.M, c.K}, d);
    if (o.global_scale) s.global_scale = TensorRef(at(*gs), DType::kFloat32, {1}, d);
    s.nonfinite_count = TensorRef(at(*nf), DType::kInt64, {1}, d);
    s.hidden_quant = c.q;
    s.full_buffer = c.M != c.T;
  }
};

std::string tag(const Case& c) {
  return "T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " M=" + std::to_string(c.M) + " res=" +
         std::to_string(c.residual) + " wf32=" + std::to_string(c.wf32) + " y=" + std::to_string(c.want_y) +
         " inplace=" + std::to_string(c.in_place) + " cs=" + std::to_string(c.cs) + " skew=" + std::to_string(c.skew) +
         " " + megamoe::scheme_name(c.q);
}

/// CPU on the host buffers, CUDA (eager, or captured in a graph with PDL and replayed)
/// on their device twins; every byte of every buffer equal.
void check(const Case& c, bool graph, uint32_t seed) {
  Call call(c, seed);
  call.up();
  megamoe::RmsNormArgs n;
  megamoe::StageArgs s;
  call.args(false, n, s);
  ASSERT_NO_THROW(megamoe::rmsnorm_and_stage(n, s)) << tag(c);
  // The graph is replayed twice and the counter adds up: the host call runs twice too
  // (the same outputs, out of place).
  if (graph && !c.in_place) ASSERT_NO_THROW(megamoe::rmsnorm_and_stage(n, s)) << tag(c);
  call.args(true, n, s);
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  if (graph) {
    s.enable_pdl = true;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    megamoe::rmsnorm_and_stage(n, s, st);
    ASSERT_EQ(cudaStreamEndCapture(st, &g), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, st), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, st), cudaSuccess);  // replays give the same bytes
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  } else {
    ASSERT_NO_THROW(megamoe::rmsnorm_and_stage(n, s, st)) << tag(c);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  }
  cudaStreamDestroy(st);
  if (c.in_place && graph) return;  // a replay re-normalizes the normalized rows: the CPU ran once
  const char* names[] = {"x", "residual", "weight", "y", "residual_out", "topk_weights", "topk_ids",
                         "x_q", "x_sf", "x_scales", "topk_idx_out", "topk_weights_out", "global_scale", "nonfinite_count"};
  std::vector<Buf*> bufs = call.all();
  for (size_t i = 0; i < bufs.size(); ++i) {
    const std::vector<uint8_t> got = bufs[i]->down();
    ASSERT_EQ(got, bufs[i]->host) << names[i] << ": " << tag(c);
  }
}

TEST(CudaNorm, EqualsTheCpuBackendEveryForm) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // The one-launch kernel stages every format but NVFP4 online (two launches and the
  // staging kernel): both paths.
  const QuantScheme qs[] = {QuantScheme::mxfp8(),         QuantScheme::fp8_fp32_g128(), QuantScheme::nvfp4_per_token(),
                            QuantScheme::mxfp4(),         QuantScheme::mxfp8_e5m2(),    QuantScheme::nvfp4_static(),
                            QuantScheme::nvfp4_online(),  QuantScheme::bf16(),          QuantScheme::fp8_ue8m0_g128()};
  constexpr uint32_t kNq = sizeof(qs) / sizeof(qs[0]);
  uint32_t seed = 1;
  for (int64_t T : {1, 7, 300}) {
    for (int64_t H : {128, 2048, 7168}) {
      for (int form = 0; form < 4; ++form) {
        Case c;
        c.T = T;
        c.H = H;
        c.M = form == 3 ? T + 9 : T;
        c.residual = form % 2 == 0;
        c.wf32 = form >= 2;
        c.want_y = form != 1;
        c.in_place = form == 2;
        c.cs = form == 1 ? 2 : 1;
        c.q = qs[seed % kNq];
        // Packed scales of G = 128 need whole words (H % 512 == 0).
        if (c.q == QuantScheme::fp8_ue8m0_g128() && H % 512 != 0) c.q = QuantScheme::mxfp8();
        check(c, false, seed++);
      }
    }
  }
}

TEST(CudaNorm, GraphCaptureWithPdlAndMisalignedTensors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  for (bool graph : {false, true}) {
    for (size_t skew : {size_t{0}, size_t{1}}) {
      for (int64_t H : {256, 7168, 16384}) {
        Case c;
        c.T = 37;
        c.H = H;
        c.M = 64;
        c.residual = true;
        c.wf32 = false;
        c.want_y = skew == 0;
        c.in_place = false;
        c.skew = skew;
        check(c, graph, seed++);
      }
    }
  }
}

TEST(CudaNorm, ExplainNamesTheLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme q : {QuantScheme::mxfp8(), QuantScheme::nvfp4_online()}) {
    Case c;
    c.T = 4;
    c.H = 7168;
    c.M = q == QuantScheme::mxfp8() ? 40 : 4;
    c.residual = true;
    c.wf32 = false;
    c.want_y = false;
    c.in_place = false;
    c.q = q;
    Call call(c, 3u);
    megamoe::RmsNormArgs n;
    megamoe::StageArgs s;
    call.args(true, n, s);
    const std::string e = megamoe::explain(n, s);
    if (q == QuantScheme::mxfp8()) {  // one launch; 36 tail rows x 6 entries in one tail block
      EXPECT_NE(e.find("one launch: kernel=rmsnorm_stage threads=256 grid=5 smem=14336 per_thread=2 tail_blocks=1"),
                std::string::npos) << e;
      EXPECT_EQ(e.find("launch 2"), std::string::npos) << e;
    } else {
      EXPECT_NE(e.find("kernel=rmsnorm threads=256 grid=4 smem=14336 per_thread=2"), std::string::npos) << e;
      EXPECT_NE(e.find("launch 2: cuda backend"), std::string::npos) << e;
    }
  }
}

}  // namespace
