// test_mhc_cuda.cu: mhc_pre_and_stage on the GPU equals the CPU backend byte for byte (the
// CPU backend is checked against the independent reference by tests/cpp/test_mhc.cpp):
// every buffer of the call (post_mix, comb_mix, pre_mix, layer_input, y, the staged
// buffers, the counter), elements and poisoned gaps, eager and under CUDA-graph capture
// with PDL (replayed); hc_mult 1, 4, 8; several H, T and formats; strided rows and fn; the
// delayed form (pre_mix_in); NaN / Inf in a stream; full buffer; tensors off their element
// size. Every test SKIPs without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
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
  int64_t T, H, hc, K = 6, M;
  bool wf32 = false, want_y = true, want_li = true, want_pre = true, pre_in = false;
  int64_t cs = 1;        // column stride of residual / layer_input / y
  bool fn_padded = false;  // fn's rows 1 float apart beyond K (no 16-byte row access)
  size_t skew = 0;       // 1: every wider tensor off its element size
  int64_t repeat = 20;
  QuantScheme q = QuantScheme::mxfp8();
  int64_t Kc() const { return hc * H; }
  int64_t mixes() const { return hc * (hc + 2); }
};

/// The call's buffers (host and device), filled with inputs and poison.
struct Call {
  Case c;
  int64_t ld, ldy, ldf;
  std::unique_ptr<Buf> x, fn, sc, base, w, pin, post, comb, pre, li, y;
  std::unique_ptr<megamoe_test::StagedBufs> st;
  explicit Call(const Case& k, uint32_t seed) : c(k), ld(k.Kc() * k.cs + 5), ldy(k.H * k.cs + 3) {
    ldf = c.Kc() + (c.fn_padded ? 1 : 0);
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const size_t T1 = static_cast<size_t>(std::max<int64_t>(c.T, 1));
    x = std::make_unique<Buf>(T1 * static_cast<size_t>(ld) * 2, 0xEE, c.skew);
    for (size_t i = 0; i < x->host.size() / 2; ++i) x->put_bf16(i, n(rng));
    if (c.T > 2) {  // a NaN in stream hc - 1 of token 1, an Inf in stream 0 of token 2
      const uint16_t nan = 0x7FC1, inf = 0x7F80;
      std::memcpy(&x->host[static_cast<size_t>(1 * ld + ((c.hc - 1) * c.H + 5) * c.cs) * 2], &nan, 2);
      std::memcpy(&x->host[static_cast<size_t>(2 * ld + 3 * c.cs) * 2], &inf, 2);
    }
    const float fs = 1.0f / std::sqrt(static_cast<float>(c.Kc()));
    fn = std::make_unique<Buf>(static_cast<size_t>(c.mixes() * ldf) * 4, 0, c.skew);
    for (size_t i = 0; i < fn->host.size() / 4; ++i) fn->put_f32(i, n(rng) * fs);
    sc = std::make_unique<Buf>(12, 0, c.skew);
    for (size_t g = 0; g < 3; ++g) sc->put_f32(g, 0.5f + 0.25f * static_cast<float>(g));
    base = std::make_unique<Buf>(static_cast<size_t>(c.mixes()) * 4, 0, c.skew);
    for (size_t i = 0; i < static_cast<size_t>(c.mixes()); ++i) base->put_f32(i, n(rng) * 0.1f);
    w = std::make_unique<Buf>(static_cast<size_t>(c.H) * 4, 0, c.skew);
    for (size_t j = 0; j < static_cast<size_t>(c.H); ++j) {
      const float f = 0.5f + static_cast<float>(rng() % 1000) / 1000.0f;
      if (c.wf32) w->put_f32(j, f);
      else w->put_bf16(j, f);
    }
    pin = std::make_unique<Buf>(T1 * static_cast<size_t>(c.hc) * 4, 0, c.skew);
    for (size_t i = 0; i < pin->host.size() / 4; ++i) pin->put_f32(i, static_cast<float>(rng() % 1000) / 1000.0f);
    post = std::make_unique<Buf>(T1 * static_cast<size_t>(c.hc) * 4, 0xB7, c.skew);
    comb = std::make_unique<Buf>(T1 * static_cast<size_t>(c.hc * c.hc) * 4, 0xB7, c.skew);
    pre = std::make_unique<Buf>(T1 * static_cast<size_t>(c.hc) * 4, 0xB7, c.skew);
    li = std::make_unique<Buf>(T1 * static_cast<size_t>(ldy) * 2, 0xB7, c.skew);
    y = std::make_unique<Buf>(T1 * static_cast<size_t>(ldy) * 2, 0xB7, c.skew);
    st = std::make_unique<megamoe_test::StagedBufs>(c.T, c.H, c.K, c.M, c.q, c.skew, rng);
  }
  std::vector<Buf*> all() {
    std::vector<Buf*> r = {x.get(), fn.get(), sc.get(), base.get(), w.get(), pin.get(),
                           post.get(), comb.get(), pre.get(), li.get(), y.get()};
    for (Buf* b : st->all()) r.push_back(b);
    return r;
  }
  static std::vector<const char*> names() {
    std::vector<const char*> r = {"residual", "fn",       "hc_scale", "hc_base",     "norm_weight", "pre_mix_in",
                                  "post_mix", "comb_mix", "pre_mix",  "layer_input", "y"};
    for (const char* n : megamoe_test::StagedBufs::names()) r.push_back(n);
    return r;
  }
  void up() {
    for (Buf* b : all()) b->up();
  }
  /// The call's arguments over the host (dev = false) or device buffers.
  void args(bool dev, megamoe::MhcPreArgs& m, megamoe::StageArgs& s) {
    const megamoe::Device d = dev ? megamoe::Device::cuda(0) : megamoe::Device::cpu();
    auto at = [&](Buf& b) -> void* { return dev ? static_cast<void*>(b.dev) : static_cast<void*>(b.host.data()); };
    m = megamoe::MhcPreArgs{};
    m.residual = TensorRef(at(*x), DType::kBFloat16, {c.T, c.Kc()}, {ld, c.cs}, d);
    m.fn = TensorRef(at(*fn), DType::kFloat32, {c.mixes(), c.Kc()}, {ldf, 1}, d);
    m.hc_scale = TensorRef(at(*sc), DType::kFloat32, {3}, d);
    m.hc_base = TensorRef(at(*base), DType::kFloat32, {c.mixes()}, d);
    m.norm_weight = TensorRef(at(*w), c.wf32 ? DType::kFloat32 : DType::kBFloat16, {c.H}, d);
    m.sinkhorn_repeat = c.repeat;
    if (c.pre_in) m.pre_mix_in = TensorRef(at(*pin), DType::kFloat32, {c.T, c.hc}, d);
    m.post_mix = TensorRef(at(*post), DType::kFloat32, {c.T, c.hc}, d);
    m.comb_mix = TensorRef(at(*comb), DType::kFloat32, {c.T, c.hc * c.hc}, d);
    if (c.want_pre) m.pre_mix = TensorRef(at(*pre), DType::kFloat32, {c.T, c.hc}, d);
    if (c.want_li) m.layer_input = TensorRef(at(*li), DType::kBFloat16, {c.T, c.H}, {ldy, c.cs}, d);
    if (c.want_y) m.y = TensorRef(at(*y), DType::kBFloat16, {c.T, c.H}, {ldy, c.cs}, d);
    s = st->args(dev);
  }
};

std::string tag(const Case& c) {
  return "T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " hc=" + std::to_string(c.hc) +
         " M=" + std::to_string(c.M) + " wf32=" + std::to_string(c.wf32) + " y=" + std::to_string(c.want_y) +
         " li=" + std::to_string(c.want_li) + " pre=" + std::to_string(c.want_pre) + " pre_in=" +
         std::to_string(c.pre_in) + " cs=" + std::to_string(c.cs) + " fn_padded=" + std::to_string(c.fn_padded) +
         " skew=" + std::to_string(c.skew) + " " + megamoe::scheme_name(c.q);
}

/// CPU on the host buffers, CUDA (eager, or captured in a graph with PDL and replayed)
/// on their device twins; every byte of every buffer equal.
void check(const Case& c, bool graph, uint32_t seed) {
  Call call(c, seed);
  megamoe_test::check_producer<megamoe::MhcPreArgs>(
      call, graph, true, tag(c), [](const megamoe::MhcPreArgs& m, const megamoe::StageArgs& s, cudaStream_t st) {
        megamoe::mhc_pre_and_stage(m, s, st);
      });
}

const QuantScheme kSchemes[] = {QuantScheme::mxfp8(),           QuantScheme::fp8_fp32_g128(),
                                QuantScheme::nvfp4_per_token(), QuantScheme::nvfp4_static(),
                                QuantScheme::bf16(),            QuantScheme::nvfp4_online(),
                                QuantScheme::mxfp4(),           QuantScheme::fp8_ue8m0_g128()};
constexpr uint32_t kNumSchemes = sizeof(kSchemes) / sizeof(kSchemes[0]);

TEST(CudaMhc, EqualsTheCpuBackendEveryForm) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 1;
  for (int64_t hc : {1, 4, 8}) {
    for (int64_t H : {128, 384, 4096, 7168}) {
      for (int64_t T : {1, 7, 64, 130}) {
        // Forms: 0 every output, bf16 weight; 1 strided rows, fp32 weight, no y / layer_input
        // / pre_mix; 2 the delayed form (pre_mix_in) with a full buffer; 3 fn rows off 16
        // bytes, no y.
        const int form = static_cast<int>(seed % 4);
        Case c;
        c.T = T;
        c.H = H;
        c.hc = hc;
        c.M = form == 2 ? T + 9 : T;
        c.wf32 = form == 1;
        c.want_y = form == 0 || form == 2;
        c.want_li = form != 1;
        c.want_pre = form != 1;
        c.pre_in = form == 2;
        c.cs = form == 1 ? 2 : 1;
        c.fn_padded = form == 3;
        c.q = kSchemes[(seed + seed / 4) % kNumSchemes];
        check(c, false, seed++);
      }
    }
  }
}

TEST(CudaMhc, EveryFormatInOneOrTwoLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 200;
  for (const QuantScheme q : kSchemes) {
    for (bool y : {true, false}) {
      Case c;
      c.T = 33;
      c.H = 4096;
      c.hc = 4;
      c.M = 48;
      c.want_y = y;
      c.q = q;
      check(c, false, seed++);
    }
  }
}

TEST(CudaMhc, GraphCaptureWithPdlAndMisalignedTensors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  for (bool graph : {false, true}) {
    for (size_t skew : {size_t{0}, size_t{1}}) {
      for (int64_t H : {256, 7168}) {
        for (const QuantScheme q : {QuantScheme::mxfp8(), QuantScheme::nvfp4_online()}) {
          Case c;
          c.T = 37;
          c.H = H;
          c.hc = 4;
          c.M = 64;
          c.want_y = skew == 0;
          c.pre_in = graph;
          c.skew = skew;
          c.q = q;
          check(c, graph, seed++);
        }
      }
    }
  }
}

TEST(CudaMhc, FullBufferWithoutTokensAndOneSinkhornRound) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 0;
  c.H = 512;
  c.hc = 4;
  c.M = 24;
  check(c, false, 7u);
  Case r;
  r.T = 5;
  r.H = 1024;
  r.hc = 8;
  r.M = 5;
  r.repeat = 1;
  check(r, true, 8u);
}

TEST(CudaMhc, RowsPastTheSharedMemoryLimitAreRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 1;
  c.H = 8192;
  c.hc = 16;  // hc H = 131072 > 65536
  c.M = 1;
  c.K = 2;
  Call call(c, 9u);
  call.up();
  megamoe::MhcPreArgs m;
  megamoe::StageArgs s;
  call.args(true, m, s);
  const std::vector<uint8_t> post0 = call.post->down();
  const megamoe::Status st = megamoe::try_mhc_pre_and_stage(m, s);
  EXPECT_FALSE(st.ok);
  EXPECT_EQ(st.code, megamoe::ErrorCode::kUnsupported) << st.message;
  EXPECT_NE(st.message.find("65536"), std::string::npos) << st.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(call.post->down(), post0);
}

TEST(CudaMhc, ExplainNamesTheLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme q : {QuantScheme::mxfp8(), QuantScheme::nvfp4_online()}) {
    Case c;
    c.T = 4;
    c.H = 7168;
    c.hc = 4;
    c.M = q == QuantScheme::mxfp8() ? 40 : 4;
    c.want_y = false;
    c.q = q;
    Call call(c, 3u);
    megamoe::MhcPreArgs m;
    megamoe::StageArgs s;
    call.args(true, m, s);
    const std::string e = megamoe::explain(m, s);
    if (q == QuantScheme::mxfp8()) {  // one launch; 36 tail rows x 6 entries in one tail block
      EXPECT_NE(e.find("one launch: kernel=mhc_stage threads=256 grid=5 smem=57344 per_thread_k=8 lanes_k=256 "
                       "per_thread_h=2 lanes_h=256 mix_group=4 passes=7 tail_blocks=1"),
                std::string::npos) << e;
      EXPECT_EQ(e.find("launch 2"), std::string::npos) << e;
    } else {
      EXPECT_NE(e.find("launch 1: kernel=mhc threads=256 grid=4 smem=57344"), std::string::npos) << e;
      EXPECT_NE(e.find("launch 2: cuda backend"), std::string::npos) << e;
    }
  }
}

}  // namespace
