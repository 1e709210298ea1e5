// Randomized staging cases. Two matrices:
//  - Matrix: every (T, H, fp8 scheme, G) of the grid below with a fixed seed per case;
//  - Formats: every activation format (fp8 under both amax floors, MXFP4 with both tie
//    rules and through the drop-in rule, NVFP4 static, per-token and online) with fresh seeds on
//    every run (MEGAMOE_TEST_SEED=<n> replays one; the seed is in every failure's trace),
//    T in 1..300, H in {128, 256, 512, 640} and now and then 7168, K in 0..9.
// Each case has its own inputs (randn * 17 at a random row scale, sprinkled edge values
// and special groups: zero, tiny, all-NaN, below the floor, +-Inf, amax exactly a power of
// two times the format's largest value, fp4 midpoints) and its own draw of dtypes,
// padding, shared_x_sf, the non-finite counter, global scale and tensor layouts. Every
// output byte, gaps and unmapped shared rows included, is compared with the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::Rounding;
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

/// The group amax that makes a format's scale exactly 1 (times a power of two): the
/// largest element value (448 for fp8, 6 for fp4), times gs for NVFP4 static.
float unit_amax(const mt::Problem& p) {
  const megamoe_ref::Format f = p.format();
  if (!f.fp4()) return 448.0f;
  return f.scale == megamoe_ref::ScaleCodec::kE4m3Static ? 6.0f * f.global_scale : 6.0f;
}

/// Fill hidden with randn * 17 (times a per-row power of two when @p row_scales), sprinkled
/// edge values and, now and then, a special group; fp4 formats also get groups of e2m1
/// midpoints (and their fp32 neighbours) at a power-of-two unit scale.
void fill_hidden(mt::Problem& p, std::mt19937& rng, bool row_scales = false) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> pct(0, 999);
  const std::vector<uint32_t> edges = edge_bits(p.hidden_dt);
  std::uniform_int_distribution<size_t> edge(0, edges.size() - 1);
  const megamoe_ref::Format f = p.format();
  const int64_t G = f.G;
  const int modes = f.fp4() ? 8 : 6;
  const float unit = unit_amax(p);
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int64_t t = 0; t < p.T; ++t) {
    // A per-row power of two, and now and then a row below the 1e-4 floor (per-token
    // scales floor the row amax) or one of 2^-100 .. 2^-134, where a floor of 0 gives
    // NVFP4 per-token rows (amax below 2^-100) and fp32 scales (s <= 2^-128) the unit scale.
    const int row_draw = row_scales ? pct(rng) : -1;
    const float row = row_draw < 0    ? 1.0f
                      : row_draw < 40 ? 1e-7f
                      : row_draw < 60 ? std::ldexp(1.0f, -100 - pct(rng) % 35)
                                      : std::ldexp(1.0f, pct(rng) % 25 - 12);
    for (int64_t g0 = 0; g0 < p.H; g0 += G) {
      const int mode = pct(rng) < 30 ? pct(rng) % modes : -1;  // ~3% of groups are special
      // Power-of-two factor for the "amax exactly unit * 2^k" groups.
      const float p2 = std::ldexp(1.0f, static_cast<int>(pct(rng) % 21) - 10);
      for (int64_t h = g0; h < g0 + G; ++h) {
        float v = nd(rng) * 17.0f * row;
        switch (mode) {
          case 0: v = 0.0f; break;                                         // zero group
          case 1: v = nd(rng) * 1e-6f; break;                              // tiny group
          case 2: v = std::numeric_limits<float>::quiet_NaN(); break;      // all NaN
          case 3: v = h == g0 ? unit * p2 : nd(rng) * unit / 4 * p2; break;  // amax unit*2^k
          case 4: v = nd(rng) * 3e-5f; break;                              // below the floor
          case 5: v = (h == g0 + G / 2) ? -std::numeric_limits<float>::infinity() : v; break;
          case 6:  // e2m1 midpoints (either sign) at unit scale 2^k
          case 7: {  // ... and their fp32 neighbours one ulp away
            const float m = mids[pct(rng) % 7] * unit / 6.0f * p2;
            const float n = mode == 7 ? std::nextafter(m, pct(rng) % 2 ? 0.0f : 2 * m) : m;
            v = h == g0 ? unit * p2 : (pct(rng) % 2 ? -n : n);
            break;
          }
          default: break;
        }
        if (mode == 3 && h != g0 && std::fabs(v) >= unit * p2) v = 0.5f * p2;
        mt::set_hidden(p, t, h, v);
        if (mode < 0 && pct(rng) < 4) mt::set_hidden_bits(p, t, h, edges[edge(rng)]);
      }
    }
  }
}

/// What a case fixes before the draws: sizes, scheme, the drop-in rule and whether the
/// wider draws of the format matrix apply (K from 0, a per-row scale, layouts of the
/// format tensors).
struct CaseSpec {
  int64_t T, H;
  QuantScheme q;
  bool dropin = false;
  bool wide = false;
};

/// Draw everything but @p cs for a case from @p seed and stage it.
void run_case(const CaseSpec& cs, uint32_t seed, const std::string& replay) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pct(0, 99);

  mt::Problem p;
  p.T = cs.T;
  p.H = cs.H;
  p.q = cs.q;
  p.fp4_dropin = cs.dropin;
  const megamoe_ref::Format f = p.format();
  p.K = cs.wide ? std::uniform_int_distribution<int64_t>(0, 9)(rng) : pick<int64_t>(rng, {1, 6, 8, 9});
  p.hidden_dt = pick(rng, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  p.ids_dt = pick(rng, {DType::kInt32, DType::kInt64});
  p.w_dt = pick(rng, {DType::kFloat32, DType::kBFloat16, DType::kFloat16});
  const int pad_mode = pct(rng) % 3;  // none, bool, uint8
  if (pad_mode != 0) p.pad_dt = pad_mode == 1 ? DType::kBool : DType::kUInt8;
  if (f.fp4()) {
    p.x_fp8_dt = pct(rng) < 50 ? DType::kUInt8 : DType::kInt8;
  } else if (pct(rng) < 30) {
    p.x_fp8_dt = DType::kUInt8;
  } else if (f.elem == megamoe_ref::Elem::kFp8E5M2) {
    p.x_fp8_dt = DType::kFloat8E5M2;
  }
  if (cs.q.ue8m0() && pct(rng) < 50) p.bm = pick<int64_t>(rng, {8, 32, 96, 128, 192});
  // NVFP4 static: ordinary calibration scales, a power of two now and then (exact unit
  // scale), rarely an extreme one.
  const int gs_draw = pct(rng);
  p.global_scale = gs_draw < 10 ? pick(rng, {0.0f, 1e-30f, 1e30f, 1e-40f})
                   : gs_draw < 40 ? std::ldexp(1.0f, pct(rng) % 31 - 20)
                                  : std::ldexp(0.5f + pct(rng) / 100.0f, pct(rng) % 21 - 14);
  if (pct(rng) < 50) p.nonfinite_init = pick<int64_t>(rng, {0, 1, -3, int64_t{1} << 40});

  p.hidden.assign(static_cast<size_t>(p.T * p.H * megamoe::dtype_size(p.hidden_dt)), 0);
  fill_hidden(p, rng, cs.wide);
  if (p.nonfinite_init) {  // a few NaN / Inf for the counter, whatever the draws gave
    for (int i = 0; i < 3; ++i) {
      const uint32_t b = pick<uint32_t>(rng, {0x7FC00000u, 0xFF800000u, 0x7F800000u});
      const uint32_t bits = p.hidden_dt == DType::kFloat32 ? b
                            : p.hidden_dt == DType::kBFloat16 ? b >> 16
                                                                : (b & 0x80000000u ? 0xFC00u : (b == 0x7FC00000u ? 0x7E00u : 0x7C00u));
      mt::set_hidden_bits(p, std::uniform_int_distribution<int64_t>(0, p.T - 1)(rng),
                          std::uniform_int_distribution<int64_t>(0, p.H - 1)(rng), bits);
    }
  }
  // NVFP4 online: one +-Inf anywhere makes gs infinite and every group degenerate, so most
  // cases keep only finite values (NaN stays: it is skipped), the rest keep the draws'.
  if (p.online_gs() && pct(rng) < 70) {
    for (int64_t t = 0; t < p.T; ++t) {
      for (int64_t h = 0; h < p.H; ++h) {
        const float v = mt::widen(p.hidden_dt, p.hidden.data() + (t * p.H + h) * megamoe::dtype_size(p.hidden_dt));
        if (std::isinf(v)) mt::set_hidden(p, t, h, std::copysign(1e3f, v));
      }
    }
  }

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
  if (cs.wide) {
    l.x_scales = pick(rng, {Layout::kContig, Layout::kNegRows, Layout::kPadded});
    l.scalars_0d = pct(rng) < 50;
  }

  std::ostringstream os;
  os << replay << "seed=" << seed << " T=" << p.T << " H=" << p.H << " " << megamoe::to_string(p.q)
     << (p.fp4_dropin ? " (MXFP4 drop-in)" : "")
     << (p.static_gs() ? " global_scale=" + std::to_string(p.global_scale) : std::string())
     << " nonfinite_count=" << (p.nonfinite_init ? std::to_string(*p.nonfinite_init) : "none")
     << " K=" << p.K << " hidden=" << megamoe::dtype_name(p.hidden_dt)
     << " ids=" << megamoe::dtype_name(p.ids_dt) << " w=" << megamoe::dtype_name(p.w_dt)
     << " is_padding=" << (p.pad_dt ? megamoe::dtype_name(*p.pad_dt) : "none")
     << " shared_block_m=" << p.bm << " x_q=" << megamoe::dtype_name(p.x_fp8_dt) << " "
     << l.describe();
  SCOPED_TRACE(os.str());
  EXPECT_TRUE(mt::stage_and_compare(p, l));
}

/// The fixed-seed fp8 grid case @p rc.
void run_random_case(const RandomCase& rc) {
  const uint32_t seed = static_cast<uint32_t>(rc.T * 1000003 + rc.H * 7919 + rc.G * 131 +
                                              (rc.ue8m0 ? 17 : 0));
  run_case({rc.T, rc.H, mt::scheme(rc.ue8m0, rc.G)}, seed, "");
}

class RandomStage : public ::testing::TestWithParam<RandomCase> {};

TEST_P(RandomStage, MatchesReferenceBitwise) { run_random_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Matrix, RandomStage, ::testing::ValuesIn(all_cases()), case_name);


// ---------------------------------------------------------------------------------------
// Every format, fresh seeds.

/// The base seed of the format matrix: MEGAMOE_TEST_SEED when set (to replay a failure),
/// else a fresh one per process.
uint32_t base_seed() {
  static const uint32_t s = [] {
    if (const char* e = std::getenv("MEGAMOE_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(e, nullptr, 0));
    return static_cast<uint32_t>(std::random_device{}());
  }();
  return s;
}

/// One format and the index of its draw.
struct FormatCase {
  std::string tag;
  QuantScheme q;
  bool dropin;
  int draw;
};

std::vector<FormatCase> format_cases() {
  std::vector<FormatCase> v;
  // The two floors engines use, 0 (the unit scale of FlashInfer's SM90 path), and (fewer
  // draws) extreme ones the scheme accepts: the smallest subnormal and another subnormal
  // (the UE8M0 formats only: their exponent clamps to byte 1), 2^-100 (the lowest positive
  // floor of fp32 scales and NVFP4 per-token), and one above most amaxes.
  const std::pair<float, int> floors[] = {{1e-4f, 10}, {1e-10f, 10}, {0.0f, 10},
                                          {std::numeric_limits<float>::denorm_min(), 2},
                                          {1e-40f, 2}, {0x1p-100f, 2}, {1e30f, 2}};
  for (const auto& [floor, draws] : floors) {
    const std::pair<QuantScheme, bool> formats[] = {
        {QuantScheme::mxfp8(), false},           {QuantScheme::fp8_ue8m0_g128(), false},
        {QuantScheme::fp8_fp32_g128(), false},   {QuantScheme::fp8_fp32_g32(), false},
        {QuantScheme::mxfp4(), false},           {QuantScheme::mxfp4(Rounding::kNearestEven), false},
        {QuantScheme::mxfp8(), true},            {QuantScheme::nvfp4_static(), false},
        {QuantScheme::nvfp4_per_token(), false}, {QuantScheme::mxfp8_e5m2(), false},
        {QuantScheme::nvfp4_online(), false}};
    for (const auto& [q0, dropin] : formats) {
      const bool fp32_scale = q0.scale == megamoe::ScaleType::kFloat32 || q0.scale2 == megamoe::Scale2::kPerToken ||
                              q0.scale2 == megamoe::Scale2::kOnline;
      if (fp32_scale && floor > 0.0f && floor < 0x1p-100f) continue;  // rejected (Validation.AmaxFloorBounds)
      const QuantScheme q = q0.with_amax_floor(floor);
      // Draws per format: enough that every tensor's layouts and every option come up.
      for (int d = 0; d < draws; ++d) v.push_back({mt::scheme_tag(q) + (dropin ? "_dropin" : ""), q, dropin, d});
    }
  }
  return v;
}

std::string format_case_name(const ::testing::TestParamInfo<FormatCase>& info) {
  return info.param.tag + "_" + std::to_string(info.param.draw);
}

class FormatStage : public ::testing::TestWithParam<FormatCase> {};

TEST_P(FormatStage, MatchesReferenceBitwise) {
  const FormatCase& fc = GetParam();
  const uint32_t seed = base_seed() ^ static_cast<uint32_t>(std::hash<std::string>{}(fc.tag) + 0x9E3779B9u * fc.draw);
  std::mt19937 rng(seed ^ 0x5bd1e995u);  // sizes from their own stream
  std::uniform_int_distribution<int> pct(0, 99);
  const int64_t T = pct(rng) < 30 ? std::uniform_int_distribution<int64_t>(1, 16)(rng)
                                  : std::uniform_int_distribution<int64_t>(1, 300)(rng);
  mt::Problem shape_probe;
  shape_probe.q = fc.q;
  shape_probe.fp4_dropin = fc.dropin;
  const int64_t G = shape_probe.format().G;
  std::vector<int64_t> hs;
  for (int64_t H : {128, 256, 512, 640}) {
    if (!shape_probe.format().packed_scales() || (H / G) % 4 == 0) hs.push_back(H);
  }
  const int64_t H = pct(rng) < 10 ? 7168 : hs[std::uniform_int_distribution<size_t>(0, hs.size() - 1)(rng)];
  const std::string replay = "MEGAMOE_TEST_SEED=" + std::to_string(base_seed()) + " (case ";
  run_case({T, H, fc.q, fc.dropin, true}, seed, replay + fc.tag + "_" + std::to_string(fc.draw) + ") ");
}

INSTANTIATE_TEST_SUITE_P(Formats, FormatStage, ::testing::ValuesIn(format_cases()), format_case_name);

}  // namespace
