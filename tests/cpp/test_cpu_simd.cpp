// test_cpu_simd.cpp: the vectorized CPU quantizer (src/cpu/stage_simd.cpp) against the
// scalar rules of src/core, on every instruction set this machine runs (each Highway
// target is forced in turn with hwy::SetSupportedTargetsForTest), and the persistent
// worker pool (src/cpu/pool.cpp) behind megamoe::set_cpu_threads.
//
// Sweep sizes: the e4m3 encoder of the best instruction set sees all 2^32 fp32 patterns,
// the other instruction sets every 17th pattern (2^32 / 17, about 2^28: every exponent and
// every residue of the low bits) plus a list of hand-picked edges. The e2m1 encoders, whose
// result depends only on where |v| falls among seven midpoints, see every 17th pattern,
// every NaN and subnormal pattern, and 2^20 patterns on each side of every midpoint and
// grid point. MEGAMOE_FULL_SWEEP=1 in the environment sweeps all 2^32 patterns everywhere
// (a few minutes). Sanitizer and unoptimized builds take every 4099th pattern, to stay
// within CI time.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define MEGAMOE_TEST_MXCSR 1
#endif
#include <cfenv>

#include "formats/recipe.h"
#include "cpu/pool.h"
#include "cpu/simd.h"
#include "cpu_simd_hooks.h"
#include "megamoe/cpu.h"
#include "megamoe/megamoe.h"

namespace {

namespace simd = megamoe::cpu::simd;
namespace core = megamoe::core;
using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::TensorRef;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr bool kSlowBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool kSlowBuild = true;
#else
constexpr bool kSlowBuild = false;
#endif
#else
constexpr bool kSlowBuild = false;
#endif

uint32_t f2u(float f) { return core::float_bits(f); }
float u2f(uint32_t u) { return core::bits_float(u); }

/// The instruction sets that are both compiled in and runnable here, best first.
std::vector<int64_t> Targets() {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<int64_t> out;
  for (int64_t m = simd::compiled_targets() & hwy::SupportedTargets(); m != 0; m &= m - 1) out.push_back(m & -m);
  return out;
}

/// Forces one instruction set for the dispatches of its lifetime.
class ForceTarget {
 public:
  explicit ForceTarget(int64_t t) { hwy::SetSupportedTargetsForTest(t); }
  ~ForceTarget() { hwy::SetSupportedTargetsForTest(0); }
  ForceTarget(const ForceTarget&) = delete;
  ForceTarget& operator=(const ForceTarget&) = delete;
};

/// Runs body(begin, end) over [0, n) split across the machine's cores.
template <typename Body>
void Parallel(uint64_t n, Body body) {
  const unsigned k = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (unsigned i = 0; i < k; ++i) th.emplace_back([&, i] { body(n * i / k, n * (i + 1) / k); });
  for (auto& t : th) t.join();
}

/// Hand-picked fp32 patterns: signed zeros, the smallest and largest subnormals, every
/// e4m3 rounding point (midpoints and their neighbours at each significand shift), the
/// saturation edge, e2m1 midpoints and neighbours, Inf, quiet and signalling NaNs.
std::vector<uint32_t> EdgePatterns() {
  std::vector<uint32_t> v = {0x00000000u, 0x00000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu,
                             0x7F800000u, 0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x7FA00000u};
  for (float f : {448.0f, 464.0f, 465.0f, 470.0f, 480.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f,
                  0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 0.001953125f, 0.0009765625f, 0.015625f}) {
    for (int d = -3; d <= 3; ++d) v.push_back(f2u(f) + static_cast<uint32_t>(d));
  }
  // e4m3 midpoints: exponent fields 115..140 with the bits below each rounding position
  // at half, half +- 1, and the even/odd neighbours.
  for (uint32_t e = 112; e <= 140; ++e) {
    for (uint32_t m = 0; m < 16; ++m) {
      for (uint32_t shift = 19; shift <= 24; ++shift) {
        const uint32_t base = e << 23 | (m << shift & 0x7FFFFFu);
        const uint32_t half = 1u << (shift - 1);
        for (uint32_t low : {0u, half - 1, half, half + 1, 2 * half - 1}) v.push_back(base | (low & 0x7FFFFFu));
      }
    }
  }
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(v[i] | 0x80000000u);
  return v;
}

/// Compares encode(x) with ref(x) for the patterns pattern(i), i in [0, n); returns the
/// number of mismatches and records the first.
template <typename Pattern, typename Encode, typename Ref>
uint64_t Sweep(uint64_t n, Pattern pattern, Encode encode, Ref ref, uint32_t* first_bad) {
  std::atomic<uint64_t> bad{0};
  std::atomic<uint32_t> first{0};
  Parallel(n, [&](uint64_t b, uint64_t e) {
    constexpr size_t kChunk = 1 << 16;
    std::vector<float> x(kChunk);
    std::vector<uint8_t> got(kChunk);
    for (uint64_t i0 = b; i0 < e; i0 += kChunk) {
      const size_t m = static_cast<size_t>(std::min<uint64_t>(kChunk, e - i0));
      for (size_t i = 0; i < m; ++i) x[i] = u2f(pattern(i0 + i));
      encode(x.data(), got.data(), m);
      uint64_t local = 0;
      for (size_t i = 0; i < m; ++i) {
        if (got[i] != ref(x[i])) {
          if (local++ == 0 && bad.load() == 0) first.store(f2u(x[i]));
        }
      }
      bad += local;
    }
  });
  *first_bad = first.load();
  return bad.load();
}

bool FullSweepRequested() {
  const char* v = std::getenv("MEGAMOE_FULL_SWEEP");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

class SimdTarget : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    force_ = std::make_unique<ForceTarget>(GetParam());
    ASSERT_STREQ(simd::active_target(), hwy::TargetName(GetParam())) << "the forced target was not dispatched";
  }
  void TearDown() override { force_.reset(); }
  bool Best() const { return GetParam() == Targets().front(); }
  /// Stride through the 2^32 patterns: 1 (all) when `full`, else 17.
  static uint32_t Stride(bool full) {
    if (FullSweepRequested()) return 1;
    if (kSlowBuild) return 4099;
    return full ? 1 : 17;
  }
  static uint64_t Count(uint32_t stride) { return ((uint64_t{1} << 32) + stride - 1) / stride; }

 private:
  std::unique_ptr<ForceTarget> force_;
};

std::string TargetParamName(const ::testing::TestParamInfo<int64_t>& info) { return hwy::TargetName(info.param); }

TEST_P(SimdTarget, E4m3EncodeEqualsScalarOnFp32Patterns) {
  const uint32_t stride = Stride(Best());
  uint32_t first = 0;
  const uint64_t bad = Sweep(
      Count(stride), [&](uint64_t i) { return static_cast<uint32_t>(i * stride); }, simd::encode_e4m3,
      [](float x) { return core::fp8_e4m3_from_float_sw(x); }, &first);
  EXPECT_EQ(bad, 0u) << "first mismatch: fp32 bits 0x" << std::hex << first;
  const std::vector<uint32_t> edges = EdgePatterns();
  const uint64_t bad_edges = Sweep(
      edges.size(), [&](uint64_t i) { return edges[i]; }, simd::encode_e4m3,
      [](float x) { return core::fp8_e4m3_from_float_sw(x); }, &first);
  EXPECT_EQ(bad_edges, 0u) << "first mismatch: fp32 bits 0x" << std::hex << first;
}

// The encoder of groups that hold only e4m3 normals and saturating values: every 7th
// pattern of its domain (2^-6 <= |x| <= Inf) on the best target, every 17th elsewhere.
TEST_P(SimdTarget, E4m3NormalRangeEncodeEqualsScalar) {
  const uint32_t lo = 0x3C800000u, hi = 0x7F800000u;
  const uint32_t stride = FullSweepRequested() ? 1 : kSlowBuild ? 4099 : Best() ? 7 : 17;
  const uint64_t per_sign = (hi - lo) / stride + 1;
  uint32_t first = 0;
  const uint64_t bad = Sweep(
      2 * per_sign,
      [&](uint64_t i) {
        const uint32_t a = lo + static_cast<uint32_t>(i % per_sign) * stride;
        return i < per_sign ? a : a | 0x80000000u;
      },
      simd::encode_e4m3_normal, [](float x) { return core::fp8_e4m3_from_float_sw(x); }, &first);
  EXPECT_EQ(bad, 0u) << "first mismatch: fp32 bits 0x" << std::hex << first;
  std::vector<uint32_t> edges;
  for (uint32_t b : EdgePatterns()) {
    if ((b & 0x7FFFFFFFu) >= lo && (b & 0x7FFFFFFFu) <= hi) edges.push_back(b);
  }
  const uint64_t bad_edges = Sweep(
      edges.size(), [&](uint64_t i) { return edges[i]; }, simd::encode_e4m3_normal,
      [](float x) { return core::fp8_e4m3_from_float_sw(x); }, &first);
  EXPECT_EQ(bad_edges, 0u) << "first mismatch: fp32 bits 0x" << std::hex << first;
}

/// Patterns for the e2m1 encoders besides the strided sweep (see the file comment).
std::vector<uint32_t> E2m1Classes() {
  std::vector<uint32_t> v = EdgePatterns();
  const uint32_t step = kSlowBuild ? 4099 : 1;
  for (uint32_t m = 0; m < (1u << 23); m += step) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      v.push_back(sign | m);                // zero and subnormals
      v.push_back(sign | 0x7F800000u | m);  // Inf and every NaN
    }
  }
  const int64_t window = kSlowBuild ? 1 << 10 : 1 << 20;
  for (float f : {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f}) {
    for (int64_t d = -window; d <= window; d += step) {
      for (uint32_t sign : {0u, 0x80000000u}) v.push_back(sign | static_cast<uint32_t>(f2u(f) + d));
    }
  }
  return v;
}

TEST_P(SimdTarget, E2m1EncodesEqualScalarOnFp32Patterns) {
  const uint32_t stride = Stride(false);
  const std::vector<uint32_t> classes = E2m1Classes();
  for (const bool ttz : {true, false}) {
    auto encode = [ttz](const float* x, uint8_t* o, size_t n) { simd::encode_e2m1(x, o, n, ttz); };
    auto ref = [ttz](float x) { return static_cast<uint8_t>(ttz ? core::e2m1_ttz(x) : core::e2m1_rne(x)); };
    uint32_t first = 0;
    const uint64_t bad = Sweep(Count(stride), [&](uint64_t i) { return static_cast<uint32_t>(i * stride); }, encode, ref, &first);
    EXPECT_EQ(bad, 0u) << (ttz ? "ttz" : "rne") << ": first mismatch: fp32 bits 0x" << std::hex << first;
    const uint64_t bad_classes = Sweep(classes.size(), [&](uint64_t i) { return classes[i]; }, encode, ref, &first);
    EXPECT_EQ(bad_classes, 0u) << (ttz ? "ttz" : "rne") << ": first mismatch: fp32 bits 0x" << std::hex << first;
  }
}

TEST_P(SimdTarget, WideningOfAll16BitPatternsIsExact) {
  std::vector<uint16_t> h(65536 + 3);  // + 3: a tail shorter than a vector
  for (uint32_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i * 40503u);  // odd: every pattern
  for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<uint32_t> got(h.size());
  // Unaligned source: odd byte offset.
  std::vector<uint8_t> raw(h.size() * 2 + 1);
  std::memcpy(raw.data() + 1, h.data(), h.size() * 2);
  simd::widen(simd::In::kBf16, raw.data() + 1, got.data(), h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(got[i], f2u(core::bf16_to_float(h[i]))) << "bf16 0x" << std::hex << h[i];
  }
  simd::widen(simd::In::kFp16, raw.data() + 1, got.data(), h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(got[i], f2u(core::half_to_float(h[i]))) << "fp16 0x" << std::hex << h[i];
  }
  const std::vector<uint32_t> edges = EdgePatterns();
  simd::widen(simd::In::kFp32, edges.data(), got.data(), std::min(edges.size(), got.size()));
  for (size_t i = 0; i < std::min(edges.size(), got.size()); ++i) ASSERT_EQ(got[i], edges[i]);
}

TEST_P(SimdTarget, GroupAmaxOnAdversarialGroups) {
  const size_t L = simd::active_lanes();
  std::mt19937 rng(7);
  const uint32_t specials[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x7F800000u, 0xFF800000u,
                               0x80000000u, 0x00000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu};
  for (size_t G : {size_t{16}, size_t{32}, size_t{64}, size_t{128}}) {
    if (G % L != 0) continue;
    std::vector<std::vector<uint32_t>> groups;
    // A NaN (either sign, quiet or signalling) at every position of a group of ordinary
    // values; -0.0 / subnormal-only groups; all-NaN; +-Inf anywhere; mixes.
    for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu}) {
      for (size_t pos = 0; pos < G; ++pos) {
        std::vector<uint32_t> g(G);
        for (auto& b : g) b = f2u(std::normal_distribution<float>(0.0f, 3.0f)(rng));
        g[pos] = nan;
        groups.push_back(g);
      }
    }
    groups.push_back(std::vector<uint32_t>(G, 0x80000000u));
    groups.push_back(std::vector<uint32_t>(G, 0x7FC00000u));
    groups.push_back(std::vector<uint32_t>(G, 0x00000001u));
    for (size_t pos = 0; pos < G; ++pos) {
      std::vector<uint32_t> g(G, 0x80000000u);
      g[pos] = pos % 2 ? 0xFF800000u : 0x7F800000u;
      groups.push_back(g);
      std::vector<uint32_t> h(G, 0xFFC00000u);
      h[pos] = 0x807FFFFFu;  // the only number: the largest negative subnormal
      groups.push_back(h);
    }
    for (int r = 0; r < 200; ++r) {
      std::vector<uint32_t> g(G);
      for (auto& b : g) b = rng() % 3 == 0 ? specials[rng() % 12] : static_cast<uint32_t>(rng());
      groups.push_back(g);
    }
    std::vector<float> x;
    for (const auto& g : groups) {
      for (uint32_t b : g) x.push_back(u2f(b));
    }
    std::vector<float> amax(groups.size());
    int64_t count = -1;
    ASSERT_TRUE(simd::group_amax(x.data(), groups.size(), G, amax.data(), &count));
    int64_t want_count = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      float want = 0.0f;
      for (size_t j = 0; j < G; ++j) {
        const float v = x[i * G + j];
        want = core::fmax_nan_ignoring(want, core::abs_bits(v));
        want_count += core::non_finite(v) ? 1 : 0;
      }
      ASSERT_EQ(f2u(amax[i]), f2u(want)) << "G " << G << ", group " << i;
    }
    EXPECT_EQ(count, want_count) << "G " << G;
  }
}

// ---------------------------------------------------------------------------------------
// Whole calls: the vectorized path against the scalar path (simd::set_enabled(false)).

struct Case {
  QuantScheme q;
  DType in;
  int64_t T, H, K;
  bool shared = false, padding = false, nonfinite = false, sf_transposed = false;
};

struct Outputs {
  std::vector<uint8_t> xq, sf;
  std::vector<int64_t> idx;
  std::vector<float> w;
  std::vector<int32_t> shared;
  std::vector<float> x_scales;
  int64_t count = 0;
};

/// Random hidden states as raw bits: per group a base exponent, elements a few binades
/// below it, random mantissas and signs; some patterns fully random (NaN, Inf, subnormals
/// of every kind), some -0.0, some groups all zero.
std::vector<uint8_t> RandomHidden(DType dt, int64_t T, int64_t H, uint32_t seed) {
  std::mt19937 rng(seed);
  const int esize = dt == DType::kFloat32 ? 4 : 2;
  const int ebits = dt == DType::kFloat16 ? 5 : 8, mbits = dt == DType::kFloat16 ? 10 : dt == DType::kBFloat16 ? 7 : 23;
  const int emax = (1 << ebits) - 1;
  std::vector<uint8_t> out(static_cast<size_t>(T * H) * esize);
  for (int64_t t = 0; t < T; ++t) {
    int base = 0;
    for (int64_t h = 0; h < H; ++h) {
      if (h % 16 == 0) base = static_cast<int>(rng() % (emax + 1));
      uint32_t bits;
      const uint32_t r = rng() % 1000;
      if (r < 8) {
        bits = rng();
      } else if (r < 12) {
        bits = 1u << (ebits + mbits);  // -0.0
      } else {
        const int e = std::clamp(base - static_cast<int>(rng() % 6), 0, emax);
        bits = (rng() & 1u) << (ebits + mbits) | static_cast<uint32_t>(e) << mbits | (rng() & ((1u << mbits) - 1));
      }
      if (t % 7 == 3 && h < 256) bits = 0;
      std::memcpy(&out[static_cast<size_t>(t * H + h) * esize], &bits, esize);
    }
  }
  return out;
}

Outputs Stage(const Case& c, const std::vector<uint8_t>& hidden, const std::vector<float>& topw,
              const std::vector<int32_t>& ids, const std::vector<uint8_t>& pad, float gs) {
  const int64_t bm = 64;
  const megamoe::OutputShapes s =
      megamoe::output_shapes(c.T, c.H, c.K, c.q, c.shared ? std::optional<int64_t>(bm) : std::nullopt);
  Outputs o;
  o.xq.assign(static_cast<size_t>(s.x_q.numel()), 0xA5);
  o.sf.assign(static_cast<size_t>(s.x_sf.numel()) * 4, 0x5A);
  o.idx.assign(static_cast<size_t>(c.T * c.K), 77);
  o.w.assign(static_cast<size_t>(c.T * c.K), 7.0f);
  megamoe::StageArgs a;
  a.hidden_states = TensorRef(const_cast<uint8_t*>(hidden.data()), c.in, {c.T, c.H});
  a.topk_weights = TensorRef(const_cast<float*>(topw.data()), DType::kFloat32, {c.T, c.K});
  a.topk_ids = TensorRef(const_cast<int32_t*>(ids.data()), DType::kInt32, {c.T, c.K});
  a.x_q = TensorRef(o.xq.data(), s.x_q.dtype, {s.x_q.shape[0], s.x_q.shape[1]});
  const int64_t cols = s.x_sf.shape[1];
  if (c.sf_transposed) {
    a.x_sf = TensorRef(o.sf.data(), s.x_sf.dtype, {c.T, cols}, {1, c.T});
  } else {
    a.x_sf = TensorRef(o.sf.data(), s.x_sf.dtype, {c.T, cols});
  }
  a.topk_idx_out = TensorRef(o.idx.data(), DType::kInt64, {c.T, c.K});
  a.topk_weights_out = TensorRef(o.w.data(), DType::kFloat32, {c.T, c.K});
  a.hidden_quant = c.q;
  if (c.padding) a.is_padding = TensorRef(const_cast<uint8_t*>(pad.data()), DType::kUInt8, {c.T});
  if (c.shared) {
    o.shared.assign(static_cast<size_t>(s.shared_x_sf->numel()), -3);
    // A transposed view (MN-major), as the shared expert's TMA wants.
    const int64_t rows = s.shared_x_sf->shape[0];
    a.shared_x_sf = TensorRef(o.shared.data(), DType::kInt32, {rows, cols}, {1, rows});
    a.shared_block_m = bm;
  }
  float gsv = gs;
  if (s.global_scale) a.global_scale = TensorRef(&gsv, DType::kFloat32, {1});
  if (s.x_scales) {
    o.x_scales.assign(static_cast<size_t>(c.T), -1.0f);
    a.x_scales = TensorRef(o.x_scales.data(), DType::kFloat32, {c.T});
  }
  o.count = 5;
  if (c.nonfinite) a.nonfinite_count = TensorRef(&o.count, DType::kInt64, {1});
  megamoe::prepare_inputs(a);
  return o;
}

/// The first element where two output vectors differ bitwise (-1: none; -2: sizes differ).
template <typename V>
int64_t FirstDifference(const std::vector<V>& x, const std::vector<V>& y) {
  if (x.size() != y.size()) return -2;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::memcmp(&x[i], &y[i], sizeof x[i]) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

/// Every output of two calls bitwise equal.
bool SameBits(const Outputs& a, const Outputs& b) {
  return FirstDifference(a.xq, b.xq) == -1 && FirstDifference(a.sf, b.sf) == -1 && FirstDifference(a.idx, b.idx) == -1 &&
         FirstDifference(a.w, b.w) == -1 && FirstDifference(a.shared, b.shared) == -1 &&
         FirstDifference(a.x_scales, b.x_scales) == -1 && a.count == b.count;
}

void ExpectSame(const Outputs& a, const Outputs& b, const std::string& what) {
  auto first = [](const auto& x, const auto& y) -> int64_t { return FirstDifference(x, y); };
  EXPECT_EQ(first(a.xq, b.xq), -1) << what << ": x_q";
  EXPECT_EQ(first(a.sf, b.sf), -1) << what << ": x_sf";
  EXPECT_EQ(first(a.idx, b.idx), -1) << what << ": topk_idx_out";
  EXPECT_EQ(first(a.w, b.w), -1) << what << ": topk_weights_out";
  EXPECT_EQ(first(a.shared, b.shared), -1) << what << ": shared_x_sf";
  EXPECT_EQ(first(a.x_scales, b.x_scales), -1) << what << ": x_scales";
  EXPECT_EQ(a.count, b.count) << what << ": nonfinite_count";
}

std::vector<std::pair<std::string, QuantScheme>> Schemes() {
  using megamoe::Rounding;
  QuantScheme g8 = QuantScheme::mxfp8();
  g8.group_k = 8;
  QuantScheme g16 = QuantScheme::fp8_fp32_g32();
  g16.group_k = 16;
  QuantScheme g4 = QuantScheme::mxfp8();
  g4.group_k = 4;  // narrower than any vector: the scalar path on every target
  return {{"mxfp8", QuantScheme::mxfp8()},
          {"fp8_ue8m0_g128", QuantScheme::fp8_ue8m0_g128()},
          {"fp8_fp32_g128", QuantScheme::fp8_fp32_g128()},
          {"fp8_fp32_g32", QuantScheme::fp8_fp32_g32()},
          {"fp8_ue8m0_g8", g8},
          {"fp8_fp32_g16", g16},
          {"fp8_ue8m0_g4", g4},
          {"mxfp8_floor1e-10", QuantScheme::mxfp8().with_amax_floor(1e-10f)},
          {"mxfp4", QuantScheme::mxfp4()},
          {"mxfp4_rne", QuantScheme::mxfp4(Rounding::kNearestEven)},
          {"nvfp4_static", QuantScheme::nvfp4_static()},
          {"nvfp4_per_token", QuantScheme::nvfp4_per_token()},
          {"nvfp4_per_token_floor1e-10", QuantScheme::nvfp4_per_token().with_amax_floor(1e-10f)},
          {"mxfp8_floor0", QuantScheme::mxfp8().with_amax_floor(0.0f)},
          {"fp8_fp32_g128_floor0", QuantScheme::fp8_fp32_g128().with_amax_floor(0.0f)},
          {"fp8_fp32_g16_floor0", g16.with_amax_floor(0.0f)},
          {"mxfp4_rne_floor0", QuantScheme::mxfp4(Rounding::kNearestEven).with_amax_floor(0.0f)},
          {"nvfp4_per_token_floor0", QuantScheme::nvfp4_per_token().with_amax_floor(0.0f)}};
}

TEST_P(SimdTarget, WholeCallsEqualTheScalarPath) {
  uint32_t seed = 1;
  for (const auto& [name, q] : Schemes()) {
    for (DType in : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
      for (int variant = 0; variant < 2; ++variant) {
        Case c{q, in, variant == 0 ? 5 : 67, variant == 0 ? 512 : 1536, 6};
        const bool ue8m0 = q.scale == megamoe::ScaleType::kUE8M0;
        c.shared = ue8m0 && variant == 1;
        c.padding = variant == 1;
        c.nonfinite = true;
        c.sf_transposed = variant == 0;
        const std::vector<uint8_t> hidden = RandomHidden(in, c.T, c.H, seed++);
        std::vector<float> w(static_cast<size_t>(c.T * c.K));
        std::vector<int32_t> ids(w.size());
        std::vector<uint8_t> pad(static_cast<size_t>(c.T));
        for (size_t i = 0; i < w.size(); ++i) {
          w[i] = static_cast<float>(i % 13) / 7.0f;
          ids[i] = static_cast<int32_t>(i * 31 % 256);
        }
        for (size_t t = 0; t < pad.size(); ++t) pad[t] = t % 5 == 2;
        for (float gs : {0.37f, 1e-30f}) {
          if (q.scale2 != megamoe::Scale2::kStatic && gs != 0.37f) continue;
          const std::string what = name + " " + megamoe::dtype_name(in) + " T=" + std::to_string(c.T) +
                                   " gs=" + std::to_string(gs);
          simd::set_enabled(false);
          const Outputs want = Stage(c, hidden, w, ids, pad, gs);
          simd::set_enabled(true);
          const Outputs got = Stage(c, hidden, w, ids, pad, gs);
          ExpectSame(got, want, what);
        }
      }
    }
  }
}

// Rows that stride along H stay scalar; contiguous rows with a row stride (a slice of a
// wider buffer, negative too) go vectorized: both equal the contiguous scalar result.
TEST_P(SimdTarget, RowStridesAndUnalignedRows) {
  const int64_t T = 9, H = 1536, K = 2;
  const std::vector<uint8_t> hidden = RandomHidden(DType::kBFloat16, T, H, 99);
  // Row stride H + 3 elements, rows in reverse order, base at an odd byte address.
  const int64_t rs = H + 3;
  std::vector<uint8_t> wide(static_cast<size_t>(T * rs * 2 + 1));
  uint8_t* base = wide.data() + 1 + (T - 1) * rs * 2;
  for (int64_t t = 0; t < T; ++t) std::memcpy(base - t * rs * 2, &hidden[static_cast<size_t>(t * H * 2)], H * 2);
  std::vector<float> w(T * K, 0.5f);
  std::vector<int32_t> ids(T * K, 3);
  for (const auto& [name, q] : Schemes()) {
    const megamoe::OutputShapes s = megamoe::output_shapes(T, H, K, q);
    // Different poisons in the two results: an element one path skips cannot match.
    std::vector<uint8_t> xq_a(s.x_q.numel(), 0xA5), xq_b(s.x_q.numel() * 2 + 1, 0x5A), sf_a(s.x_sf.numel() * 4, 0xA5),
        sf_b(sf_a.size(), 0x5A);
    std::vector<int64_t> idx(T * K);
    std::vector<float> wo(T * K), xs(T);
    float gs = 0.25f;
    megamoe::StageArgs a;
    a.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
    a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
    a.topk_idx_out = TensorRef(idx.data(), DType::kInt64, {T, K});
    a.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {T, K});
    a.hidden_quant = q;
    if (s.global_scale) a.global_scale = TensorRef(&gs, DType::kFloat32, {1});
    if (s.x_scales) a.x_scales = TensorRef(xs.data(), DType::kFloat32, {T});
    simd::set_enabled(false);
    a.hidden_states = TensorRef(const_cast<uint8_t*>(hidden.data()), DType::kBFloat16, {T, H});
    a.x_q = TensorRef(xq_a.data(), s.x_q.dtype, {T, s.x_q.shape[1]});
    a.x_sf = TensorRef(sf_a.data(), s.x_sf.dtype, {T, s.x_sf.shape[1]});
    megamoe::prepare_inputs(a);
    simd::set_enabled(true);
    a.hidden_states = TensorRef(base, DType::kBFloat16, {T, H}, {-rs, 1});
    // x_q rows at an odd address with a row stride of twice the width.
    a.x_q = TensorRef(xq_b.data() + 1, s.x_q.dtype, {T, s.x_q.shape[1]}, {2 * s.x_q.shape[1], 1});
    a.x_sf = TensorRef(sf_b.data(), s.x_sf.dtype, {T, s.x_sf.shape[1]});
    megamoe::prepare_inputs(a);
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_EQ(0, std::memcmp(&xq_a[t * s.x_q.shape[1]], &xq_b[1 + 2 * t * s.x_q.shape[1]], s.x_q.shape[1]))
          << name << " row " << t;
    }
    EXPECT_EQ(sf_a, sf_b) << name;
    // Strided along H (every other element of a [T, 2H] buffer): the scalar path.
    std::vector<uint8_t> twice(static_cast<size_t>(T * H * 4));
    for (int64_t i = 0; i < T * H; ++i) std::memcpy(&twice[i * 4], &hidden[i * 2], 2);
    a.hidden_states = TensorRef(twice.data(), DType::kBFloat16, {T, H}, {2 * H, 2});
    std::fill(sf_b.begin(), sf_b.end(), 0x5A);
    std::fill(xq_b.begin(), xq_b.end(), 0x5A);
    a.x_q = TensorRef(xq_b.data(), s.x_q.dtype, {T, s.x_q.shape[1]});
    megamoe::prepare_inputs(a);
    EXPECT_EQ(0, std::memcmp(xq_a.data(), xq_b.data(), xq_a.size())) << name;
    EXPECT_EQ(sf_a, sf_b) << name;
  }
}

// A caller running with flush-to-zero / denormals-are-zero (torch.set_flush_denormal) or
// another rounding mode gets the bytes of the default environment, on every thread of the
// call, and gets its own environment back.
TEST_P(SimdTarget, CallersFloatingPointModeChangesNothing) {
  Case c{QuantScheme::fp8_fp32_g32(), DType::kFloat32, 130, 2048, 2};
  c.nonfinite = true;
  // Subnormal-heavy input: every group's values a few binades apart near 2^-126.
  std::vector<uint8_t> hidden = RandomHidden(DType::kFloat32, c.T, c.H, 77);
  for (size_t i = 0; i < hidden.size(); i += 4) {
    uint32_t b;
    std::memcpy(&b, &hidden[i], 4);
    b = (b & 0x80000000u) | (b & 0x00FFFFFFu);  // exponent field 0 or 1
    std::memcpy(&hidden[i], &b, 4);
  }
  std::vector<float> w(static_cast<size_t>(c.T * c.K), 0.5f);
  std::vector<int32_t> ids(w.size(), 1);
  std::vector<uint8_t> pad(static_cast<size_t>(c.T), 0);
  // The lowest positive floors each format accepts: UE8M0's subnormal scales, and 2^-100
  // where the scale is fp32 (Validation.AmaxFloorBounds); and the floor 0, whose unit scale
  // these inputs reach (fp32 scales s <= 2^-128, per-token rows below 2^-100).
  for (const QuantScheme& q : {QuantScheme::fp8_fp32_g32().with_amax_floor(0x1p-100f), QuantScheme::mxfp8().with_amax_floor(1e-37f),
                               QuantScheme::nvfp4_per_token().with_amax_floor(0x1p-100f),
                               QuantScheme::fp8_fp32_g32().with_amax_floor(0.0f), QuantScheme::mxfp8().with_amax_floor(0.0f),
                               QuantScheme::mxfp4().with_amax_floor(0.0f),
                               QuantScheme::nvfp4_per_token().with_amax_floor(0.0f)}) {
    c.q = q;
    for (int threads : {1, 0}) {
      megamoe::set_cpu_threads(threads);
      const Outputs want = Stage(c, hidden, w, ids, pad, 1.0f);
#if defined(MEGAMOE_TEST_MXCSR)
      const unsigned csr = _mm_getcsr();
      _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ
#endif
      const int round = std::fegetround();
      std::fesetround(FE_UPWARD);
      const Outputs got = Stage(c, hidden, w, ids, pad, 1.0f);
      EXPECT_EQ(std::fegetround(), FE_UPWARD) << "the caller's rounding mode was not restored";
      std::fesetround(round);
#if defined(MEGAMOE_TEST_MXCSR)
      EXPECT_EQ(_mm_getcsr() & 0x8040u, 0x8040u) << "the caller's FTZ/DAZ bits were not restored";
      _mm_setcsr(csr);
#endif
      ExpectSame(got, want, megamoe::scheme_name(q) + " threads " + std::to_string(threads));
    }
  }
  megamoe::set_cpu_threads(0);
}

INSTANTIATE_TEST_SUITE_P(Targets, SimdTarget, ::testing::ValuesIn(Targets()), TargetParamName);

TEST(Simd, BestTargetIsDispatchedByDefault) {
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_STREQ(simd::active_target(), hwy::TargetName(Targets().front()));
  std::printf("instruction sets here: ");
  for (int64_t t : Targets()) std::printf("%s ", hwy::TargetName(t));
  std::printf("(dispatched: %s)\n", simd::active_target());
}

// ---------------------------------------------------------------------------------------
// The pool.

/// Threads of this process now (Linux: /proc/self/task; 0 elsewhere).
int ProcessThreads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

struct BigCall {
  int64_t T = 257, H = 2048, K = 4;  // 257 * 2052 elements: above the serial threshold
  std::vector<uint8_t> hidden = RandomHidden(DType::kBFloat16, T, H, 5);
  std::vector<float> w = std::vector<float>(T * K, 0.25f);
  std::vector<int32_t> ids = std::vector<int32_t>(T * K, 1);
  std::vector<uint8_t> pad = std::vector<uint8_t>(T, 0);
  Outputs Run() const {
    Case c{QuantScheme::mxfp8(), DType::kBFloat16, T, H, K};
    c.nonfinite = true;
    return Stage(c, hidden, w, ids, pad, 0.0f);
  }
};

class Pool : public ::testing::Test {
 protected:
  void TearDown() override { megamoe::set_cpu_threads(0); }
};

TEST_F(Pool, KnobResolvesAndRejects) {
  megamoe::set_cpu_threads(0);
  const int all = megamoe::cpu_threads();
  EXPECT_GE(all, 1);
  megamoe::set_cpu_threads(3);
  EXPECT_EQ(megamoe::cpu_threads(), 3);
  megamoe::set_cpu_threads(1);
  EXPECT_EQ(megamoe::cpu_threads(), 1);
  EXPECT_THROW(megamoe::set_cpu_threads(-1), megamoe::Error);
  EXPECT_THROW(megamoe::set_cpu_threads(100000), megamoe::Error);
  EXPECT_EQ(megamoe::cpu_threads(), 1);  // a rejected value changes nothing
  megamoe::set_cpu_threads(0);
  EXPECT_EQ(megamoe::cpu_threads(), all);
}

TEST_F(Pool, SameBytesForEveryThreadCountAndNoThreadPerCall) {
  const BigCall call;
  megamoe::set_cpu_threads(1);
  const Outputs want = call.Run();
  for (int n : {2, 3, 8, 0}) {
    megamoe::set_cpu_threads(n);
    ExpectSame(call.Run(), want, "threads " + std::to_string(n));
    const int before = ProcessThreads();  // workers for n exist now
    for (int i = 0; i < 5; ++i) ExpectSame(call.Run(), want, "threads " + std::to_string(n));
    EXPECT_EQ(ProcessThreads(), before) << "a call started threads (threads " << n << ")";
  }
}

TEST_F(Pool, ConcurrentCallersEachFinishTheirOwnWork) {
  megamoe::set_cpu_threads(0);
  std::vector<BigCall> calls(4);
  for (size_t i = 0; i < calls.size(); ++i) calls[i].hidden = RandomHidden(DType::kBFloat16, calls[i].T, calls[i].H, 50 + i);
  std::vector<Outputs> want;
  for (const auto& c : calls) want.push_back(c.Run());
  std::vector<std::thread> th;
  std::vector<int> ok(calls.size(), 0);
  for (size_t i = 0; i < calls.size(); ++i) {
    th.emplace_back([&, i] {
      for (int r = 0; r < 6; ++r) {
        const Outputs got = calls[i].Run();
        ok[i] += SameBits(got, want[i]);
      }
    });
  }
  for (auto& t : th) t.join();
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(ok[i], 6) << "caller " << i;
}

TEST_F(Pool, FirstExceptionReachesTheCallerAndLaterChunksAreSkipped) {
  for (int threads : {1, 2, 4}) {
    std::atomic<int> ran{0};
    try {
      megamoe::cpu::parallel_for(64, threads, [&](int64_t c) {
        ++ran;
        if (c == 0) throw std::runtime_error("chunk 0");
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      });
      ADD_FAILURE() << "no exception (threads " << threads << ")";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk 0");
    }
    EXPECT_LT(ran.load(), 64) << "chunks after the failure still ran (threads " << threads << ")";
    // The pool still works afterwards.
    std::atomic<int64_t> sum{0};
    megamoe::cpu::parallel_for(100, threads, [&](int64_t c) { sum += c; });
    EXPECT_EQ(sum.load(), 4950);
  }
}

TEST_F(Pool, NestedAndEmptyJobs) {
  megamoe::cpu::parallel_for(0, 4, [](int64_t) { FAIL(); });
  std::atomic<int64_t> sum{0};
  megamoe::cpu::parallel_for(8, 4, [&](int64_t c) {
    megamoe::cpu::parallel_for(8, 4, [&](int64_t d) { sum += c * 8 + d; });
  });
  EXPECT_EQ(sum.load(), 63 * 64 / 2);
}

}  // namespace
