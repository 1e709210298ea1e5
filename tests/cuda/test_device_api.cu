// test_device_api.cu: the public device API (megamoe/device/stage.cuh) through the example
// producer (examples/cuda/producer.cuh), which stages its own rows y = bf16(x * scale)
// without writing them: every byte it writes equals prepare_inputs(y) on the GPU and on the
// CPU backend (y computed here on the host), every format stage_target accepts and every
// staging option (strides, MN-major scales, shared-expert copy, per-token and static
// second-level scales, padding, full buffer, routed scaling, expert scales, the non-finite
// counter, int64 ids and bf16 weights), poisoned outputs, eager and in a CUDA graph.
// Every test SKIPs without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../../examples/cuda/producer.cuh"
#include "megamoe/megamoe.h"

namespace {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::TensorRef;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Dev {
  void* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t bytes) : n(bytes) {
    if (cudaMalloc(&p, bytes + 16) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  ~Dev() { cudaFree(p); }
  void put(const std::vector<uint8_t>& h) { cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice); }
  std::vector<uint8_t> get() const {
    std::vector<uint8_t> h(n);
    cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost);
    return h;
  }
};

uint16_t bf16_bits(float f) {  // round to nearest even; NaN as cvt.rn.bf16.f32 makes it
  if (std::isnan(f)) return 0x7FFF;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float bf16_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Case {
  int64_t T = 5, H = 256, K = 6, M = 5;
  QuantScheme q = QuantScheme::mxfp8();
  int64_t xcs = 1;         // column stride of x
  bool mn_major = false;   // x_sf as the column-major (MN-major) view
  bool shared = false;     // shared_x_sf (UE8M0 formats)
  bool padding = false, alpha = false, escales = false, counter = false, ids64 = false, wbf16 = false;
};

std::string tag(const Case& c) {
  return "T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " M=" + std::to_string(c.M) + " " +
         megamoe::scheme_name(c.q) + " xcs=" + std::to_string(c.xcs) + " mn=" + std::to_string(c.mn_major) +
         " shared=" + std::to_string(c.shared) + " pad=" + std::to_string(c.padding) +
         " alpha=" + std::to_string(c.alpha) + " es=" + std::to_string(c.escales);
}

/// One set of outputs (device buffers poisoned alike, or host vectors) and their views.
struct Outs {
  std::vector<std::vector<uint8_t>> host;  // poison images, then the CPU backend's results
  std::vector<std::unique_ptr<Dev>> dev;
};

struct Problem {
  Case c;
  megamoe::OutputShapes o;
  int64_t R = 0, bm = 64;  // shared rows, block m
  std::vector<uint8_t> x, y, tw, ti, pad, es, gs;
  std::vector<size_t> out_bytes;
  float scale = 1.5f;

  explicit Problem(const Case& k, uint32_t seed) : c(k) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 3.0f);
    o = megamoe::output_shapes(c.M, c.H, c.K, c.q, c.shared ? std::optional<int64_t>(bm) : std::nullopt);
    if (o.shared_x_sf) R = o.shared_x_sf->shape[0];
    const int64_t xn = std::max<int64_t>(1, c.T * c.H * c.xcs);
    x.resize(static_cast<size_t>(xn) * 2);
    y.resize(static_cast<size_t>(std::max<int64_t>(1, c.T * c.H)) * 2);
    for (int64_t i = 0; i < xn; ++i) {
      const uint16_t b = bf16_bits(n(rng) * (i % 97 == 0 ? 1e30f : i % 89 == 0 ? 1e-40f : 1.0f));
      std::memcpy(&x[static_cast<size_t>(i) * 2], &b, 2);
    }
    // Special rows: zeros, NaN and Inf in one, subnormal-only.
    auto put = [&](int64_t t, int64_t h, uint16_t b) {
      if (t < c.T) std::memcpy(&x[static_cast<size_t>((t * c.H + h) * c.xcs) * 2], &b, 2);
    };
    for (int64_t h = 0; h < c.H; ++h) put(1, h, 0x8000);
    put(2, 3, 0x7FC1);
    put(2, 40, 0xFF80);
    for (int64_t h = 0; h < c.H; ++h) put(3, h, static_cast<uint16_t>(h % 5));
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t h = 0; h < c.H; ++h) {
        uint16_t xb;
        std::memcpy(&xb, &x[static_cast<size_t>((t * c.H + h) * c.xcs) * 2], 2);
        const uint16_t yb = bf16_bits(bf16_float(xb) * scale);
        std::memcpy(&y[static_cast<size_t>(t * c.H + h) * 2], &yb, 2);
      }
    }
    const int64_t tk = std::max<int64_t>(1, c.T * c.K);
    tw.resize(static_cast<size_t>(tk) * 4);
    ti.resize(static_cast<size_t>(tk) * 8);
    for (int64_t i = 0; i < c.T * c.K; ++i) {
      const float f = static_cast<float>(rng() % 1000) / 997.0f;
      const int64_t id = static_cast<int64_t>(rng() % 300) - 8;  // some ids outside [0, E)
      if (c.wbf16) {
        const uint16_t b = bf16_bits(f);
        std::memcpy(&tw[static_cast<size_t>(i) * 2], &b, 2);
      } else {
        std::memcpy(&tw[static_cast<size_t>(i) * 4], &f, 4);
      }
      if (c.ids64) {
        std::memcpy(&ti[static_cast<size_t>(i) * 8], &id, 8);
      } else {
        const int32_t i32 = static_cast<int32_t>(id);
        std::memcpy(&ti[static_cast<size_t>(i) * 4], &i32, 4);
      }
    }
    pad.resize(static_cast<size_t>(std::max<int64_t>(1, c.T)));
    for (auto& p : pad) p = rng() % 4 == 0 ? 1 : 0;
    es.resize(256 * 4);
    for (int e = 0; e < 256; ++e) {
      const float f = 0.25f + static_cast<float>(e % 13) / 7.0f;
      std::memcpy(&es[static_cast<size_t>(e) * 4], &f, 4);
    }
    const float g = 0.0125f;
    gs.resize(4);
    std::memcpy(gs.data(), &g, 4);
    auto bytes = [](const megamoe::TensorSpec& s) {
      size_t n = megamoe::dtype_size(s.dtype);
      for (int d = 0; d < s.ndim; ++d) n *= static_cast<size_t>(s.shape[d]);
      return n;
    };
    out_bytes = {bytes(o.x_q), bytes(o.x_sf), bytes(o.topk_idx_out), bytes(o.topk_weights_out),
                 o.shared_x_sf ? bytes(*o.shared_x_sf) : 0, o.x_scales ? bytes(*o.x_scales) : 0, 8};
  }

  Outs poisoned(bool on_device) const {
    Outs r;
    for (size_t i = 0; i < out_bytes.size(); ++i) {
      std::vector<uint8_t> h(out_bytes[i], static_cast<uint8_t>(0xA5 + i));
      if (i == 6) {  // the counter starts at 5
        const int64_t five = 5;
        std::memcpy(h.data(), &five, 8);
      }
      if (on_device) {
        r.dev.push_back(std::make_unique<Dev>(h.size()));
        r.dev.back()->put(h);
      }
      r.host.push_back(std::move(h));
    }
    return r;
  }

  /// StageArgs over @p outs (device or host), the top-k inputs at @p in (4 pointers: tw, ti, pad, es, gs).
  megamoe::StageArgs args(Outs& outs, bool on_device, void* hs, void* const* in) const {
    const megamoe::Device d = on_device ? megamoe::Device::cuda(0) : megamoe::Device::cpu();
    auto at = [&](size_t i) -> void* { return on_device ? outs.dev[i]->p : static_cast<void*>(outs.host[i].data()); };
    megamoe::StageArgs s;
    s.hidden_states = TensorRef(hs, DType::kBFloat16, {c.T, c.H}, d);
    s.topk_weights = TensorRef(in[0], c.wbf16 ? DType::kBFloat16 : DType::kFloat32, {c.T, c.K}, d);
    s.topk_ids = TensorRef(in[1], c.ids64 ? DType::kInt64 : DType::kInt32, {c.T, c.K}, d);
    s.x_q = TensorRef(at(0), o.x_q.dtype, {o.x_q.shape[0], o.x_q.shape[1]}, d);
    if (c.mn_major) {
      s.x_sf = TensorRef(at(1), o.x_sf.dtype, {o.x_sf.shape[0], o.x_sf.shape[1]}, {1, o.x_sf.shape[0]}, d);
    } else {
      s.x_sf = TensorRef(at(1), o.x_sf.dtype, {o.x_sf.shape[0], o.x_sf.shape[1]}, d);
    }
    s.topk_idx_out = TensorRef(at(2), DType::kInt64, {c.M, c.K}, d);
    s.topk_weights_out = TensorRef(at(3), DType::kFloat32, {c.M, c.K}, d);
    if (o.shared_x_sf) {
      s.shared_x_sf = TensorRef(at(4), DType::kInt32, {R, o.shared_x_sf->shape[1]}, d);
      s.shared_block_m = bm;
    }
    if (o.x_scales) s.x_scales = TensorRef(at(5), DType::kFloat32, {c.M}, d);
    if (c.counter) s.nonfinite_count = TensorRef(at(6), DType::kInt64, {1}, d);
    if (c.padding) s.is_padding = TensorRef(in[2], DType::kUInt8, {c.T}, d);
    if (c.escales) s.expert_scales = TensorRef(in[3], DType::kFloat32, {256}, d);
    if (o.global_scale) s.global_scale = TensorRef(in[4], DType::kFloat32, {1}, d);
    if (c.alpha) s.routed_scaling_factor = 2.5f;
    s.hidden_quant = c.q;
    s.full_buffer = c.M != c.T;
    return s;
  }
};

/// The producer (eager or one graph replay) against prepare_inputs(y) on the GPU and on the
/// CPU backend: every output byte equal.
void check(const Case& c, uint32_t seed, bool graph, int threads) {
  Problem p(c, seed);
  Dev x(p.x.size()), y(p.y.size()), tw(p.tw.size()), ti(p.ti.size()), pad(p.pad.size()), es(p.es.size()), gs(4);
  x.put(p.x);
  y.put(p.y);
  tw.put(p.tw);
  ti.put(p.ti);
  pad.put(p.pad);
  es.put(p.es);
  gs.put(p.gs);
  void* din[5] = {tw.p, ti.p, pad.p, es.p, gs.p};
  std::vector<uint8_t> htw = p.tw, hti = p.ti, hpad = p.pad, hes = p.es, hgs = p.gs;
  void* hin[5] = {htw.data(), hti.data(), hpad.data(), hes.data(), hgs.data()};

  Outs mine = p.poisoned(true), lib = p.poisoned(true), cpu = p.poisoned(false);
  // The producer's target describes its rows: no memory behind them.
  megamoe::StageArgs ts = p.args(mine, true, nullptr, din);
  const megamoe::device::StageTarget tg = megamoe::device::stage_target(ts);
  ASSERT_EQ(tg.T, c.T);
  producer_example::Rows rows{static_cast<const uint16_t*>(x.p), c.H * c.xcs, c.xcs, p.scale};
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  if (graph) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(producer_example::launch_scale_and_stage(rows, tg, threads, st), cudaSuccess);
    ASSERT_EQ(cudaStreamEndCapture(st, &g), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  } else {
    ASSERT_EQ(producer_example::launch_scale_and_stage(rows, tg, threads, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  }
  megamoe::prepare_inputs(p.args(lib, true, y.p, din), st);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  cudaStreamDestroy(st);
  std::vector<uint8_t> hy = p.y;
  megamoe::prepare_inputs(p.args(cpu, false, hy.data(), hin));
  const char* names[] = {"x_q", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "x_scales", "nonfinite"};
  for (size_t i = 0; i < p.out_bytes.size(); ++i) {
    const std::vector<uint8_t> a = mine.dev[i]->get(), b = lib.dev[i]->get();
    ASSERT_EQ(a, b) << names[i] << " (producer vs prepare_inputs on the GPU): " << tag(c);
    ASSERT_EQ(a, cpu.host[i]) << names[i] << " (producer vs the CPU backend): " << tag(c);
  }
  if (c.counter) {
    int64_t n;
    std::memcpy(&n, cpu.host[6].data(), 8);
    EXPECT_GT(n, c.T > 2 ? 6 : 4) << "the counter counts the NaN / Inf values: " << tag(c);
  }
}

const QuantScheme kSchemes[] = {QuantScheme::mxfp8(),        QuantScheme::fp8_fp32_g128(), QuantScheme::fp8_ue8m0_g128(),
                                QuantScheme::fp8_fp32_g32(), QuantScheme::mxfp8_e5m2(),    QuantScheme::mxfp4(),
                                QuantScheme::mxfp4(megamoe::Rounding::kNearestEven),       QuantScheme::nvfp4_static(),
                                QuantScheme::nvfp4_per_token(), QuantScheme::bf16()};

TEST(DeviceApi, ProducerStagesLikePrepareInputsEveryFormat) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 1;
  for (const QuantScheme& q : kSchemes) {
    for (int form = 0; form < 4; ++form) {
      Case c;
      c.q = q;
      c.T = form == 0 ? 1 : form == 1 ? 7 : form == 2 ? 64 : 130;
      c.H = form == 3 ? 7168 : form == 1 ? 1536 : 2048;  // 1536: not a multiple of 1024
      c.M = form == 2 ? 100 : c.T;
      c.xcs = form == 1 ? 3 : 1;
      c.mn_major = form == 2 && megamoe::output_shapes(1, 512, 1, q).x_sf.shape[1] != 0;
      c.shared = form >= 2 && q.scale == megamoe::ScaleType::kUE8M0 && q.elem == megamoe::QuantElem::kFloat8E4M3;
      c.padding = form % 2 == 1;
      c.alpha = form >= 1;
      c.escales = form == 2 || form == 3;
      c.counter = true;
      c.ids64 = form == 3;
      c.wbf16 = form == 1;
      check(c, seed++, false, form == 3 ? 256 : 64);
    }
  }
}

TEST(DeviceApi, ProducerInAGraphAndAnyBlockSize) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  for (int threads : {32, 128, 1024}) {
    Case c;
    c.T = 33;
    c.M = 48;
    c.H = 4096;
    c.q = threads == 32 ? QuantScheme::nvfp4_per_token() : QuantScheme::mxfp8();
    c.shared = threads != 32;
    c.padding = true;
    c.counter = true;
    check(c, seed++, true, threads);
  }
}

TEST(DeviceApi, StageTargetWithoutTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 0;
  c.M = 16;
  check(c, 7u, false, 64);  // the tail alone
}

}  // namespace
