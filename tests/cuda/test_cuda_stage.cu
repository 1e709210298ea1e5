// GPU staging tests: every case runs the CUDA backend and the CPU backend on identical,
// identically-poisoned buffers and compares the WHOLE allocations byte for byte (so
// elements, gaps between strided elements and unmapped shared rows are all checked).
// Each case runs eagerly and under CUDA-graph capture + replay, with PDL off and on.
// Skipped when no CUDA device is present.
#include <algorithm>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/tuning.h"
#include "megamoe/megamoe.h"

namespace {

using megamoe::Device;
using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::StageArgs;
using megamoe::TensorRef;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

/// One allocation mirrored on host and device; tensors are views into it.
struct Buf {
  std::vector<uint8_t> host;
  void* dev = nullptr;
  explicit Buf(size_t bytes) : host(bytes) {
    if (cudaMalloc(&dev, bytes == 0 ? 1 : bytes) != cudaSuccess) dev = nullptr;
  }
  ~Buf() { cudaFree(dev); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void upload() const { cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> v(host.size());
    cudaMemcpy(v.data(), dev, v.size(), cudaMemcpyDeviceToHost);
    return v;
  }
  void poison(uint8_t b) {
    std::fill(host.begin(), host.end(), b);
    cudaMemset(dev, b, host.size());
  }
};

/// A 2-D (or 1-D) view: element offset into the buffer, shape and strides (elements).
struct View {
  DType dtype;
  int ndim;
  int64_t shape[2];
  int64_t strides[2];
  int64_t offset;
  size_t bytes() const {  // allocation size covering the view (offset covers negative strides)
    int64_t hi = offset;
    for (int d = 0; d < ndim; ++d) hi += std::max<int64_t>(0, (shape[d] - 1) * strides[d]);
    return static_cast<size_t>((hi + 1) * megamoe::dtype_size(dtype)) + 16;
  }
  TensorRef ref(void* base, Device dev) const {
    TensorRef t;
    t.data = static_cast<uint8_t*>(base) + offset * megamoe::dtype_size(dtype);
    t.dtype = dtype;
    t.ndim = ndim;
    for (int d = 0; d < ndim; ++d) {
      t.shape[d] = shape[d];
      t.strides[d] = strides[d];
    }
    t.device = dev;
    return t;
  }
};

View dense(DType dt, int64_t r, int64_t c, int64_t off = 0) { return View{dt, 2, {r, c}, {c, 1}, off}; }

struct Case {
  int64_t T = 64, H = 7168, K = 8;
  QuantScheme q = QuantScheme::mxfp8();
  DType in = DType::kBFloat16, ids = DType::kInt32, w = DType::kFloat32;
  bool pad = true;
  int64_t bm = 0;               // shared_x_sf block m (0: none)
  bool shared_transposed = false;
  bool hs_noncontig = false;    // row stride H + 64
  bool misaligned = false;      // every tensor offset by one element
  bool sf_mn_major = false;     // x_sf[t, g] at g * align(T, 4) + t
  bool strided_topk = false;    // column-major top-k outputs
  bool reversed_topk_in = false;  // top-k ids/weights viewed with rows reversed (stride -K):
                                  // the kernels' 64-bit offset mode on a small problem
  bool edge_values = true;
  std::string name() const {
    std::ostringstream os;
    os << "T=" << T << " H=" << H << " K=" << K << " " << megamoe::to_string(q) << " in="
       << megamoe::dtype_name(in) << " ids=" << megamoe::dtype_name(ids) << " w=" << megamoe::dtype_name(w)
       << " pad=" << pad << " bm=" << bm << " shT=" << shared_transposed << " hsNC=" << hs_noncontig
       << " mis=" << misaligned << " mn=" << sf_mn_major << " stk=" << strided_topk
       << " rev=" << reversed_topk_in;
    return os.str();
  }
};

uint16_t f32_to_bf16_trunc(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

/// Random hidden value of dtype dt written at p; groups get random magnitudes, and a few
/// edge values (NaN +-, Inf +-, subnormals, zeros, ties) are sprinkled in.
void fill_hidden(std::mt19937& rng, DType dt, uint8_t* p, int64_t n_rows, int64_t H, int64_t row_stride,
                 bool edges) {
  std::normal_distribution<float> nd(0.0f, 17.0f);
  std::uniform_int_distribution<int> ex(-24, 24);
  std::uniform_int_distribution<int> pct(0, 9999);
  const int64_t es = megamoe::dtype_size(dt);
  if (!edges) {  // cheap path for huge cases: xorshift values spanning many magnitudes
    uint64_t s = rng() | 1ull;
    for (int64_t t = 0; t < n_rows; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const float v = static_cast<float>(static_cast<int32_t>(s)) * std::ldexp(1.0f, -26 - int(s >> 60));
        uint8_t* dst = p + (t * row_stride + h) * es;
        if (dt == DType::kFloat32) {
          std::memcpy(dst, &v, 4);
        } else {
          const uint16_t b = f32_to_bf16_trunc(v);
          std::memcpy(dst, &b, 2);
        }
      }
    }
    return;
  }
  for (int64_t t = 0; t < n_rows; ++t) {
    float mag = std::ldexp(1.0f, ex(rng));
    for (int64_t h = 0; h < H; ++h) {
      if (h % 32 == 0) mag = (pct(rng) < 300) ? 1e-6f : std::ldexp(1.0f, ex(rng));
      float v = nd(rng) * mag;
      if (edges) {
        const int r = pct(rng);
        if (r < 3) v = NAN;
        else if (r < 6) v = -NAN;
        else if (r < 8) v = INFINITY;
        else if (r < 10) v = -INFINITY;
        else if (r < 20) v = 1e-40f;  // fp32 subnormal
        else if (r < 30) v = 0.0f;
        else if (r < 40) v = 464.0f * std::ldexp(1.0f, ex(rng) / 4);  // fp8 tie after scaling
        else if (r < 50) v = 448.0f;
      }
      uint8_t* dst = p + (t * row_stride + h) * es;
      if (dt == DType::kFloat32) {
        std::memcpy(dst, &v, 4);
      } else if (dt == DType::kBFloat16) {
        const uint16_t b = f32_to_bf16_trunc(v);
        std::memcpy(dst, &b, 2);
      } else {  // fp16: random bits with a bias toward normal exponents; specials sometimes
        uint16_t b = static_cast<uint16_t>(rng());
        const int r = pct(rng);
        if (r >= 50) b = static_cast<uint16_t>((b & 0x83FFu) | ((5 + rng() % 20) << 10));
        std::memcpy(dst, &b, 2);
      }
    }
  }
}

struct Tensors {
  View hs, w, ids, pad, xq, sf, io, wo, sh;
  int64_t sh_rows = 0;
};

void run_case(const Case& c, bool graph, bool pdl) {
  SCOPED_TRACE(c.name() + (graph ? " graph" : " eager") + (pdl ? " pdl" : ""));
  std::mt19937 rng(static_cast<uint32_t>(c.T * 131 + c.H * 7 + c.K + c.q.group_k + (graph ? 1 : 0)));
  const int64_t off = c.misaligned ? 1 : 0;
  const int64_t G = c.q.group_k;
  const bool ue = c.q.ue8m0();
  const int64_t sfc = ue ? c.H / (4 * G) : c.H / G;
  Tensors v;
  v.hs = View{c.in, 2, {c.T, c.H}, {c.hs_noncontig ? c.H + 64 : c.H, 1}, off};
  v.w = dense(c.w, c.T, c.K, off);
  v.ids = dense(c.ids, c.T, c.K, off);
  if (c.reversed_topk_in) {
    v.w = View{c.w, 2, {c.T, c.K}, {-c.K, 1}, off + (c.T - 1) * c.K};
    v.ids = View{c.ids, 2, {c.T, c.K}, {-c.K, 1}, off + (c.T - 1) * c.K};
  }
  v.pad = View{DType::kBool, 1, {c.T, 0}, {c.misaligned ? 3 : 1, 0}, off};
  v.xq = dense(DType::kUInt8, c.T, c.H, off);
  if (c.sf_mn_major) {
    const int64_t tm = (c.T + 3) / 4 * 4;
    v.sf = View{ue ? DType::kInt32 : DType::kFloat32, 2, {c.T, sfc}, {1, tm}, off};
  } else {
    v.sf = dense(ue ? DType::kInt32 : DType::kFloat32, c.T, sfc, off);
  }
  if (c.strided_topk) {
    v.io = View{DType::kInt64, 2, {c.T, c.K}, {1, c.T + 1}, off};
    v.wo = View{DType::kFloat32, 2, {c.T, c.K}, {1, c.T + 3}, off};
  } else {
    v.io = dense(DType::kInt64, c.T, c.K, off);
    v.wo = dense(DType::kFloat32, c.T, c.K, off);
  }
  if (c.bm > 0) {
    const int64_t abm = (c.bm + 127) / 128 * 128;
    v.sh_rows = (c.T + c.bm - 1) / c.bm * abm + 5;
    v.sh = c.shared_transposed ? View{DType::kInt32, 2, {v.sh_rows, sfc}, {1, v.sh_rows}, off}
                               : dense(DType::kInt32, v.sh_rows, sfc, off);
  }
  Buf hs(v.hs.bytes()), w(v.w.bytes()), ids(v.ids.bytes()), pad(v.pad.bytes()), xq(v.xq.bytes()),
      sf(v.sf.bytes()), io(v.io.bytes()), wo(v.wo.bytes()), sh(c.bm > 0 ? v.sh.bytes() : 16);
  ASSERT_NE(hs.dev, nullptr);
  // Inputs.
  fill_hidden(rng, c.in, hs.host.data() + off * megamoe::dtype_size(c.in), c.T, c.H, v.hs.strides[0],
              c.edge_values);
  std::uniform_int_distribution<int> expert(0, 383);
  std::uniform_real_distribution<float> wdist(0.0f, 1.0f);
  for (int64_t t = 0; t < c.T; ++t) {
    const bool padded = c.pad && (rng() % 5 == 0);
    pad.host[(off + t * v.pad.strides[0])] = padded ? static_cast<uint8_t>(1 + rng() % 200) : 0;
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t e = v.ids.offset + t * v.ids.strides[0] + k * v.ids.strides[1];  // == w's
      const int64_t id = expert(rng) - (rng() % 50 == 0 ? 1000 : 0);
      if (c.ids == DType::kInt32) {
        const int32_t v32 = static_cast<int32_t>(id);
        std::memcpy(ids.host.data() + e * 4, &v32, 4);
      } else {
        std::memcpy(ids.host.data() + e * 8, &id, 8);
      }
      float f = padded ? NAN : wdist(rng);
      // Some kept weights are NaNs with a payload: copied bit-exactly, not canonicalized.
      const bool kept_nan = !padded && k == 0 && t % 7 == 1;
      if (c.w == DType::kFloat32) {
        if (kept_nan) {
          const uint32_t nan_bits = 0x7FC00123u;
          std::memcpy(&f, &nan_bits, 4);
        }
        std::memcpy(w.host.data() + e * 4, &f, 4);
      } else {
        uint16_t b = c.w == DType::kBFloat16 ? f32_to_bf16_trunc(f) : static_cast<uint16_t>(0x3000 | (rng() & 0x3FF));
        if (padded) b = 0x7E01;
        if (kept_nan) b = c.w == DType::kBFloat16 ? 0x7FC3 : 0x7E05;
        std::memcpy(w.host.data() + e * 2, &b, 2);
      }
    }
  }
  hs.upload();
  w.upload();
  ids.upload();
  pad.upload();
  for (Buf* b : {&xq, &sf, &io, &wo, &sh}) b->poison(0xA5);

  auto make_args = [&](bool on_dev) {
    const Device d = on_dev ? Device::cuda(0) : Device::cpu();
    auto base = [&](Buf& b) { return on_dev ? b.dev : static_cast<void*>(b.host.data()); };
    StageArgs a;
    a.hidden_states = v.hs.ref(base(hs), d);
    a.topk_weights = v.w.ref(base(w), d);
    a.topk_ids = v.ids.ref(base(ids), d);
    if (c.pad) a.is_padding = v.pad.ref(base(pad), d);
    a.x_q = v.xq.ref(base(xq), d);
    a.x_sf = v.sf.ref(base(sf), d);
    a.topk_idx_out = v.io.ref(base(io), d);
    a.topk_weights_out = v.wo.ref(base(wo), d);
    if (c.bm > 0) {
      a.shared_x_sf = v.sh.ref(base(sh), d);
      a.shared_block_m = c.bm;
    }
    a.hidden_quant = c.q;
    a.enable_pdl = pdl;
    return a;
  };
  // CPU backend on the host mirrors.
  megamoe::prepare_inputs(make_args(false));
  // CUDA backend.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const StageArgs da = make_args(true);
  if (graph) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    megamoe::prepare_inputs(da, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &g));
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    // Nothing may run at capture time: outputs still poisoned.
    CUDA_OK(cudaStreamSynchronize(stream));
    for (uint8_t b : xq.download()) ASSERT_EQ(b, 0xA5) << "capture executed work";
    CUDA_OK(cudaGraphLaunch(ge, stream));
    CUDA_OK(cudaGraphLaunch(ge, stream));  // replay twice: idempotent
    CUDA_OK(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  } else {
    megamoe::prepare_inputs(da, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  CUDA_OK(cudaGetLastError());
  cudaStreamDestroy(stream);
  const char* names[] = {"x_q", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf"};
  int i = 0;
  for (Buf* b : {&xq, &sf, &io, &wo, &sh}) {
    const std::vector<uint8_t> got = b->download();
    for (size_t k = 0; k < got.size(); ++k) {
      if (got[k] != b->host[k]) {
        FAIL() << names[i] << ": first mismatching byte at offset " << k << " of " << got.size()
               << ": gpu 0x" << std::hex << int(got[k]) << " cpu 0x" << int(b->host[k]);
      }
    }
    ++i;
  }
  // Guard against a vacuous pass: the CPU result must not be all poison.
  bool written = false;
  for (size_t k = 0; k < xq.host.size(); ++k) written |= xq.host[k] != 0xA5;
  EXPECT_TRUE(written);
}

void run_all_modes(const Case& c) {
  const bool big = c.T * c.H > (int64_t{1} << 22);  // big cases: eager and graph+PDL only
  for (bool graph : {false, true}) {
    for (bool pdl : {false, true}) {
      if (big && graph != pdl) continue;
      run_case(c, graph, pdl);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

/// Forces a fast-kernel shape and block size (tuning.h) for its lifetime; the heuristic again after.
struct ForceShape {
  ForceShape(int shape, int threads = 0) { megamoe::cuda::set_tuning({0, -1, threads, shape}); }
  ~ForceShape() { megamoe::cuda::set_tuning({}); }
};

const QuantScheme kSchemes[] = {QuantScheme::mxfp8(), QuantScheme::fp8_ue8m0_g128(),
                                QuantScheme::fp8_fp32_g128(), QuantScheme::fp8_fp32_g32()};

TEST(CudaStage, ShapesAndSchemes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t T : {1, 2, 7, 63, 64, 65, 127, 128, 135, 434, 4096}) {
    for (int64_t H : {256, 4096, 5120, 7168}) {
      for (const QuantScheme& q : kSchemes) {
        if (q.ue8m0() && (H / q.group_k) % 4 != 0) continue;
        Case c;
        c.T = T;
        c.H = H;
        c.q = q;
        c.K = (T % 5 == 0) ? 9 : (T % 2 ? 8 : 6);
        run_all_modes(c);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Every shape of the fast kernel, whatever the heuristic would pick for the size: grid-stride
// loop, one pass with separate top-k blocks (64..256-thread blocks), and token tiles
// (partial tiles in both directions: T % 8 != 0, rows shorter than a warp's 512 columns).
// Includes K > H/16 (a row's top-k spans more than one entry per thread), H = 128 and 256,
// shared scales through a transposed view and MN-major x_sf.
TEST(CudaStage, EveryKernelShape) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Config {
    int shape, threads;
  };
  for (const Config& k : {Config{0, 0}, Config{1, 0}, Config{0, 64}, Config{1, 64}, Config{1, 256}, Config{2, 0}}) {
    ForceShape force(k.shape, k.threads);
    for (int64_t T : {1, 7, 65, 135, 434}) {
      for (int64_t H : {128, 256, 7168}) {
        for (const QuantScheme& q : kSchemes) {
          if (q.ue8m0() && (H / q.group_k) % 4 != 0) continue;
          Case c;
          c.T = T;
          c.H = H;
          c.q = q;
          c.K = H == 128 ? 9 : (T % 2 ? 8 : 16);
          c.ids = T % 3 == 0 ? DType::kInt64 : DType::kInt32;
          c.w = T % 5 == 0 ? DType::kBFloat16 : (T == 7 ? DType::kFloat16 : DType::kFloat32);
          c.in = T == 7 ? DType::kFloat16 : (T == 65 ? DType::kFloat32 : DType::kBFloat16);
          c.strided_topk = T == 65;
          if (q.ue8m0()) c.bm = T == 1 ? 8 : 96, c.shared_transposed = T % 2 == 1;
          c.sf_mn_major = T == 135 || T == 7;
          SCOPED_TRACE("shape " + std::to_string(k.shape) + " threads " + std::to_string(k.threads));
          run_case(c, false, false);
          if (HasFatalFailure()) return;
          run_case(c, true, true);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(CudaStage, TopKAndDtypes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t K : {1, 6, 8, 9, 16}) {
    for (DType ids : {DType::kInt32, DType::kInt64}) {
      for (DType w : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        for (DType in : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
          Case c;
          c.T = 65;
          c.H = 256;
          c.K = K;
          c.ids = ids;
          c.w = w;
          c.in = in;
          c.strided_topk = (K % 2) == 1;
          run_all_modes(c);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(CudaStage, SharedScalesAllBlockM) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t bm : {8, 16, 32, 64, 96, 128, 192}) {
    for (int64_t T : {1, 63, 135, 434, 4096}) {
      for (bool transposed : {false, true}) {
        Case c;
        c.T = T;
        c.H = 7168;
        c.bm = bm;
        c.shared_transposed = transposed;
        run_all_modes(c);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CudaStage, StridesAlignmentAndLayouts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : kSchemes) {
    for (int variant = 0; variant < 4; ++variant) {
      Case c;
      c.T = 135;
      c.H = 5120;
      c.q = q;
      c.hs_noncontig = variant == 0 || variant == 3;
      c.misaligned = variant == 1 || variant == 3;
      c.sf_mn_major = variant == 2 || variant == 3;
      c.strided_topk = variant == 3;
      c.reversed_topk_in = variant == 2;
      if (q.ue8m0() && variant >= 1) c.bm = 96, c.shared_transposed = true;
      for (DType in : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
        c.in = in;
        run_all_modes(c);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Sizes where the heuristic picks token tiles (MN-major x_sf, transposed shared_x_sf, at
// least 2^18 chunks), with a last partial tile of tokens (partial column segments, H = 128
// and 256, are in EveryKernelShape, which forces tiles).
TEST(CudaStage, TokenTilesForMnMajorScales) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : kSchemes) {
    for (int64_t T : {1030, 4099}) {
      for (int64_t H : {4096, 5120}) {
        Case c;
        c.T = T;
        c.H = H;
        c.q = q;
        c.K = 8;
        c.sf_mn_major = true;
        if (q.ue8m0()) c.bm = T == 1030 ? 64 : 96, c.shared_transposed = true;
        run_all_modes(c);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CudaStage, OtherGroupSizes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t G : {1, 2, 4, 8, 16, 64}) {
    for (bool ue : {true, false}) {
      Case c;
      c.T = 63;
      c.H = 1024;
      c.q.group_k = G;
      c.q.scale = ue ? megamoe::ScaleType::kUE8M0 : megamoe::ScaleType::kFloat32;
      if (ue) c.bm = 32;
      run_all_modes(c);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaStage, LargeT) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 16384;
  c.H = 7168;
  run_case(c, false, false);
  if (HasFatalFailure()) return;
  c.T = 70000;  // more rows than a grid's y/z dimension allows
  c.H = 2048;
  c.bm = 192;
  run_case(c, false, true);
}

TEST(CudaStage, MoreThan2Pow31Elements) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  if (free_b < (size_t{10} << 30)) GTEST_SKIP() << "needs ~10 GiB of device memory";
  Case c;
  c.T = 300000;  // 300000 * 7168 = 2.15e9 > 2^31
  c.H = 7168;
  c.K = 8;
  c.q = QuantScheme::fp8_fp32_g128();
  c.edge_values = false;
  run_case(c, false, false);
}

TEST(CudaStage, ZeroTokensLaunchesNothing) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // T == 0: no error, no launch, even under capture (an empty graph).
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  StageArgs a;
  a.hidden_states = TensorRef(reinterpret_cast<void*>(16), DType::kBFloat16, {0, 7168}, Device::cuda(0));
  cudaGraph_t g;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  megamoe::prepare_inputs(a, s);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  size_t nodes = 99;
  CUDA_OK(cudaGraphGetNodes(g, nullptr, &nodes));
  EXPECT_EQ(nodes, 0u);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

}  // namespace

namespace {
// A small representative set for compute-sanitizer (memcheck, racecheck): both kernels,
// both scale types, padding, shared scales through a transposed view, strided outputs,
// graph capture and PDL.
TEST(CudaStageSanitizer, RepresentativeSet) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : kSchemes) {
    for (int variant = 0; variant < 2; ++variant) {
      Case c;
      c.T = 67;
      c.H = 1024;
      c.K = 9;
      c.q = q;
      c.misaligned = variant == 1;  // variant 1 takes the general kernel
      c.strided_topk = variant == 1;
      c.sf_mn_major = variant == 1;
      if (q.ue8m0()) c.bm = 96, c.shared_transposed = variant == 1;
      run_case(c, variant == 1, variant == 1);
      if (HasFatalFailure()) return;
      if (variant == 0) {  // the heuristic picks one shape here; the others too
        for (int shape : {0, 1, 2}) {
          ForceShape force(shape);
          run_case(c, true, false);
          if (HasFatalFailure()) return;
        }
        // Token tiles with MN-major scales (the layouts they are for), forced and chosen.
        Case m = c;
        m.sf_mn_major = true;
        m.shared_transposed = q.ue8m0();
        for (int shape : {-1, 2}) {
          ForceShape force(shape);
          run_case(m, true, false);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}
}  // namespace
