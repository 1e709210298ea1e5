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

#include "gpu_buf.h"
#include "megamoe/megamoe.h"

namespace {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::TensorRef;

using megamoe_test::Buf;
using megamoe_test::have_gpu;

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
  std::unique_ptr<Buf> x, res, w, y, ro;
  std::unique_ptr<megamoe_test::StagedBufs> st;
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
    st = std::make_unique<megamoe_test::StagedBufs>(c.T, c.H, c.K, c.M, c.q, c.skew, rng);
  }
  std::vector<Buf*> all() {
    std::vector<Buf*> r = {x.get(), res.get(), w.get(), y.get(), ro.get()};
    for (Buf* b : st->all()) r.push_back(b);
    return r;
  }
  static std::vector<const char*> names() {
    std::vector<const char*> r = {"x", "residual", "weight", "y", "residual_out"};
    for (const char* n : megamoe_test::StagedBufs::names()) r.push_back(n);
    return r;
  }
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
    s = st->args(dev);
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
  // In place, a replay re-normalizes the normalized rows (the CPU ran once): not compared.
  megamoe_test::check_producer<megamoe::RmsNormArgs>(
      call, graph, !(c.in_place && graph), tag(c),
      [](const megamoe::RmsNormArgs& n, const megamoe::StageArgs& s, cudaStream_t st) {
        megamoe::rmsnorm_and_stage(n, s, st);
      });
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
