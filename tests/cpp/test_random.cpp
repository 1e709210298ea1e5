// Randomized staging cases: every (T, H, scheme) of the matrix below, each with its own
// seeded inputs (randn * 17 plus sprinkled edge values and special groups) and its own
// draw of K, dtypes, padding, shared_x_sf and tensor layouts. Every output byte, gaps and
// unmapped shared rows included, is compared with the independent reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using megamoe::DType;
using mt::Layout;

struct RandomCase {
  int64_t T;
  int64_t H;
  bool ue8m0;
  int64_t G;
};

std::vector<RandomCase> all_cases() {
  std::vector<RandomCase> v;
  for (int64_t T : {1, 7, 63, 64, 65, 135, 434}) {
    for (int64_t H : {128, 256, 5120, 7168}) {
      for (bool ue8m0 : {true, false}) {
        for (int64_t G : {1, 2, 4, 8, 16, 32, 64, 128}) {
          if (ue8m0 && (H / G) % 4 != 0) continue;  // rejected; see ValidationTest
          v.push_back({T, H, ue8m0, G});
        }
      }
    }
  }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<RandomCase>& info) {
  const RandomCase& c = info.param;
  return "T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_" +
         mt::scheme_tag(mt::scheme(c.ue8m0, c.G));
}

template <typename T>
T pick(std::mt19937& rng, std::initializer_list<T> xs) {
  std::uniform_int_distribution<size_t> d(0, xs.size() - 1);
  return *(xs.begin() + d(rng));
}

/// Edge bit patterns of each hidden dtype (sprinkled into random data).
std::vector<uint32_t> edge_bits(DType dt) {
  switch (dt) {
    case DType::kBFloat16:
      return {0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x43E0 /*448*/, 0xC3E8 /*-464*/,
              0x43EB /*470*/, 0x43F0 /*480*/, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F7F,
              0x3580 /*~1e-6*/, 0x3F88 /*1.0625*/};
    case DType::kFloat16:
      return {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x5F00 /*448*/, 0xDF40 /*-464*/,
              0x5F58 /*470*/, 0x5F80 /*480*/, 0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7BFF,
              0x0011 /*~1e-6*/, 0x3C40 /*1.0625*/};
    default:
      return {0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x43E00000 /*448*/,
              0xC3E80000 /*-464*/, 0x43EB0000 /*470*/, 0x43F00000 /*480*/, 0x4E6E6B28 /*1e9*/,
              0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F7FFFFF, 0x358637BD /*1e-6*/,
              0x3F880000 /*1.0625*/, 0x3A800000 /*2^-10*/};
  }
}

/// Fill hidden with randn * 17, sprinkled edge values and, now and then, a special group.
void fill_hidden(mt::Problem& p, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> pct(0, 999);
  const std::vector<uint32_t> edges = edge_bits(p.hidden_dt);
  std::uniform_int_distribution<size_t> edge(0, edges.size() - 1);
  const int64_t G = p.q.group_k;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t g0 = 0; g0 < p.H; g0 += G) {
      const int mode = pct(rng) < 30 ? pct(rng) % 6 : -1;  // ~3% of groups are special
      // Power-of-two factor for the "amax exactly 448 * 2^k" group.
      const float p2 = std::ldexp(1.0f, static_cast<int>(pct(rng) % 21) - 10);
      for (int64_t h = g0; h < g0 + G; ++h) {
        float v = nd(rng) * 17.0f;
        switch (mode) {
          case 0: v = 0.0f; break;                                         // zero group
          case 1: v = nd(rng) * 1e-6f; break;                              // tiny group
          case 2: v = std::numeric_limits<float>::quiet_NaN(); break;      // all NaN
          case 3: v = h == g0 ? 448.0f * p2 : nd(rng) * 100.0f * p2; break;  // amax 448*2^k
          case 4: v = nd(rng) * 3e-5f; break;                              // below the floor
          case 5: v = (h == g0 + G / 2) ? -std::numeric_limits<float>::infinity() : v; break;
          default: break;
        }
        if (mode == 3 && h != g0 && std::fabs(v) >= 448.0f * p2) v = 0.5f * p2;
        mt::set_hidden(p, t, h, v);
        if (mode < 0 && pct(rng) < 4) mt::set_hidden_bits(p, t, h, edges[edge(rng)]);
      }
    }
  }
}

/// Draw everything but (T, H, scheme) for a case and stage it.
void run_random_case(const RandomCase& rc) {
  const uint32_t seed = static_cast<uint32_t>(rc.T * 1000003 + rc.H * 7919 + rc.G * 131 +
                                              (rc.ue8m0 ? 17 : 0));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pct(0, 99);

  mt::Problem p;
  p.T = rc.T;
  p.H = rc.H;
  p.q = mt::scheme(rc.ue8m0, rc.G);
  p.K = pick<int64_t>(rng, {1, 6, 8, 9});
  p.hidden_dt = pick(rng, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  p.ids_dt = pick(rng, {DType::kInt32, DType::kInt64});
  p.w_dt = pick(rng, {DType::kFloat32, DType::kBFloat16, DType::kFloat16});
  const int pad_mode = pct(rng) % 3;  // none, bool, uint8
  if (pad_mode != 0) p.pad_dt = pad_mode == 1 ? DType::kBool : DType::kUInt8;
  if (pct(rng) < 30) p.x_fp8_dt = DType::kUInt8;
  if (rc.ue8m0 && pct(rng) < 50) p.bm = pick<int64_t>(rng, {8, 32, 96, 128, 192});

  p.hidden.assign(static_cast<size_t>(p.T * p.H * megamoe::dtype_size(p.hidden_dt)), 0);
  fill_hidden(p, rng);

  // Padding mask: ~1 token in 5, nonzero bytes of any value for uint8.
  p.pad.assign(static_cast<size_t>(p.T), 0);
  if (p.pad_dt) {
    for (auto& b : p.pad) {
      if (pct(rng) < 20) b = *p.pad_dt == DType::kBool ? 1 : static_cast<uint8_t>(1 + pct(rng) * 2);
    }
  }

  // Top-k ids and weights (NaN weights on padded rows must come out +0.0f).
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t ies = megamoe::dtype_size(p.ids_dt), wes = megamoe::dtype_size(p.w_dt);
  p.ids.assign(static_cast<size_t>(p.T * p.K * ies), 0);
  p.w.assign(static_cast<size_t>(p.T * p.K * wes), 0);
  std::uniform_int_distribution<int64_t> expert(0, 383);
  for (int64_t t = 0; t < p.T; ++t) {
    const bool padded = p.pad_dt && p.pad[t] != 0;
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t i = t * p.K + k;
      int64_t id = expert(rng);
      const int r = pct(rng);
      if (p.ids_dt == DType::kInt32) {
        if (r < 2) id = pick<int64_t>(rng, {-1, std::numeric_limits<int32_t>::min(),
                                            std::numeric_limits<int32_t>::max()});
        const int32_t v = static_cast<int32_t>(id);
        std::memcpy(p.ids.data() + i * 4, &v, 4);
      } else {
        if (r < 2) id = pick<int64_t>(rng, {-7, int64_t{1} << 40, std::numeric_limits<int64_t>::max()});
        std::memcpy(p.ids.data() + i * 8, &id, 8);
      }
      float wv = std::fabs(nd(rng));
      if (padded && pct(rng) < 50) wv = std::numeric_limits<float>::quiet_NaN();
      mt::narrow(p.w_dt, wv, p.w.data() + i * wes);
      // Edge weights, copied through bit-exactly (fp16 NaN widening is left out: SPEC
      // does not pin its payload).
      if (!padded && r >= 98) {
        if (p.w_dt == DType::kFloat32) {
          const uint32_t b = pick<uint32_t>(rng, {0x7FC00000u, 0xFFC00001u, 0x80000000u, 0x00000001u, 0x7F800000u});
          std::memcpy(p.w.data() + i * 4, &b, 4);
        } else {
          const uint16_t b = p.w_dt == DType::kBFloat16 ? pick<uint16_t>(rng, {0x7FC1, 0x8000, 0x0001, 0xFF80})
                                                        : pick<uint16_t>(rng, {0x8000, 0x0001, 0x7C00, 0x03FF});
          std::memcpy(p.w.data() + i * 2, &b, 2);
        }
      }
    }
  }

  mt::Layouts l;
  const auto any2d = {Layout::kContig, Layout::kPadded, Layout::kTransposed, Layout::kNegRows,
                      Layout::kNegCols, Layout::kStride2};
  auto draw = [&](bool contig_often) {
    if (contig_often && pct(rng) < 40) return Layout::kContig;
    std::uniform_int_distribution<size_t> d(0, any2d.size() - 1);
    return *(any2d.begin() + d(rng));
  };
  l.hidden = draw(true);
  l.ids = draw(false);
  l.w = draw(false);
  l.pad = draw(false);
  l.x_q = draw(true);
  l.x_sf = pct(rng) < 25 ? Layout::kMnMajor4 : draw(true);
  l.idx = draw(false);
  l.wout = draw(false);
  l.shared = pct(rng) < 40 ? Layout::kTransposed : pct(rng) < 50 ? Layout::kMnMajor4 : draw(true);
  l.misalign_in = pct(rng) < 25;
  l.misalign_out = pct(rng) < 25;
  l.shared_extra_rows = pct(rng) % 5;

  std::ostringstream os;
  os << "seed=" << seed << " T=" << p.T << " H=" << p.H << " " << megamoe::to_string(p.q)
     << " K=" << p.K << " hidden=" << megamoe::dtype_name(p.hidden_dt)
     << " ids=" << megamoe::dtype_name(p.ids_dt) << " w=" << megamoe::dtype_name(p.w_dt)
     << " is_padding=" << (p.pad_dt ? megamoe::dtype_name(*p.pad_dt) : "none")
     << " shared_block_m=" << p.bm << " x_q=" << megamoe::dtype_name(p.x_fp8_dt) << " "
     << l.describe();
  SCOPED_TRACE(os.str());
  EXPECT_TRUE(mt::stage_and_compare(p, l));
}

class RandomStage : public ::testing::TestWithParam<RandomCase> {};

TEST_P(RandomStage, MatchesReferenceBitwise) { run_random_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Matrix, RandomStage, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace
