// stage_harness.h: the GPU tests' harness. A Case describes one staging call (sizes,
// scheme, dtypes, layouts); Staged owns its buffers, mirrored on host and device, with
// every output poisoned; expected() builds the image each WHOLE output allocation must have
// afterwards (elements, gaps between strided elements, unmapped shared rows: everything),
// and check() compares the device buffers with it byte for byte.
//
// The oracle is the independent reference (tests/reference/megamoe_reference.h, every
// format through megamoe_ref::Format), never the CPU backend; cpu_backend_images() exists
// only for the harness's own host-side check (test_plan.cpp: both give the same images).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/policy/plan.h"
#include "megamoe/megamoe.h"
#include "megamoe_reference.h"
#include "contract/validate.h"

namespace harness {

using megamoe::Device;
using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::StageArgs;
using megamoe::TensorRef;
namespace mc = megamoe::cuda;

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

/// One allocation mirrored on host and device; tensors are views into it.
struct Buf {
  std::vector<uint8_t> host;
  void* dev = nullptr;
  explicit Buf(size_t bytes = 16) : host(bytes) {
    if (cudaMalloc(&dev, bytes == 0 ? 1 : bytes) != cudaSuccess) dev = nullptr;
  }
  ~Buf() { cudaFree(dev); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  /// (The device sync: a pageable cudaMemcpy may return before its DMA has landed, and the
  /// staging calls run on a non-blocking stream, which does not wait for it.)
  void upload() const {
    cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> v(host.size());
    cudaMemcpy(v.data(), dev, v.size(), cudaMemcpyDeviceToHost);
    return v;
  }
  void poison(uint8_t b) {
    std::fill(host.begin(), host.end(), b);
    upload();
  }
};

/// A 2-D (or 1-D) view: element offset into the buffer, shape and strides (elements).
struct View {
  DType dtype = DType::kUInt8;
  int ndim = 2;
  int64_t shape[2] = {0, 0};
  int64_t strides[2] = {0, 0};
  int64_t offset = 0;
  int64_t skew = 0;  ///< bytes added to every element's address (1: off its element size)
  int64_t es() const { return megamoe::dtype_size(dtype); }
  size_t bytes() const {  // allocation covering the view (offset covers negative strides)
    int64_t hi = offset;
    for (int d = 0; d < ndim; ++d) hi += std::max<int64_t>(0, (shape[d] - 1) * strides[d]);
    return static_cast<size_t>((hi + 1) * es() + skew) + 16;
  }
  /// Byte offset of element (i, j) in the buffer.
  int64_t at(int64_t i, int64_t j = 0) const {
    return (offset + i * strides[0] + (ndim == 2 ? j * strides[1] : 0)) * es() + skew;
  }
  TensorRef ref(void* base, Device dev) const {
    TensorRef t;
    t.data = static_cast<uint8_t*>(base) + offset * es() + skew;
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

inline View dense(DType dt, int64_t r, int64_t c, int64_t off = 0) { return View{dt, 2, {r, c}, {c, 1}, off}; }
inline View vec(DType dt, int64_t n, int64_t stride, int64_t off = 0) { return View{dt, 1, {n, 0}, {stride, 0}, off}; }

struct Case {
  int64_t T = 64, H = 7168, K = 8;
  QuantScheme q = QuantScheme::mxfp8();
  DType in = DType::kBFloat16, ids = DType::kInt32, w = DType::kFloat32;
  bool pad = true;
  int64_t bm = 0;  // shared_x_sf block m (0: none)
  bool shared_transposed = false;
  bool hs_noncontig = false;      // row stride H + 64
  bool misaligned = false;        // every tensor offset by one element
  bool skewed = false;            // every tensor of wider elements one byte off their size
  bool sf_mn_major = false;       // x_sf[t, g] at g * align(T, 4) + t
  bool strided_topk = false;      // column-major top-k outputs
  bool reversed_topk_in = false;  // top-k ids/weights with rows reversed (stride -K): 64-bit offsets
  bool edge_values = true;        // NaN, Inf, subnormals, zeros, ties sprinkled in
  bool count = false;             // pass nonfinite_count
  float gs = 0.37f;               // NVFP4 static's global scale
  bool tiny = false;              // hidden values times 2^-120 (fp16: zeros): below 2^-100
  int one_sm_waves = 0;           // > 0: a forced plan's grid as for one SM and that many
                                  // waves (the looping shapes' blocks take many rows each)
  std::string name() const {
    std::ostringstream os;
    os << "T=" << T << " H=" << H << " K=" << K << " " << megamoe::scheme_name(q) << " in=" << megamoe::dtype_name(in)
       << " ids=" << megamoe::dtype_name(ids) << " w=" << megamoe::dtype_name(w) << " pad=" << pad << " bm=" << bm
       << " shT=" << shared_transposed << " hsNC=" << hs_noncontig << " mis=" << misaligned << " skew=" << skewed
       << " mn=" << sf_mn_major
       << " stk=" << strided_topk << " rev=" << reversed_topk_in << " count=" << count
       << " one_sm_waves=" << one_sm_waves << " tiny=" << tiny;
    return os.str();
  }
};

inline uint16_t f32_to_bf16_trunc(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

/// Random hidden values of dtype dt written at p: groups of random magnitudes, with edge
/// values (NaN +-, Inf +-, subnormals, zeros, fp8 and e2m1 ties, 448) sprinkled in.
inline void fill_hidden(std::mt19937& rng, DType dt, uint8_t* p, int64_t n_rows, int64_t H, int64_t row_stride,
                        bool edges) {
  std::normal_distribution<float> nd(0.0f, 17.0f);
  std::uniform_int_distribution<int> ex(-24, 24);
  std::uniform_int_distribution<int> pct(0, 9999);
  static const float kE2m1Mid[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const int64_t es = megamoe::dtype_size(dt);
  uint64_t s = rng() | 1ull;
  for (int64_t t = 0; t < n_rows; ++t) {
    float mag = std::ldexp(1.0f, ex(rng));
    for (int64_t h = 0; h < H; ++h) {
      uint8_t* dst = p + (t * row_stride + h) * es;
      float v;
      if (!edges) {  // cheap path for huge cases: xorshift values spanning many magnitudes
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v = static_cast<float>(static_cast<int32_t>(s)) * std::ldexp(1.0f, -26 - int(s >> 60));
      } else {
        if (h % 16 == 0) mag = (pct(rng) < 300) ? 1e-6f : std::ldexp(1.0f, ex(rng));
        v = nd(rng) * mag;
        const int r = pct(rng);
        if (r < 3) v = NAN;
        else if (r < 6) v = -NAN;
        else if (r < 8) v = INFINITY;
        else if (r < 10) v = -INFINITY;
        else if (r < 20) v = 1e-40f;  // fp32 subnormal
        else if (r < 30) v = 0.0f;
        else if (r < 35) v = -0.0f;
        else if (r < 45) v = 464.0f * std::ldexp(1.0f, ex(rng) / 4);  // fp8 tie after scaling
        else if (r < 50) v = 448.0f;
        else if (r < 300) v = kE2m1Mid[rng() % 7] * std::ldexp(1.0f, ex(rng) / 6) * ((rng() & 1) ? -1.0f : 1.0f);
        // Rows for the amax floor 0 (its unit scale): a zero first half (zero groups of every
        // size), and values scaled down to 2^-144 .. 2^-92 (fp32 scales at s <= 2^-128,
        // NVFP4 per-token rows below 2^-100), no rng drawn.
        if (t % 13 == 5 && h < H / 2) v = 0.0f;
        if (t % 13 == 9 && std::isfinite(v)) v *= 0x1p-120f;
      }
      if (dt == DType::kFloat32) {
        std::memcpy(dst, &v, 4);
      } else if (dt == DType::kBFloat16 || !edges) {
        const uint16_t b = f32_to_bf16_trunc(v);
        std::memcpy(dst, &b, 2);
      } else {  // fp16: random bits biased toward normal exponents; specials sometimes
        uint16_t b = static_cast<uint16_t>(rng());
        if (pct(rng) >= 50) b = static_cast<uint16_t>((b & 0x83FFu) | ((5 + rng() % 20) << 10));
        std::memcpy(dst, &b, 2);
      }
    }
  }
}

/// Widened hidden element (exact), through the reference's conversions.
inline float widen(DType dt, const uint8_t* p) {
  uint16_t h;
  float f;
  switch (dt) {
    case DType::kBFloat16: std::memcpy(&h, p, 2); return megamoe_ref::bf16_to_float(h);
    case DType::kFloat16: std::memcpy(&h, p, 2); return megamoe_ref::half_to_float(h);
    default: std::memcpy(&f, p, 4); return f;
  }
}

/// Images of every output buffer (index = Staged::outputs() order).
using Images = std::vector<std::vector<uint8_t>>;

/// All buffers of one case.
struct Staged {
  Case c;
  View hs, w, ids, pad, xq, sf, io, wo, sh, gsv, xs, nf;
  std::vector<std::unique_ptr<Buf>> bufs;
  Buf *hsb, *wb, *idsb, *padb, *xqb, *sfb, *iob, *wob, *shb, *gsb, *xsb, *nfb;
  Buf* gsob;  // NVFP4 online's global_scale (an output; its view is gsv)
  int64_t counter_start = 1000;

  explicit Staged(const Case& cs) : c(cs) {
    const int64_t off = c.misaligned ? 1 : 0;
    const megamoe::OutputShapes s = megamoe::output_shapes(
        c.T, c.H, c.K, c.q, c.bm > 0 ? std::optional<int64_t>(c.bm) : std::nullopt);
    const int64_t sfc = s.x_sf.shape[1], qc = s.x_q.shape[1];
    hs = View{c.in, 2, {c.T, c.H}, {c.hs_noncontig ? c.H + 64 : c.H, 1}, off};
    w = dense(c.w, c.T, c.K, off);
    ids = dense(c.ids, c.T, c.K, off);
    if (c.reversed_topk_in) {
      w = View{c.w, 2, {c.T, c.K}, {-c.K, 1}, off + (c.T - 1) * c.K};
      ids = View{c.ids, 2, {c.T, c.K}, {-c.K, 1}, off + (c.T - 1) * c.K};
    }
    pad = vec(DType::kBool, c.T, c.misaligned ? 3 : 1, off);
    xq = dense(s.x_q.dtype, c.T, qc, off);
    if (c.sf_mn_major) {
      const int64_t tm = (c.T + 3) / 4 * 4;
      sf = View{s.x_sf.dtype, 2, {c.T, sfc}, {1, tm}, off};
    } else {
      sf = dense(s.x_sf.dtype, c.T, sfc, off);
    }
    if (c.strided_topk) {
      io = View{DType::kInt64, 2, {c.T, c.K}, {1, c.T + 1}, off};
      wo = View{DType::kFloat32, 2, {c.T, c.K}, {1, c.T + 3}, off};
    } else {
      io = dense(DType::kInt64, c.T, c.K, off);
      wo = dense(DType::kFloat32, c.T, c.K, off);
    }
    if (c.bm > 0) {
      const int64_t rows = s.shared_x_sf->shape[0] + 5;
      sh = c.shared_transposed ? View{DType::kInt32, 2, {rows, sfc}, {1, rows}, off} : dense(DType::kInt32, rows, sfc, off);
    }
    gsv = vec(DType::kFloat32, 1, 1, off);
    xs = vec(DType::kFloat32, c.T, c.misaligned ? 2 : 1, off);
    nf = vec(DType::kInt64, 1, 1, 0);
    if (c.skewed) {
      for (View* v : {&hs, &w, &ids, &pad, &xq, &sf, &io, &wo, &sh, &gsv, &xs, &nf}) v->skew = v->es() > 1 ? 1 : 0;
    }
    auto mk = [&](const View& v) {
      bufs.push_back(std::make_unique<Buf>(v.bytes()));
      return bufs.back().get();
    };
    hsb = mk(hs), wb = mk(w), idsb = mk(ids), padb = mk(pad), xqb = mk(xq), sfb = mk(sf), iob = mk(io), wob = mk(wo);
    shb = c.bm > 0 ? mk(sh) : mk(View{});
    gsb = mk(gsv), xsb = mk(xs), nfb = mk(nf);
    gsob = online() ? mk(gsv) : mk(View{});
  }
  bool ok() const {
    for (const auto& b : bufs) {
      if (b->dev == nullptr) return false;
    }
    return true;
  }
  bool has_gs() const { return c.q.scale2 == megamoe::Scale2::kStatic; }
  bool online() const { return c.q.scale2 == megamoe::Scale2::kOnline; }
  bool has_xs() const { return c.q.scale2 == megamoe::Scale2::kPerToken; }

  /// Outputs in a fixed order, with names.
  std::vector<std::pair<const char*, Buf*>> outputs() const {
    return {{"x_q", xqb}, {"x_sf", sfb}, {"topk_idx_out", iob}, {"topk_weights_out", wob},
            {"shared_x_sf", shb}, {"x_scales", xsb}, {"nonfinite_count", nfb}, {"global_scale (out)", gsob}};
  }

  /// New random inputs (host mirrors and device), from @p seed.
  void fill_inputs(uint32_t seed) {
    std::mt19937 rng(seed);
    fill_hidden(rng, c.in, hsb->host.data() + hs.at(0, 0), c.T, c.H, hs.strides[0], c.edge_values);
    if (c.tiny) {  // (NaN and Inf stay what they are)
      for (int64_t t = 0; t < c.T; ++t) {
        for (int64_t h = 0; h < c.H; ++h) {
          uint8_t* e = hsb->host.data() + hs.at(t, h);
          const float v = widen(c.in, e) * 0x1p-120f;
          if (c.in == DType::kFloat32) {
            std::memcpy(e, &v, 4);
          } else {
            const uint16_t b = c.in == DType::kBFloat16 ? f32_to_bf16_trunc(v) : static_cast<uint16_t>(0);
            std::memcpy(e, &b, 2);
          }
        }
      }
    }
    std::uniform_int_distribution<int> expert(0, 383);
    std::uniform_real_distribution<float> wdist(0.0f, 1.0f);
    for (int64_t t = 0; t < c.T; ++t) {
      const bool padded = c.pad && (rng() % 5 == 0);
      padb->host[pad.at(t)] = padded ? static_cast<uint8_t>(1 + rng() % 200) : 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const int64_t id = expert(rng) - (rng() % 50 == 0 ? 1000 : 0);
        if (c.ids == DType::kInt32) {
          const int32_t v32 = static_cast<int32_t>(id);
          std::memcpy(idsb->host.data() + ids.at(t, k), &v32, 4);
        } else {
          std::memcpy(idsb->host.data() + ids.at(t, k), &id, 8);
        }
        float f = padded ? NAN : wdist(rng);
        // Some kept weights are NaNs with a payload: copied bit-exactly, not canonicalized.
        const bool kept_nan = !padded && k == 0 && t % 7 == 1;
        if (c.w == DType::kFloat32) {
          if (kept_nan) {
            const uint32_t nan_bits = 0x7FC00123u;
            std::memcpy(&f, &nan_bits, 4);
          }
          std::memcpy(wb->host.data() + w.at(t, k), &f, 4);
        } else {
          uint16_t b = c.w == DType::kBFloat16 ? f32_to_bf16_trunc(f) : static_cast<uint16_t>(0x3000 | (rng() & 0x3FF));
          if (padded) b = 0x7E01;
          if (kept_nan) b = c.w == DType::kBFloat16 ? 0x7FC3 : 0x7E05;
          std::memcpy(wb->host.data() + w.at(t, k), &b, 2);
        }
      }
    }
    std::memcpy(gsb->host.data() + gsv.at(0), &c.gs, 4);
    for (Buf* b : {hsb, wb, idsb, padb, gsb}) b->upload();
  }

  /// The byte poison_outputs() fills the outputs with. A legal output byte can equal it
  /// (0xA5 is an fp8 and an FP4 pair), so run_case also runs under its complement 0x5A: a
  /// skipped write shows under one of the two.
  uint8_t poison = 0xA5;

  /// Outputs poisoned (host mirrors and device), the counter at counter_start.
  void poison_outputs() {
    for (auto& o : outputs()) o.second->poison(poison);
    std::memcpy(nfb->host.data() + nf.at(0), &counter_start, 8);
    nfb->upload();
  }

  StageArgs args(bool on_dev, bool pdl = false) {
    const Device d = on_dev ? Device::cuda(0) : Device::cpu();
    auto base = [&](Buf* b) { return on_dev ? b->dev : static_cast<void*>(b->host.data()); };
    StageArgs a;
    a.hidden_states = hs.ref(base(hsb), d);
    a.topk_weights = w.ref(base(wb), d);
    a.topk_ids = ids.ref(base(idsb), d);
    if (c.pad) a.is_padding = pad.ref(base(padb), d);
    a.x_q = xq.ref(base(xqb), d);
    a.x_sf = sf.ref(base(sfb), d);
    a.topk_idx_out = io.ref(base(iob), d);
    a.topk_weights_out = wo.ref(base(wob), d);
    if (c.bm > 0) {
      a.shared_x_sf = sh.ref(base(shb), d);
      a.shared_block_m = c.bm;
    }
    if (has_gs()) a.global_scale = gsv.ref(base(gsb), d);
    if (online()) a.global_scale = gsv.ref(base(gsob), d);
    if (has_xs()) a.x_scales = xs.ref(base(xsb), d);
    if (c.count) a.nonfinite_count = nf.ref(base(nfb), d);
    a.hidden_quant = c.q;
    a.enable_pdl = pdl;
    return a;
  }

  /// The reference's description of the call's format.
  megamoe_ref::Format ref_format() const {
    const QuantScheme& q = c.q;
    if (q.elem == megamoe::QuantElem::kFloat8E4M3) return megamoe_ref::Format::fp8(q.ue8m0(), q.group_k, q.amax_floor);
    if (q.elem == megamoe::QuantElem::kFloat8E5M2) return megamoe_ref::Format::mxfp8_e5m2(q.amax_floor);
    if (q.scale2 == megamoe::Scale2::kStatic) return megamoe_ref::Format::nvfp4_static(c.gs);
    if (q.scale2 == megamoe::Scale2::kPerToken) return megamoe_ref::Format::nvfp4_per_token(q.amax_floor);
    if (q.scale2 == megamoe::Scale2::kOnline) return megamoe_ref::Format::nvfp4_online(q.amax_floor);
    const bool rne = q.rounding == megamoe::Rounding::kNearestEven;
    return megamoe_ref::Format::mxfp4(rne ? megamoe_ref::Fp4Ties::kNearestEven : megamoe_ref::Fp4Ties::kTowardZero,
                                      q.amax_floor);
  }

  /// What every output buffer must hold after the call on the current inputs, the outputs
  /// poisoned as poison_outputs() leaves them (host mirrors are left poisoned).
  Images expected() { return expected_under({poison}).front(); }

  /// expected() for each of @p poisons from one run of the reference (the big cases'
  /// reference takes most of their time). Leaves `poison` = the first, outputs poisoned so.
  std::vector<Images> expected_under(std::initializer_list<uint8_t> poisons) {
    std::vector<Images> all;
    for (uint8_t p : poisons) {
      poison = p;
      poison_outputs();
      all.emplace_back();
      for (auto& o : outputs()) all.back().push_back(o.second->host);
    }
    poison = *poisons.begin();
    poison_outputs();
    const int64_t T = c.T, H = c.H, K = c.K;
    std::vector<float> hidden(static_cast<size_t>(T * H));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) hidden[static_cast<size_t>(t * H + h)] = widen(c.in, hsb->host.data() + hs.at(t, h));
    }
    std::vector<int64_t> id(static_cast<size_t>(T * K));
    std::vector<float> wt(id.size());
    std::vector<uint8_t> pads(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      pads[static_cast<size_t>(t)] = padb->host[pad.at(t)];
      for (int64_t k = 0; k < K; ++k) {
        const size_t e = static_cast<size_t>(t * K + k);
        if (c.ids == DType::kInt32) {
          int32_t v;
          std::memcpy(&v, idsb->host.data() + ids.at(t, k), 4);
          id[e] = v;
        } else {
          std::memcpy(&id[e], idsb->host.data() + ids.at(t, k), 8);
        }
        wt[e] = widen(c.w, wb->host.data() + w.at(t, k));
      }
    }
    const megamoe_ref::Format f = ref_format();
    const megamoe_ref::Result r =
        megamoe_ref::stage(hidden.data(), T, H, id.data(), wt.data(), K, c.pad ? pads.data() : nullptr, f);
    for (Images& img : all) assemble(img, r, f);
    return all;
  }

  /// Writes the reference's results @p r into the poisoned images @p img.
  void assemble(Images& img, const megamoe_ref::Result& r, const megamoe_ref::Format& f) const {
    const int64_t T = c.T, K = c.K;
    auto put = [](std::vector<uint8_t>& im, int64_t at, const void* v, size_t n) { std::memcpy(im.data() + at, v, n); };
    const int64_t qc = xq.shape[1], sc = sf.shape[1];
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < qc; ++b) put(img[0], xq.at(t, b), &r.x_q[static_cast<size_t>(t * qc + b)], 1);
      for (int64_t s = 0; s < sc; ++s) {
        const size_t e = static_cast<size_t>(t * sc + s);
        put(img[1], sf.at(t, s), f.packed_scales() ? static_cast<const void*>(&r.sf_words[e]) : &r.sf_f32[e], 4);
        if (c.bm > 0) put(img[4], sh.at(megamoe_ref::shared_row(t, c.bm), s), &r.sf_words[e], 4);
      }
      for (int64_t k = 0; k < K; ++k) {
        put(img[2], io.at(t, k), &r.idx[static_cast<size_t>(t * K + k)], 8);
        put(img[3], wo.at(t, k), &r.w[static_cast<size_t>(t * K + k)], 4);
      }
      if (has_xs()) put(img[5], xs.at(t), &r.x_scales[static_cast<size_t>(t)], 4);
    }
    if (c.count) {
      const int64_t want = counter_start + r.nonfinite;
      put(img[6], nf.at(0), &want, 8);
    }
    if (online() && T > 0) put(img[7], gsv.at(0), &r.global_scale, 4);
  }

  /// The same images from the CPU backend run on the host mirrors: not an oracle (see
  /// file comment), the harness's own check that it lays the reference out right.
  Images cpu_backend_images() {
    poison_outputs();
    megamoe::prepare_inputs(args(false));
    Images img;
    for (auto& o : outputs()) img.push_back(o.second->host);
    poison_outputs();
    return img;
  }

  /// The device outputs equal @p want byte for byte.
  ::testing::AssertionResult check(const Images& want) const {
    const auto outs = outputs();
    for (size_t i = 0; i < outs.size(); ++i) {
      const std::vector<uint8_t> got = outs[i].second->download();
      for (size_t k = 0; k < got.size(); ++k) {
        if (got[k] != want[i][k]) {
          size_t n = 0;
          for (size_t m = k; m < got.size(); ++m) n += got[m] != want[i][m];
          return ::testing::AssertionFailure()
                 << outs[i].first << ": " << n << " byte(s) differ, first at offset " << k << " of " << got.size()
                 << ": gpu 0x" << std::hex << int(got[k]) << " expected 0x" << int(want[i][k]);
        }
      }
    }
    // Guard against a vacuous pass: the expectation must not be all poison.
    const bool written = std::any_of(want[0].begin(), want[0].end(), [this](uint8_t b) { return b != poison; });
    if (!written) return ::testing::AssertionFailure() << "expected x_q is all poison";
    return ::testing::AssertionSuccess();
  }
};

/// Changes a plan (then fill_grid recomputes its grid); empty: the library's own plan.
using Force = std::function<void(mc::Plan&)>;

/// Stage on the device: the library's prepare_inputs when @p force is empty, else the
/// library's plan changed by @p force and run through launch().
inline void stage_on_device(Staged& s, const Force& force, bool pdl, cudaStream_t stream) {
  const StageArgs a = s.args(true, pdl);
  if (!force) {
    megamoe::prepare_inputs(a, stream);
    return;
  }
  const megamoe::detail::Problem p = megamoe::detail::validate_args(a);
  const mc::DeviceInfo dev = mc::device_info(0);
  mc::Plan plan = mc::plan(p, a, dev);
  force(plan);
  if (s.c.one_sm_waves > 0) {
    mc::DeviceInfo one = dev;
    one.sm_count = 1;
    mc::fill_grid(plan, p, one, s.c.one_sm_waves);
  } else {
    mc::fill_grid(plan, p, dev);
  }
  mc::launch(plan, a, p, stream);
}

/// Run one case eagerly, or captured into a graph and replayed twice: once on the
/// current inputs, once on new inputs written into the same buffers. Checks after each.
inline void run_case(const Case& c, bool graph, bool pdl, const Force& force = {}, uint32_t seed = 1) {
  SCOPED_TRACE(c.name() + (graph ? " graph" : " eager") + (pdl ? " pdl" : ""));
  Staged s(c);
  ASSERT_TRUE(s.ok()) << "cudaMalloc";
  s.fill_inputs(seed * 7919u + static_cast<uint32_t>(c.T * 131 + c.H));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (!graph) {
    const std::vector<Images> want = s.expected_under({0xA5, 0x5A});
    stage_on_device(s, force, pdl, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaGetLastError());
    EXPECT_TRUE(s.check(want[0]));
    s.poison = 0x5A;  // again under the complementary poison
    s.poison_outputs();
    const Images& want_b = want[1];
    stage_on_device(s, force, pdl, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaGetLastError());
    EXPECT_TRUE(s.check(want_b)) << "outputs poisoned with 0x5A";
    cudaStreamDestroy(stream);
    return;
  }
  const Images want = s.expected();
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  stage_on_device(s, force, pdl, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  CUDA_OK(cudaStreamSynchronize(stream));
  for (uint8_t b : s.xqb->download()) ASSERT_EQ(b, 0xA5) << "capture executed work";
  CUDA_OK(cudaGraphLaunch(ge, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(s.check(want)) << "first replay";
  // New inputs into the same buffers (NVFP4 static: a new global scale too), outputs
  // poisoned again, with the complementary byte: the replay must see them, nothing is
  // memoized at capture.
  s.c.gs = c.gs * 3.0f + 0.01f;
  s.poison = 0x5A;
  s.fill_inputs(seed * 104729u + 17u);
  const Images want2 = s.expected();
  CUDA_OK(cudaGraphLaunch(ge, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  EXPECT_TRUE(s.check(want2)) << "second replay, new inputs";
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(stream);
}

/// Eagerly and as a graph, PDL off and on (big cases: eager and graph + PDL only).
inline void run_all_modes(const Case& c, const Force& force = {}) {
  const bool big = c.T * c.H > (int64_t{1} << 22);
  for (bool graph : {false, true}) {
    for (bool pdl : {false, true}) {
      if (big && graph != pdl) continue;
      run_case(c, graph, pdl, force);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

/// The schemes of every format (fp8 with both scale types and group sizes, MXFP8 e5m2, MXFP4 with
/// both tie rules, NVFP4 with both second-level scales), the SM90 pre-dispatch floor, the
/// lowest positive floors each format accepts (subnormal for the UE8M0 formats, whose
/// exponent clamps to byte 1; 2^-100 for fp32 scales and NVFP4 per-token), and the floor 0
/// (the unit scale) of every format that reads a floor.
inline std::vector<QuantScheme> all_schemes() {
  const float tiny = std::numeric_limits<float>::denorm_min();
  return {QuantScheme::mxfp8(),
          QuantScheme::fp8_ue8m0_g128(),
          QuantScheme::fp8_fp32_g128(),
          QuantScheme::fp8_fp32_g32(),
          QuantScheme::mxfp4(),
          QuantScheme::mxfp4(megamoe::Rounding::kNearestEven),
          QuantScheme::nvfp4_static(),
          QuantScheme::nvfp4_per_token(),
          QuantScheme::mxfp8().with_amax_floor(1e-10f),
          QuantScheme::fp8_fp32_g128().with_amax_floor(1e-10f),
          QuantScheme::mxfp4().with_amax_floor(1e-10f),
          QuantScheme::nvfp4_per_token().with_amax_floor(1e-10f),
          QuantScheme::mxfp8().with_amax_floor(tiny),
          QuantScheme::fp8_fp32_g128().with_amax_floor(0x1p-100f),
          QuantScheme::mxfp4().with_amax_floor(tiny),
          QuantScheme::nvfp4_per_token().with_amax_floor(0x1p-100f),
          QuantScheme::mxfp8_e5m2(),
          QuantScheme::mxfp8_e5m2().with_amax_floor(tiny),
          QuantScheme::mxfp8().with_amax_floor(0.0f),
          QuantScheme::fp8_fp32_g128().with_amax_floor(0.0f),
          QuantScheme::fp8_fp32_g32().with_amax_floor(0.0f),
          QuantScheme::mxfp4(megamoe::Rounding::kNearestEven).with_amax_floor(0.0f),
          QuantScheme::nvfp4_per_token().with_amax_floor(0.0f),
          QuantScheme::mxfp8_e5m2().with_amax_floor(0.0f)};
}

}  // namespace harness
