// DeepGEMM's MegaMoE symmetric buffers (include/megamoe/buffers.h): the layouts against an
// independent rendering of DeepGEMM's formulas (tests/reference/deepgemm_buffer_reference.h,
// recorded from DeepGEMM 0274ad7b and, for the ring layout, DeepGEMM main 54e2261) over a
// sweep of shapes and the worked examples of the research notes; regions that tile the
// buffer in DeepGEMM's order; every precondition's rejection; the block-size rule against its
// own rendering; and full-buffer staging on the CPU into a buffer's input views.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "deepgemm_buffer_reference.h"
#include "megamoe/megamoe.h"

namespace {

namespace dg = megamoe::deepgemm;
using dg::MmaType;
using dg::Variant;
using megamoe::DType;
using megamoe::TensorRef;

dg::BufferArgs args(Variant v, int64_t R, int64_t E, int64_t T, int64_t K, int64_t H, int64_t IH) {
  dg::BufferArgs a;
  a.variant = v;
  a.num_ranks = R;
  a.num_experts = E;
  a.num_max_tokens_per_rank = T;
  a.num_topk = K;
  a.hidden = H;
  a.intermediate_hidden = IH;
  return a;
}
dg::BufferArgs sm100(int64_t R, int64_t E, int64_t T, int64_t K, int64_t H, int64_t IH, int64_t S, MmaType m,
                     int64_t sms) {
  dg::BufferArgs a = args(Variant::kSm100, R, E, T, K, H, IH);
  a.num_shared_experts = S;
  a.mma_type = m;
  a.num_sms = sms;
  return a;
}
dg::BufferArgs ring(int64_t R, int64_t E, int64_t T, int64_t K, int64_t H, int64_t IH, MmaType m, int64_t n = 0) {
  dg::BufferArgs a = args(Variant::kSm100Ring, R, E, T, K, H, IH);
  a.mma_type = m;
  a.num_ring_tokens = n;
  return a;
}

const MmaType kMmas[] = {MmaType::kFp8xFp4, MmaType::kFp8xFp8, MmaType::kBf16xBf16, MmaType::kFp4xFp4};

/// The layout equals the reference: every region's name, offset and bytes, and the totals.
void expect_equal(const dg::BufferLayout& l, const dgref::Ref& r, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(l.num_max_tokens, r.T);
  EXPECT_EQ(l.num_ring_tokens, r.ring);
  EXPECT_EQ(l.num_sf_ring_tokens, r.sf_ring);
  EXPECT_EQ(l.num_max_pool_tokens, r.pool);
  EXPECT_EQ(l.num_shared_sf_tokens, r.shared_sf);
  EXPECT_EQ(l.workspace_bytes, r.workspace);
  EXPECT_EQ(l.nbytes, r.total);
  ASSERT_EQ(l.regions.size(), r.pieces.size());
  for (size_t i = 0; i < r.pieces.size(); ++i) {
    EXPECT_EQ(l.regions[i].name, r.pieces[i].name) << i;
    EXPECT_EQ(l.regions[i].offset, r.pieces[i].offset) << r.pieces[i].name;
    EXPECT_EQ(l.regions[i].nbytes, r.pieces[i].bytes) << r.pieces[i].name;
  }
}

/// The regions tile [0, nbytes) in order, each view covers its region exactly, the K-major
/// views are row-major and the ring scale views MN-major, and the inputs are the five
/// staging fills.
void expect_well_formed(const dg::BufferLayout& l) {
  int64_t end = 0;
  std::set<std::string> inputs;
  for (const dg::Region& r : l.regions) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(r.offset, end);
    end += r.nbytes;
    int64_t elems = r.shape[0] * (r.ndim == 2 ? r.shape[1] : 1);
    EXPECT_EQ(elems * megamoe::dtype_size(r.dtype), r.nbytes);
    EXPECT_EQ(r.offset % megamoe::dtype_size(r.dtype), 0);
    const bool mn = r.name.size() > 3 && r.name.compare(r.name.size() - 3, 3, "_sf") == 0 && r.name != "x_sf";
    if (r.ndim == 2 && mn) {
      EXPECT_EQ(r.strides[0], 1);
      EXPECT_EQ(r.strides[1], r.shape[0]);
    } else if (r.ndim == 2) {
      EXPECT_EQ(r.strides[0], r.shape[1]);
      EXPECT_EQ(r.strides[1], 1);
    } else {
      EXPECT_EQ(r.strides[0], 1);
    }
    if (r.role == dg::Role::kInput) inputs.insert(r.name);
    EXPECT_EQ(r.sliced, r.name != "workspace" && r.name != "combine" && r.name != "l1_topk_weights" &&
                            r.name != "routed_topk_weights");
  }
  EXPECT_EQ(end, l.nbytes);
  const std::set<std::string> want = {"x", "x_sf", "topk_idx", "topk_weights", "shared_l1_acts_sf"};
  for (const std::string& n : inputs) EXPECT_TRUE(want.count(n)) << n;
  EXPECT_TRUE(inputs.count("x") && inputs.count("topk_idx") && inputs.count("topk_weights"));
  EXPECT_EQ(l.regions.front().name, "workspace");
  // The combine buffer closes the buffer (it has no bytes, and is not listed, without tokens).
  EXPECT_EQ(l.regions.back().name, l.num_max_tokens > 0 && l.args.num_topk > 0 ? "combine" : l.regions.back().name);
}

int64_t offset_of(const dg::BufferLayout& l, const char* name) {
  const dg::Region* r = l.find(name);
  return r == nullptr ? -1 : r->offset;
}

// ---------------------------------------------------------------------------------------
// The worked examples (R = 1, E = 256, K = 6, H = 4096, IH = 2048, 512 tokens), recorded from
// DeepGEMM 0274ad7b's formulas (the ring layout's from DeepGEMM main 54e2261) in the research
// notes' re-derivation.

TEST(DeepGemmBuffers, WorkedExampleSm100Fp8xFp4SharedExpert) {
  const dg::BufferLayout l = dg::buffer_layout(sm100(1, 256, 512, 6, 4096, 2048, 1, MmaType::kFp8xFp4, 148));
  EXPECT_EQ(l.num_max_tokens, 1920);
  EXPECT_EQ(l.num_ring_tokens, 3840);
  EXPECT_EQ(l.num_sf_ring_tokens, 61440);
  EXPECT_EQ(l.num_max_pool_tokens, 72960);
  EXPECT_EQ(l.num_shared_sf_tokens, 30720);
  EXPECT_EQ(l.workspace_bytes, 28176768);
  EXPECT_EQ(l.nbytes, 191760768);
  EXPECT_EQ(offset_of(l, "x"), 28176768);
  EXPECT_EQ(offset_of(l, "x_sf"), 36041088);
  EXPECT_EQ(offset_of(l, "topk_idx"), 36286848);
  EXPECT_EQ(offset_of(l, "topk_weights"), 36379008);
  EXPECT_EQ(offset_of(l, "shared_l1_acts_sf"), 36425088);
  EXPECT_EQ(offset_of(l, "shared_l2_acts"), 40357248);
  EXPECT_EQ(offset_of(l, "l1_acts"), 46255488);
  EXPECT_EQ(offset_of(l, "l1_acts_sf"), 61984128);
  EXPECT_EQ(offset_of(l, "l2_acts"), 69863808);
  EXPECT_EQ(offset_of(l, "combine"), 81660288);
  EXPECT_EQ(offset_of(l, "routed_topk_weights"), -1);  // 0 bytes outside NVFP4
  const dg::Region& sh = *l.find("shared_l1_acts_sf");
  EXPECT_EQ(sh.shape[0], 30720);
  EXPECT_EQ(sh.shape[1], 32);
  EXPECT_EQ(sh.strides[0], 1);
  EXPECT_EQ(sh.strides[1], 30720);
  expect_well_formed(l);
}

TEST(DeepGemmBuffers, WorkedExampleSm100Nvfp4SharedExpert) {
  const dg::BufferLayout l = dg::buffer_layout(sm100(1, 256, 512, 6, 4096, 2048, 1, MmaType::kFp4xFp4, 148));
  EXPECT_EQ(l.num_ring_tokens, 3840);
  EXPECT_EQ(l.num_shared_sf_tokens, 0);  // bf16 shared experts, no scales
  EXPECT_EQ(l.nbytes, 186384768);
  EXPECT_EQ(offset_of(l, "routed_topk_weights"), 28176768);
  EXPECT_EQ(offset_of(l, "x"), 28468608);
  EXPECT_EQ(offset_of(l, "x_sf"), 32400768);
  EXPECT_EQ(offset_of(l, "topk_idx"), 32892288);
  EXPECT_EQ(offset_of(l, "shared_l2_acts"), 33030528);
  EXPECT_EQ(offset_of(l, "l1_acts"), 40894848);
  EXPECT_EQ(offset_of(l, "l2_acts"), 64487808);
  EXPECT_EQ(offset_of(l, "combine"), 76284288);
  EXPECT_EQ(offset_of(l, "shared_l1_acts_sf"), -1);
  EXPECT_EQ(offset_of(l, "l1_topk_weights"), -1);
  const dg::Region& x = *l.find("x");
  EXPECT_EQ(x.dtype, DType::kUInt8);
  EXPECT_EQ(x.shape[1], 2048);
  EXPECT_EQ(l.find("x_sf")->shape[1], 64);
  EXPECT_EQ(l.find("shared_l2_acts")->dtype, DType::kBFloat16);
  expect_well_formed(l);
}

TEST(DeepGemmBuffers, WorkedExampleSm90Fp8) {
  const dg::BufferLayout l = dg::buffer_layout(args(Variant::kSm90Fp8, 1, 256, 512, 6, 4096, 2048));
  EXPECT_EQ(l.num_max_tokens, 512);
  EXPECT_EQ(l.num_max_pool_tokens, 65280);
  EXPECT_EQ(l.num_sf_ring_tokens, 130560);
  EXPECT_EQ(l.workspace_bytes, 26642816);
  EXPECT_EQ(l.nbytes, 488772992);
  EXPECT_EQ(offset_of(l, "x"), 26642816);
  EXPECT_EQ(offset_of(l, "x_sf"), 28739968);
  EXPECT_EQ(offset_of(l, "topk_idx"), 28805504);
  EXPECT_EQ(offset_of(l, "topk_weights"), 28830080);
  EXPECT_EQ(offset_of(l, "l1_acts_sf"), 296229248);
  EXPECT_EQ(offset_of(l, "l2_acts_sf"), 446895488);
  EXPECT_EQ(offset_of(l, "combine"), 463607168);
  const dg::Region& sf = *l.find("x_sf");
  EXPECT_EQ(sf.dtype, DType::kFloat32);
  EXPECT_EQ(sf.shape[1], 32);
  EXPECT_EQ(l.find("l2_acts_sf")->shape[1], 32);  // IH / 64
  expect_well_formed(l);
}

TEST(DeepGemmBuffers, WorkedExampleRingLayout) {
  const dg::BufferLayout l = dg::buffer_layout(ring(1, 256, 512, 6, 4096, 2048, MmaType::kFp8xFp4));
  EXPECT_EQ(l.num_max_tokens, 768);
  EXPECT_EQ(l.num_ring_tokens, 102912);
  EXPECT_EQ(l.num_sf_ring_tokens, 1646592);
  EXPECT_EQ(l.num_max_pool_tokens, 53760);
  EXPECT_EQ(l.workspace_bytes, 1643552);
  EXPECT_EQ(l.nbytes, 991540256);
  EXPECT_EQ(offset_of(l, "x"), 1643552);
  EXPECT_EQ(offset_of(l, "x_sf"), 4789280);
  EXPECT_EQ(offset_of(l, "topk_idx"), 4887584);
  EXPECT_EQ(offset_of(l, "topk_weights"), 4924448);
  EXPECT_EQ(offset_of(l, "combine"), 953791520);
  expect_well_formed(l);
}

TEST(DeepGemmBuffers, SignalBlockIsDeepGemmsStruct) {
  // The workspace of an empty configuration is the signal block alone (rounded to 16).
  EXPECT_EQ(sizeof(dgref::Signals), 25335168u);
  const dg::BufferLayout l = dg::buffer_layout(sm100(1, 0, 0, 0, 256, 128, 0, MmaType::kFp8xFp4, 2));
  EXPECT_EQ(l.workspace_bytes, 25335168);
}

// ---------------------------------------------------------------------------------------
// The sweep

TEST(DeepGemmBuffers, Sm100MatchesTheReferenceOverASweep) {
  int n = 0;
  for (MmaType m : kMmas) {
    const bool fp4 = m == MmaType::kFp4xFp4;
    for (int64_t R : {1, 2, 8, 72}) {
      for (int64_t er : {1, 3, 8, 32}) {
        const int64_t E = R * er;
        if (E > 2048) continue;
        for (int64_t T : {0, 1, 77, 1920, 4097}) {
          for (int64_t K : {1, 6, 9}) {
            for (int64_t H : {fp4 ? 512 : 256, 4096, 7168}) {
              for (int64_t IH : {fp4 ? 512 : 128, 2048, 3072}) {
                for (int64_t S : {0, 1, 2}) {
                  for (int64_t sms : {2, 132, 148}) {
                    if ((n++ % 7) != 0) continue;  // a seventh of the grid, evenly spread
                    const dgref::Ref want = dgref::sm100(R, E, T, K, H, IH, S, dg::to_string(m), sms);
                    if (want.ring > (1 << 23)) {  // past the workspace's ring signals
                      EXPECT_THROW(dg::buffer_layout(sm100(R, E, T, K, H, IH, S, m, sms)), megamoe::Error);
                      continue;
                    }
                    const dg::BufferLayout l = dg::buffer_layout(sm100(R, E, T, K, H, IH, S, m, sms));
                    expect_equal(l, want,
                                 std::string(dg::to_string(m)) + " R" + std::to_string(R) + " E" + std::to_string(E) +
                                     " T" + std::to_string(T) + " K" + std::to_string(K) + " H" + std::to_string(H) +
                                     " IH" + std::to_string(IH) + " S" + std::to_string(S) + " sms" +
                                     std::to_string(sms));
                    expect_well_formed(l);
                    if (HasFailure()) return;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(DeepGemmBuffers, Sm90MatchesTheReferenceOverASweep) {
  for (int64_t R : {1, 2, 4, 72}) {
    for (int64_t er : {1, 2, 8, 28}) {
      for (int64_t T : {1, 127, 128, 129, 4096, 8000}) {
        for (int64_t K : {1, 6, 8, 40}) {
          for (int64_t H : {256, 4096, 7168}) {
            for (int64_t IH : {128, 1536, 2048}) {
              const int64_t E = R * er;
              const dgref::Ref want = dgref::sm90(R, E, T, K, H, IH);
              if (want.pool > (1 << 23)) {  // past the workspace's ring signals
                EXPECT_THROW(dg::buffer_layout(args(Variant::kSm90Fp8, R, E, T, K, H, IH)), megamoe::Error);
                continue;
              }
              const dg::BufferLayout l = dg::buffer_layout(args(Variant::kSm90Fp8, R, E, T, K, H, IH));
              expect_equal(l, want,
                           "R" + std::to_string(R) + " E" + std::to_string(E) + " T" + std::to_string(T) + " K" +
                               std::to_string(K) + " H" + std::to_string(H) + " IH" + std::to_string(IH));
              expect_well_formed(l);
              if (HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST(DeepGemmBuffers, RingLayoutMatchesTheReferenceOverASweep) {
  for (MmaType m : {MmaType::kFp8xFp4, MmaType::kBf16xBf16}) {
    for (int64_t R : {1, 2, 8}) {
      for (int64_t er : {1, 4, 32}) {
        for (int64_t T : {0, 1, 384, 1000, 6144}) {
          for (int64_t K : {1, 6}) {
            for (int64_t H : {512, 7168}) {
              for (int64_t IH : {512, 3072}) {
                const int64_t E = R * er;
                const dgref::Ref want = dgref::sm100_ring(R, E, T, K, H, IH, dg::to_string(m), 0);
                const std::string what = std::string(dg::to_string(m)) + " R" + std::to_string(R) + " E" +
                                         std::to_string(E) + " T" + std::to_string(T) + " K" + std::to_string(K);
                expect_equal(dg::buffer_layout(ring(R, E, T, K, H, IH, m)), want, what + " default ring");
                // A caller's ring: the smallest DeepGEMM accepts.
                const int64_t lo = dgref::up(T, 384) * R;
                expect_equal(dg::buffer_layout(ring(R, E, T, K, H, IH, m, lo)),
                             dgref::sm100_ring(R, E, T, K, H, IH, dg::to_string(m), lo), what + " smallest ring");
                expect_well_formed(dg::buffer_layout(ring(R, E, T, K, H, IH, m)));
                if (HasFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

TEST(DeepGemmBuffers, RegionsByVariant) {
  auto names = [](const dg::BufferLayout& l) {
    std::vector<std::string> out;
    for (const dg::Region& r : l.regions) out.push_back(r.name);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(dg::buffer_layout(args(Variant::kSm90Fp8, 1, 8, 64, 4, 256, 128))),
            (V{"workspace", "x", "x_sf", "topk_idx", "topk_weights", "l1_acts", "l1_acts_sf", "l1_topk_weights",
               "l2_acts", "l2_acts_sf", "combine"}));
  EXPECT_EQ(names(dg::buffer_layout(sm100(1, 8, 64, 4, 256, 128, 1, MmaType::kFp8xFp8, 132))),
            (V{"workspace", "x", "x_sf", "topk_idx", "topk_weights", "shared_l1_acts_sf", "shared_l2_acts",
               "shared_l2_acts_sf", "l1_acts", "l1_acts_sf", "l1_topk_weights", "l2_acts", "l2_acts_sf", "combine"}));
  EXPECT_EQ(names(dg::buffer_layout(sm100(1, 8, 64, 4, 256, 128, 2, MmaType::kBf16xBf16, 132))),
            (V{"workspace", "x", "topk_idx", "topk_weights", "shared_l2_acts", "l1_acts", "l1_topk_weights", "l2_acts",
               "combine"}));
  EXPECT_EQ(names(dg::buffer_layout(sm100(1, 8, 64, 4, 512, 512, 0, MmaType::kFp4xFp4, 132))),
            (V{"workspace", "routed_topk_weights", "x", "x_sf", "topk_idx", "topk_weights", "l1_acts", "l1_acts_sf",
               "l2_acts", "l2_acts_sf", "combine"}));
  EXPECT_EQ(names(dg::buffer_layout(ring(1, 8, 64, 4, 512, 512, MmaType::kBf16xBf16))),
            (V{"workspace", "x", "topk_idx", "topk_weights", "l1_acts", "l1_topk_weights", "l2_acts", "combine"}));
  // The combine buffer has a slot for the shared experts' output.
  const dg::BufferLayout l = dg::buffer_layout(sm100(1, 8, 64, 4, 256, 128, 1, MmaType::kFp8xFp4, 132));
  EXPECT_EQ(l.find("combine")->shape[0], 5 * l.num_max_tokens);
  EXPECT_EQ(l.find("shared_l2_acts")->shape[1], 128);
  EXPECT_EQ(l.find("shared_l2_acts_sf")->shape[1], 1);
}

// ---------------------------------------------------------------------------------------
// Rejections: every rule DeepGEMM asserts, named.

void expect_rejected(const dg::BufferArgs& a, const std::string& arg, const std::string& rule) {
  try {
    dg::buffer_layout(a);
    ADD_FAILURE() << "accepted; expected a rejection naming " << arg << " and " << rule;
  } catch (const megamoe::Error& e) {
    EXPECT_EQ(e.code(), megamoe::ErrorCode::kInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("megamoe: " + arg + ": expected"), std::string::npos) << m;
    EXPECT_NE(m.find(rule), std::string::npos) << m;
  }
}

TEST(DeepGemmBuffers, RejectsWhatDeepGemmAsserts) {
  const dg::BufferArgs s90 = args(Variant::kSm90Fp8, 2, 16, 256, 6, 1024, 512);
  const dg::BufferArgs s100 = sm100(2, 16, 256, 6, 1024, 512, 1, MmaType::kFp8xFp4, 132);
  const dg::BufferArgs s100r = ring(2, 16, 256, 6, 1024, 512, MmaType::kFp8xFp4);
  for (const dg::BufferArgs& base : {s90, s100, s100r}) {
    SCOPED_TRACE(dg::to_string(base.variant));
    ASSERT_NO_THROW(dg::buffer_layout(base));
    dg::BufferArgs a = base;
    a.num_experts = 15;
    expect_rejected(a, "num_experts", "num_experts % num_ranks == 0");
    a = base;
    a.num_ranks = 0;
    expect_rejected(a, "num_ranks", "an int in [1, 2147483647]");
    a = base;
    a.num_topk = -1;
    expect_rejected(a, "num_topk", "an int in [0, 2147483647]");
    a = base;
    a.hidden = 0;
    expect_rejected(a, "hidden", "an int in [1, 2147483647]");
    a = base;
    a.intermediate_hidden = int64_t{1} << 31;
    expect_rejected(a, "intermediate_hidden", "DeepGEMM takes it as int");
    a = base;
    a.num_max_tokens_per_rank = -5;
    expect_rejected(a, "num_max_tokens_per_rank", "an int in [0, 2147483647]");
  }
  // SM90
  dg::BufferArgs a = s90;
  a.num_shared_experts = 1;
  expect_rejected(a, "num_shared_experts", "SM90 FP8 MegaMoE has no shared experts");
  a = s90;
  a.activation = dg::Activation::kSitu;
  expect_rejected(a, "activation", "supports the swiglu activation only");
  a = s90;
  a.num_max_tokens_per_rank = 0;
  expect_rejected(a, "num_max_tokens_per_rank", "num_max_tokens_per_rank > 0");
  a = s90;
  a.hidden = 128 * 3;
  expect_rejected(a, "hidden", "positive multiple of 256 for combine vectorization");
  a = s90;
  a.intermediate_hidden = 64;
  expect_rejected(a, "intermediate_hidden", "positive multiple of 128");
  a = s90;
  a.num_ranks = 73;
  a.num_experts = 73;
  expect_rejected(a, "num_ranks", "num_ranks <= kNumMaxRanks");
  a = s90;
  a.num_experts = 2050;
  expect_rejected(a, "num_experts", "num_experts <= kNumMaxExperts");
  a = s90;
  a.num_ranks = 1;
  a.num_experts = 514;
  expect_rejected(a, "num_experts", "num_experts_per_rank <= kNumMaxExpertsPerRank");
  a = s90;
  a.num_max_tokens_per_rank = 262144 + 1;
  expect_rejected(a, "num_max_tokens_per_rank", "kNumMaxSharedL2Blocks");
  a = s90;  // a pool past the ring signals: 72 ranks x 16384 tokens x top-8
  a.num_ranks = 72;
  a.num_experts = 72 * 8;
  a.num_max_tokens_per_rank = 16384;
  a.num_topk = 8;
  expect_rejected(a, "num_ring_tokens", "num_ring_tokens <= kNumMaxRingBlocks * 8");
  a = s90;
  a.num_topk = int64_t{1} << 29;
  expect_rejected(a, "num_topk", "num_topk * 8 to fit DeepGEMM's uint32");
  // SM100
  a = s100;
  a.num_shared_experts = -1;
  expect_rejected(a, "num_shared_experts", "an int in [0, 2147483647]");
  a = s100;
  a.activation = dg::Activation::kSitu;
  a.mma_type = MmaType::kFp8xFp8;
  expect_rejected(a, "activation", "only FP8xFP4 MegaMoE supports situ");
  a.mma_type = MmaType::kFp8xFp4;
  EXPECT_NO_THROW(dg::buffer_layout(a));
  for (int64_t sms : {0, 1, 131, -2}) {
    a = s100;
    a.num_sms = sms;
    expect_rejected(a, "num_sms", "kNumSMs % 2 == 0");
  }
  a = s100;
  a.intermediate_hidden = 64;
  expect_rejected(a, "intermediate_hidden", "(intermediate_hidden * 2) % 256 == 0");
  a = s100;
  a.hidden = 128;
  expect_rejected(a, "hidden", "hidden % 256 == 0");
  a = s100;
  a.num_ranks = 80;
  a.num_experts = 80;
  expect_rejected(a, "num_ranks", "num_ranks <= kNumMaxRanks");
  a = s100;
  a.num_max_tokens_per_rank = 262145;
  expect_rejected(a, "num_max_tokens_per_rank", "kNumMaxSharedL2Blocks");
  a = s100;  // a ring past the ring signals: with H = 56 x IH the live blocks grow with the pool
  a.num_ranks = 72;
  a.num_experts = 72 * 8;
  a.num_max_tokens_per_rank = 16384;
  a.num_topk = 8;
  a.hidden = 7168;
  a.intermediate_hidden = 128;
  a.num_shared_experts = 0;
  a.num_sms = 148;
  expect_rejected(a, "num_ring_tokens", "num_ring_tokens <= kNumMaxRingBlocks * 8");
  a = s100;
  a.mma_type = MmaType::kFp4xFp4;
  a.hidden = 768;
  expect_rejected(a, "hidden", "NVFP4: hidden % 512 == 0");
  a = s100;
  a.mma_type = MmaType::kFp4xFp4;
  a.intermediate_hidden = 640;
  expect_rejected(a, "intermediate_hidden", "NVFP4: intermediate_hidden % 512 == 0");
  a = s100;
  a.num_shared_experts = 1 << 23;  // 512 * 2^23 = 2^32
  expect_rejected(a, "num_shared_experts", "intermediate_hidden * num_shared_experts to fit DeepGEMM's int");
  a = s100;  // M blocks * (2 IH / 256) past int
  a.num_ranks = 8;
  a.num_experts = 512;
  a.num_max_tokens_per_rank = 65536;
  a.num_topk = 8;
  a.intermediate_hidden = 1 << 20;
  a.num_shared_experts = 0;
  expect_rejected(a, "intermediate_hidden", "to fit DeepGEMM's int");
  a = s100;
  a.variant = static_cast<Variant>(7);
  expect_rejected(a, "variant", "sm90_fp8, sm100 or sm100_ring");
  a = s100;
  a.mma_type = static_cast<MmaType>(9);
  expect_rejected(a, "mma_type", "fp8xfp4, fp8xfp8, bf16xbf16 or fp4xfp4");
  // The ring layout
  a = s100r;
  a.num_shared_experts = 1;
  expect_rejected(a, "num_shared_experts", "ring layout has no shared experts");
  a = s100r;
  a.activation = dg::Activation::kSitu;
  expect_rejected(a, "activation", "activation == \"swiglu\"");
  a = s100r;
  a.num_ring_tokens = 384 * 3 + 1;
  expect_rejected(a, "num_ring_tokens", "num_ring_tokens % kLCMCandidateBlockM == 0");
  a = s100r;
  a.num_ring_tokens = 384;  // below T * R = 768
  expect_rejected(a, "num_ring_tokens", "within [768, ");
  a = s100r;
  a.num_ring_tokens = 384 * 1000;
  expect_rejected(a, "num_ring_tokens", "get_ring_limit_for_mega_moe");
  a = s100r;
  a.num_ring_tokens = -384;
  expect_rejected(a, "num_ring_tokens", "an int in [0, 2147483647]");
  for (MmaType m : {MmaType::kFp8xFp8, MmaType::kFp4xFp4}) {
    a = s100r;
    a.mma_type = m;
    expect_rejected(a, "mma_type", "fp8xfp4 or bf16xbf16 (DeepGEMM's ring layout)");
  }
  a = s100r;
  a.hidden = 1000;  // 1000 bytes a token
  expect_rejected(a, "hidden", "a token row of a multiple of 16 bytes");
  a = s100r;
  a.mma_type = MmaType::kBf16xBf16;
  a.hidden = 1004;  // 2008 bytes a bf16 token
  expect_rejected(a, "hidden", "a token row of a multiple of 16 bytes");
  a = s100r;
  a.intermediate_hidden = 520;
  expect_rejected(a, "intermediate_hidden", "a token row of a multiple of 16 bytes");
  a = s100r;
  a.hidden = 256;  // 8 scale bytes a token
  expect_rejected(a, "hidden", "a scale row of a multiple of 16 bytes");
  a = s100r;
  a.intermediate_hidden = 256;
  expect_rejected(a, "intermediate_hidden", "a scale row of a multiple of 16 bytes");
  a = s100r;
  a.hidden = 528;  // 16-byte rows and 16 scale bytes (528 / 32 rounds down), not 128 columns
  expect_rejected(a, "hidden", "hidden % 128 == 0");
  a = s100r;
  a.intermediate_hidden = 528;
  expect_rejected(a, "intermediate_hidden", "intermediate_hidden % 128 == 0");
  a = s100r;  // bf16 reads no scale rule
  a.mma_type = MmaType::kBf16xBf16;
  a.hidden = 264;
  a.intermediate_hidden = 8;
  EXPECT_NO_THROW(dg::buffer_layout(a));
  a = s100r;  // the source token-topk table past uint32
  a.num_ranks = 64;
  a.num_experts = 64 * 64;
  a.num_max_tokens_per_rank = 384 * 60;
  a.num_topk = 1;
  expect_rejected(a, "num_max_tokens_per_rank", "num_experts * num_ranks * num_max_tokens_per_rank to fit");
  a = s100r;
  a.num_ranks = 1;
  a.num_experts = 4;
  a.num_max_tokens_per_rank = int64_t{1} << 30;
  expect_rejected(a, "num_max_tokens_per_rank", "to fit DeepGEMM's int");
}

// ---------------------------------------------------------------------------------------
// The block size of a call

TEST(DeepGemmBuffers, BlockMFollowsDeepGemmsLadder) {
  // Hand-computed: e = tokens * R * K / E, c = e + sqrt(e).
  EXPECT_EQ(dg::block_m(1, 256, 1920, 0, 6), 16);       // no tokens
  EXPECT_EQ(dg::block_m(1, 256, 1920, 64, 6), 16);      // e = 1.5
  EXPECT_EQ(dg::block_m(1, 256, 1920, 512, 6), 32);     // e = 12
  EXPECT_EQ(dg::block_m(1, 256, 1920, 1024, 6), 32);    // e = 24: not above 24
  EXPECT_EQ(dg::block_m(1, 256, 1920, 1280, 6), 64);    // e = 30, c = 35.5
  EXPECT_EQ(dg::block_m(1, 256, 1920, 4096, 6), 128);   // e = 96, c = 105.8
  EXPECT_EQ(dg::block_m(1, 256, 1920, 7168, 6), 192);   // e = 168, c = 181.0
  EXPECT_EQ(dg::block_m(1, 8, 1920, 320, 6), 128);      // e = 240, c = 255.5: 2 blocks, 2 x 128 >= c
  EXPECT_EQ(dg::block_m(1, 8, 1920, 253, 6), 128);      // e = 189.75, c = 203.5: 1 block, made 2 (8 experts < 14)
  EXPECT_EQ(dg::block_m(1, 16, 1920, 507, 6), 240);     // e = 190.1, c = 203.9: 1 block (16 experts a rank)
  EXPECT_EQ(dg::block_m(1, 256, 1920, 40960, 6), 240);  // e = 960, c = 991: 5 blocks, 5 x 192 < 991
  // The MMA type and the buffer's token count do not enter.
  for (MmaType m : kMmas) EXPECT_EQ(dg::block_m(2, 64, 0, 1000, 8, m), dgref::block_m(2, 64, 1000, 8));
}

TEST(DeepGemmBuffers, BlockMMatchesTheReference) {
  for (int64_t R : {1, 2, 8, 64}) {
    for (int64_t E : {8, 64, 256, 384}) {
      if (E % R) continue;
      for (int64_t K : {1, 6, 8}) {
        for (int64_t t = 0; t <= 20000; t += (t < 3000 ? 1 : 37)) {
          ASSERT_EQ(dg::block_m(R, E, 1920, t, K), dgref::block_m(R, E, t, K)) << R << " " << E << " " << K << " " << t;
        }
      }
    }
  }
}

TEST(DeepGemmBuffers, BlockMRejections) {
  auto rejected = [](std::function<void()> f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << text;
    } catch (const megamoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  rejected([] { dg::block_m(0, 8, 0, 1, 1); }, "megamoe: num_ranks: expected an int in [1,");
  rejected([] { dg::block_m(1, 0, 0, 1, 1); }, "megamoe: num_experts: expected an int in [1,");
  rejected([] { dg::block_m(1, 8, 0, -1, 1); }, "megamoe: num_tokens: expected an int in [0,");
  rejected([] { dg::block_m(1, 8, 0, 1, -1); }, "megamoe: num_topk: expected an int in [0,");
  rejected([] { dg::block_m(1, 8, int64_t{1} << 31, 1, 1); }, "megamoe: num_max_tokens_per_rank: expected an int");
  rejected([] { dg::block_m(1, 8, 0, 1, 1, static_cast<MmaType>(5)); }, "megamoe: mma_type: expected");
  rejected([] { dg::block_m(64, 64, 0, 1 << 30, 1 << 20); }, "megamoe: num_tokens: expected num_tokens * num_ranks");
  EXPECT_EQ(dg::block_m(1, 1, 0, 1 << 30, 1), 240);
}

// ---------------------------------------------------------------------------------------
// Full-buffer staging on the CPU into a buffer's input views

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

TensorRef view(std::vector<uint8_t>& buf, const dg::Region& r, DType dt) {
  return TensorRef::from_arrays(buf.data() + r.offset, dt, r.ndim, r.shape, r.strides);
}

struct Case {
  const char* name;
  dg::BufferArgs args;
  megamoe::QuantScheme scheme;
  int64_t tokens;
};

TEST(DeepGemmBuffers, FullBufferStagingFillsExactlyTheInputViews) {
  dg::BufferArgs nv = sm100(1, 16, 300, 4, 512, 512, 1, MmaType::kFp4xFp4, 132);
  const Case cases[] = {
      {"sm90", args(Variant::kSm90Fp8, 1, 16, 300, 4, 512, 256),
       megamoe::QuantScheme::fp8_fp32_g128().with_amax_floor(1e-10f), 257},
      {"sm100 fp8xfp4 + shared", sm100(1, 16, 300, 4, 512, 256, 1, MmaType::kFp8xFp4, 132),
       megamoe::QuantScheme::mxfp8(), 257},
      {"sm100 fp4xfp4", nv, megamoe::QuantScheme::nvfp4_static(), 100},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const dg::BufferLayout l = dg::buffer_layout(c.args);
    const int64_t T = c.tokens, M = l.num_max_tokens, H = c.args.hidden, K = c.args.num_topk;
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.0f, 2.0f);
    std::vector<uint16_t> hs(static_cast<size_t>(T * H));
    for (auto& v : hs) v = bf16_bits(n(rng));
    std::vector<float> w(static_cast<size_t>(T * K));
    for (auto& v : w) v = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    for (auto& v : ids) v = static_cast<int32_t>(rng() % 16);
    std::vector<uint8_t> pad(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pad[static_cast<size_t>(t)] = t % 9 == 4;
    float gs = 0.75f;

    std::vector<uint8_t> buf(static_cast<size_t>(l.nbytes), 0xA5);
    const dg::Region& x = *l.find("x");
    const dg::Region& sf = *l.find("x_sf");
    megamoe::StageArgs a;
    a.hidden_states = TensorRef(hs.data(), DType::kBFloat16, {T, H});
    a.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
    a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
    a.is_padding = TensorRef(pad.data(), DType::kBool, {T});
    a.x_q = view(buf, x, x.dtype);
    a.x_sf = view(buf, sf, sf.dtype);
    a.topk_idx_out = view(buf, *l.find("topk_idx"), DType::kInt64);
    a.topk_weights_out = view(buf, *l.find("topk_weights"), DType::kFloat32);
    a.hidden_quant = c.scheme;
    a.full_buffer = true;
    if (c.scheme.scale2 == megamoe::Scale2::kStatic) a.global_scale = TensorRef(&gs, DType::kFloat32, {1});
    const dg::Region* sh = l.find("shared_l1_acts_sf");
    int64_t bm = 0;
    if (sh != nullptr) {
      bm = dg::block_m(c.args.num_ranks, c.args.num_experts, M, T, K, c.args.mma_type);
      a.shared_x_sf = view(buf, *sh, DType::kInt32);
      a.shared_block_m = bm;
    }
    megamoe::prepare_inputs(a);

    // The same staging into separate outputs (shapes from the shape rule, poisoned alike).
    const megamoe::OutputShapes o =
        megamoe::output_shapes(M, H, K, c.scheme, sh ? std::optional<int64_t>(bm) : std::nullopt);
    std::vector<uint8_t> xq(static_cast<size_t>(o.x_q.numel() * megamoe::dtype_size(o.x_q.dtype)), 0xA5);
    std::vector<uint8_t> xs(static_cast<size_t>(o.x_sf.numel() * megamoe::dtype_size(o.x_sf.dtype)), 0xA5);
    std::vector<uint8_t> io(static_cast<size_t>(M * K * 8), 0xA5), wo(static_cast<size_t>(M * K * 4), 0xA5);
    std::vector<uint8_t> ss(sh ? static_cast<size_t>(sh->nbytes) : 0, 0xA5);
    megamoe::StageArgs b = a;
    b.x_q = TensorRef(xq.data(), x.dtype, {o.x_q.shape[0], o.x_q.shape[1]});
    b.x_sf = TensorRef(xs.data(), o.x_sf.dtype, {o.x_sf.shape[0], o.x_sf.shape[1]});
    b.topk_idx_out = TensorRef(io.data(), DType::kInt64, {M, K});
    b.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {M, K});
    if (sh != nullptr)
      b.shared_x_sf = TensorRef(ss.data(), DType::kInt32, {sh->shape[0], sh->shape[1]}, {1, sh->shape[0]});
    megamoe::prepare_inputs(b);

    EXPECT_EQ(0, std::memcmp(buf.data() + x.offset, xq.data(), xq.size()));
    ASSERT_EQ(static_cast<size_t>(sf.nbytes), xs.size());
    EXPECT_EQ(0, std::memcmp(buf.data() + sf.offset, xs.data(), xs.size()));
    EXPECT_EQ(0, std::memcmp(buf.data() + l.find("topk_idx")->offset, io.data(), io.size()));
    EXPECT_EQ(0, std::memcmp(buf.data() + l.find("topk_weights")->offset, wo.data(), wo.size()));
    if (sh != nullptr) {
      EXPECT_EQ(0, std::memcmp(buf.data() + sh->offset, ss.data(), ss.size()));
    }
    // The tail rows of the top-k views are -1 / +0.0 up to the aligned T.
    const int64_t* idx = reinterpret_cast<const int64_t*>(buf.data() + l.find("topk_idx")->offset);
    const uint32_t* wt = reinterpret_cast<const uint32_t*>(buf.data() + l.find("topk_weights")->offset);
    for (int64_t i = T * K; i < M * K; ++i) {
      ASSERT_EQ(idx[i], -1) << i;
      ASSERT_EQ(wt[i], 0u) << i;
    }
    // Every byte outside the input views is still poison, and so are x's and x_sf's tail rows.
    for (const dg::Region& r : l.regions) {
      if (r.role == dg::Role::kInput) continue;
      for (int64_t i = 0; i < r.nbytes; ++i)
        ASSERT_EQ(buf[static_cast<size_t>(r.offset + i)], 0xA5) << r.name << " " << i;
    }
    const int64_t xrow = x.nbytes / M, sfrow = sf.nbytes / M;
    for (int64_t i = T * xrow; i < x.nbytes; ++i) ASSERT_EQ(buf[static_cast<size_t>(x.offset + i)], 0xA5);
    for (int64_t i = T * sfrow; i < sf.nbytes; ++i) ASSERT_EQ(buf[static_cast<size_t>(sf.offset + i)], 0xA5);
    EXPECT_NE(buf[static_cast<size_t>(x.offset)], 0xA5);  // something was staged
  }
}

}  // namespace
