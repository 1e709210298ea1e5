// Host tests of the CUDA backend's kernel choice (src/cuda/policy/plan.h): plan() is a pure
// function of the validated problem, the layout and a DeviceInfo, so these run without a
// GPU (the tensors carry made-up, never dereferenced device addresses). check_plan() runs
// before launch() touches the device, so its rejections are tested here too; and the GPU
// tests' harness lays the reference out as the CPU backend does (host mirrors only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/gate.h"
#include "cuda/policy/plan.h"
#include "megamoe/megamoe.h"
#include "megamoe/router.h"
#include "stage_harness.h"
#include "contract/validate.h"

namespace {

using megamoe::Device;
using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::StageArgs;
using megamoe::TensorRef;
using megamoe::core::Format;
namespace mc = megamoe::cuda;

const mc::DeviceInfo kH200{132, 90};

struct Opts {
  DType in = DType::kBFloat16;
  int64_t K = 8;
  bool misaligned_hidden = false;  // hidden_states one element off 16-byte alignment
  bool strided_hidden = false;     // hidden row stride H + 8 (rows still 16-byte aligned)
  bool hidden_col_stride = false;  // every other element
  bool sf_mn_major = false;        // x_sf[t, g] at g * align(T, 4) + t
  int64_t bm = 0;                  // shared_x_sf block m (0: none)
  bool shared_transposed = false;
  bool nonfinite = false;
  bool pdl = false;
  int64_t max_tokens = 0;  // > 0: full-buffer mode, outputs of max_tokens rows
};

/// A call whose tensors live at made-up, 256-byte aligned device addresses.
struct FakeCall {
  StageArgs a;
  uintptr_t next = uintptr_t{1} << 32;
  void* alloc(int64_t bytes) {
    const uintptr_t p = next;
    next += (static_cast<uintptr_t>(bytes) + 4096 + 255) / 256 * 256;
    return reinterpret_cast<void*>(p);
  }
  FakeCall(int64_t T, int64_t H, const QuantScheme& q, const Opts& o = {}) {
    const Device d = Device::cuda(0);
    const megamoe::OutputShapes s =
        megamoe::output_shapes(T, H, o.K, q, o.bm > 0 ? std::optional<int64_t>(o.bm) : std::nullopt);
    const int64_t R = o.max_tokens > 0 ? o.max_tokens : T;  // rows of the outputs
    const int64_t es = megamoe::dtype_size(o.in);
    const int64_t hs0 = o.strided_hidden ? H + 8 : o.hidden_col_stride ? 2 * H : H;
    char* hs = static_cast<char*>(alloc((T * hs0 + 8) * es)) + (o.misaligned_hidden ? es : 0);
    a.hidden_states = TensorRef(hs, o.in, {T, H}, {hs0, o.hidden_col_stride ? 2 : 1}, d);
    a.topk_weights = TensorRef(alloc(T * o.K * 4), DType::kFloat32, {T, o.K}, d);
    a.topk_ids = TensorRef(alloc(T * o.K * 4), DType::kInt32, {T, o.K}, d);
    a.x_q = TensorRef(alloc(R * s.x_q.shape[1] * megamoe::dtype_size(s.x_q.dtype)), s.x_q.dtype, {R, s.x_q.shape[1]}, d);
    const int64_t sfc = s.x_sf.shape[1], ta = (R + 3) / 4 * 4;
    if (o.sf_mn_major) {
      a.x_sf = TensorRef(alloc(ta * sfc * 4), s.x_sf.dtype, {R, sfc}, {1, ta}, d);
    } else {
      a.x_sf = TensorRef(alloc(R * sfc * 4), s.x_sf.dtype, {R, sfc}, d);
    }
    a.topk_idx_out = TensorRef(alloc(R * o.K * 8), DType::kInt64, {R, o.K}, d);
    a.topk_weights_out = TensorRef(alloc(R * o.K * 4), DType::kFloat32, {R, o.K}, d);
    a.full_buffer = o.max_tokens > 0;
    if (o.bm > 0) {
      const int64_t rows = s.shared_x_sf->shape[0];
      a.shared_x_sf = o.shared_transposed ? TensorRef(alloc(rows * sfc * 4), DType::kInt32, {rows, sfc}, {1, rows}, d)
                                          : TensorRef(alloc(rows * sfc * 4), DType::kInt32, {rows, sfc}, d);
      a.shared_block_m = o.bm;
    }
    if (s.global_scale) a.global_scale = TensorRef(alloc(4), DType::kFloat32, {1}, d);
    if (s.x_scales) a.x_scales = TensorRef(alloc(R * 4), DType::kFloat32, {R}, d);
    if (o.nonfinite) a.nonfinite_count = TensorRef(alloc(8), DType::kInt64, {1}, d);
    a.hidden_quant = q;
    a.enable_pdl = o.pdl;
  }
  mc::Plan plan(const mc::DeviceInfo& dev = kH200) const {
    return mc::plan(megamoe::detail::validate_args(a), a, dev);
  }
};

const QuantScheme kAll[] = {QuantScheme::mxfp8(),         QuantScheme::fp8_ue8m0_g128(), QuantScheme::fp8_fp32_g128(),
                            QuantScheme::fp8_fp32_g32(),  QuantScheme::mxfp4(),
                            QuantScheme::mxfp4(megamoe::Rounding::kNearestEven),
                            QuantScheme::nvfp4_static(),  QuantScheme::nvfp4_per_token()};

TEST(CudaPlan, DecodeSizes) {
  for (int64_t T : {1, 2, 4, 8, 16, 32, 64}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const mc::Plan p = FakeCall(T, 7168, QuantScheme::mxfp8()).plan();
    EXPECT_EQ(p.role, mc::Role::kFast);
    EXPECT_EQ(p.fmt, Format::kFp8Ue8m0);
    EXPECT_EQ(p.in, DType::kBFloat16);
    EXPECT_EQ(p.G, 32);
    EXPECT_EQ(p.index, mc::IndexWidth::k32);
    EXPECT_EQ(p.shape, mc::Shape::kSplitTopk);
    EXPECT_EQ(p.threads, 128);
    EXPECT_EQ(p.store, mc::StorePolicy::kDefault);
    EXPECT_FALSE(p.pdl);
    EXPECT_FALSE(p.count_nonfinite);
    EXPECT_TRUE(p.vectorized);
    // One chunk per thread, then ceil(T * K / 128) top-k blocks.
    EXPECT_EQ(p.quant_blocks, (T * 448 + 127) / 128);
    EXPECT_EQ(p.grid, p.quant_blocks + (T * 8 + 127) / 128);
  }
}

TEST(CudaPlan, Prefill) {
  const mc::Plan p = FakeCall(16384, 7168, QuantScheme::mxfp8()).plan();
  EXPECT_EQ(p.role, mc::Role::kFast);
  EXPECT_EQ(p.index, mc::IndexWidth::k32);
  EXPECT_EQ(p.shape, mc::Shape::kLoop);  // 7.3M chunks: beyond one pass of the capped grid
  EXPECT_EQ(p.threads, 256);
  EXPECT_EQ(p.store, mc::StorePolicy::kEvictFirst);
  EXPECT_EQ(p.grid, p.quant_blocks);
  EXPECT_EQ(p.grid, 132 * 16 * 8);  // the cap: 16 waves of 8 blocks per SM
  // Mid size: one pass, 256 threads, evict-first from 2^19 chunks.
  const mc::Plan m = FakeCall(2048, 7168, QuantScheme::mxfp8()).plan();
  EXPECT_EQ(m.shape, mc::Shape::kSplitTopk);
  EXPECT_EQ(m.threads, 256);
  EXPECT_EQ(m.store, mc::StorePolicy::kEvictFirst);
  const mc::Plan s = FakeCall(1024, 7168, QuantScheme::mxfp8()).plan();
  EXPECT_EQ(s.store, mc::StorePolicy::kDefault);
}

// NVFP4 static of bf16 on sm_89+: its loop shape (the per-block multiplier table) runs one
// wave; other inputs, other formats, sm_80 and the one-pass sizes keep the default caps.
TEST(CudaPlan, Nvfp4StaticLoopRunsOneWave) {
  const QuantScheme q = QuantScheme::nvfp4_static();
  const mc::Plan p = FakeCall(16384, 7168, q).plan();
  SCOPED_TRACE(mc::to_string(p));
  EXPECT_EQ(p.shape, mc::Shape::kLoop);
  EXPECT_EQ(p.threads, 256);
  EXPECT_EQ(p.grid, 132 * mc::kRecipLoopWaves * 8);
  EXPECT_EQ(FakeCall(16384, 7168, q).plan(mc::DeviceInfo{128, 89}).grid, 128 * mc::kRecipLoopWaves * 6);  // 1536 threads an SM
  EXPECT_EQ(FakeCall(16384, 7168, q).plan(mc::DeviceInfo{108, 80}).grid, 108 * 16 * 8);
  Opts f16;
  f16.in = DType::kFloat16;
  EXPECT_EQ(FakeCall(16384, 7168, q, f16).plan().grid, 132 * 16 * 8);
  EXPECT_EQ(FakeCall(16384, 7168, QuantScheme::mxfp4()).plan().grid, 132 * 16 * 8);
  EXPECT_EQ(FakeCall(2048, 7168, q).plan().shape, mc::Shape::kSplitTopk);
  // From kRecipLoopChunks chunks a thread of the wave, below where 16 waves stop covering
  // the chunks: H = 4096, T = 16384 (4.2M chunks) loops.
  const int64_t from = mc::kRecipLoopChunks * 132 * 2048;
  EXPECT_EQ(FakeCall(from / 256, 4096, q).plan().shape, mc::Shape::kLoop);
  EXPECT_EQ(FakeCall(from / 256 - 1, 4096, q).plan().shape, mc::Shape::kSplitTopk);
  EXPECT_EQ(FakeCall(16384, 4096, q).plan().grid, 132 * 8);
  EXPECT_EQ(FakeCall(16384, 4096, q, f16).plan().shape, mc::Shape::kSplitTopk);
  // The fused router kernel (no table) gets the plan it had before the table.
  const FakeCall c4(16384, 4096, q), c7(16384, 7168, q);
  EXPECT_EQ(mc::plan(megamoe::detail::validate_args(c4.a), c4.a, kH200, mc::PlanFor::kFusedRouter).shape, mc::Shape::kSplitTopk);
  const mc::Plan f7 = mc::plan(megamoe::detail::validate_args(c7.a), c7.a, kH200, mc::PlanFor::kFusedRouter);
  EXPECT_EQ(f7.shape, mc::Shape::kLoop);
  EXPECT_EQ(f7.grid, 132 * 16 * 8);
}

TEST(CudaPlan, MnMajorScalesTakeTilesFromMidSizes) {
  Opts o;
  o.sf_mn_major = true;
  const mc::Plan big = FakeCall(4096, 7168, QuantScheme::fp8_fp32_g128(), o).plan();
  EXPECT_EQ(big.shape, mc::Shape::kTile);
  EXPECT_EQ(big.threads, mc::kTileThreads);
  const int64_t tiles = (4096 / 8) * ((7168 / 16 + 31) / 32);
  EXPECT_EQ(big.quant_blocks, std::min<int64_t>(tiles, 132 * 16 * 8));
  EXPECT_EQ(big.grid, big.quant_blocks + (4096 * 8 + 255) / 256);
  // Below 2^18 chunks the tile's barrier costs more than it saves.
  EXPECT_EQ(FakeCall(256, 7168, QuantScheme::fp8_fp32_g128(), o).plan().shape, mc::Shape::kSplitTopk);
  // A transposed shared-expert copy counts as MN-major too.
  Opts sh;
  sh.bm = 128;
  sh.shared_transposed = true;
  EXPECT_EQ(FakeCall(4096, 7168, QuantScheme::mxfp8(), sh).plan().shape, mc::Shape::kTile);
  sh.shared_transposed = false;
  EXPECT_EQ(FakeCall(4096, 7168, QuantScheme::mxfp8(), sh).plan().shape, mc::Shape::kSplitTopk);
}

TEST(CudaPlan, MisalignedOrStridedRowsTakeTheGenericKernel) {
  for (int variant = 0; variant < 2; ++variant) {
    Opts o;
    o.misaligned_hidden = variant == 0;
    o.hidden_col_stride = variant == 1;
    for (const QuantScheme& q : kAll) {
      SCOPED_TRACE(megamoe::scheme_name(q) + " variant " + std::to_string(variant));
      const mc::Plan p = FakeCall(64, 7168, q, o).plan();
      EXPECT_FALSE(p.vectorized);
      if (q == QuantScheme::nvfp4_per_token()) {
        EXPECT_EQ(p.role, mc::Role::kRowwise);
        EXPECT_EQ(p.shape, mc::Shape::kRowwise);
      } else {
        EXPECT_EQ(p.role, mc::Role::kGeneric);
        EXPECT_EQ(p.shape, mc::Shape::kGeneric);
        EXPECT_EQ(p.threads, 256);
      }
      EXPECT_EQ(p.index, mc::IndexWidth::k64);
    }
  }
  // A row stride that keeps rows 16-byte aligned stays on the fast kernel.
  Opts o;
  o.strided_hidden = true;
  EXPECT_EQ(FakeCall(64, 7168, QuantScheme::mxfp8(), o).plan().role, mc::Role::kFast);
  // Group sizes without a fast variant.
  QuantScheme g64 = QuantScheme::mxfp8();
  g64.group_k = 64;
  EXPECT_EQ(FakeCall(64, 7168, g64).plan().role, mc::Role::kGeneric);
}

TEST(CudaPlan, EveryFormat) {
  struct Want {
    Format fmt;
    int G;
    mc::Role role;
  };
  const Want want[] = {{Format::kFp8Ue8m0, 32, mc::Role::kFast},     {Format::kFp8Ue8m0, 128, mc::Role::kFast},
                       {Format::kFp8Fp32, 128, mc::Role::kFast},     {Format::kFp8Fp32, 32, mc::Role::kFast},
                       {Format::kMxfp4, 32, mc::Role::kFast},        {Format::kMxfp4Rne, 32, mc::Role::kFast},
                       {Format::kNvfp4Static, 16, mc::Role::kFast},  {Format::kNvfp4PerToken, 16, mc::Role::kRowwise}};
  for (int i = 0; i < 8; ++i) {
    for (DType in : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
      Opts o;
      o.in = in;
      o.nonfinite = i % 2 == 0;
      const mc::Plan p = FakeCall(135, 4096, kAll[i].with_amax_floor(i == 3 ? 1e-10f : 1e-4f), o).plan();
      SCOPED_TRACE(mc::to_string(p));
      EXPECT_EQ(p.fmt, want[i].fmt);
      EXPECT_EQ(p.G, want[i].G);
      EXPECT_EQ(p.role, want[i].role);
      EXPECT_EQ(p.in, in);
      EXPECT_EQ(p.count_nonfinite, o.nonfinite);
      EXPECT_TRUE(p.vectorized);
      if (p.role == mc::Role::kRowwise) {
        EXPECT_EQ(p.threads, 128);  // 256 groups of 16, two per thread
        EXPECT_FALSE(p.row_wide);
        EXPECT_EQ(p.grid, 135);     // one block per row
      }
    }
  }
}

/// The library's plan of @p c changed by @p change (its grid recomputed) is refused by
/// check_plan.
bool changed_plan_rejected(const FakeCall& c, void (*change)(mc::Plan&)) {
  const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
  mc::Plan p = c.plan();
  change(p);
  mc::fill_grid(p, pr, kH200);
  try {
    mc::check_plan(p, pr, c.a);
  } catch (const megamoe::Error&) {
    return true;
  }
  return false;
}

// The row kernel: one group a thread while T <= SMs, two beyond (four in the wide kernel:
// RowKernelWide), whole warps, at most kRowwiseMaxThreads (rows beyond 2 *
// kRowwiseMaxThreads groups take the two-pass loop).
TEST(CudaPlan, RowKernelThreads) {
  const QuantScheme q = QuantScheme::nvfp4_per_token();
  EXPECT_EQ(FakeCall(1, 7168, q).plan().threads, 128);  // split in 4 (RowKernelSplitsRowsAtDecode)
  EXPECT_EQ(FakeCall(132, 7168, q).plan().threads, 448);
  EXPECT_EQ(FakeCall(133, 7168, q).plan().threads, 128);  // wide
  EXPECT_EQ(FakeCall(64, 4096, q).plan().threads, 128);   // split in 2
  EXPECT_EQ(FakeCall(4096, 4096, q).plan().threads, 128);
  EXPECT_EQ(FakeCall(64, 16384, q).plan().threads, mc::kRowwiseMaxThreads);
  EXPECT_EQ(FakeCall(4096, 16384, q).plan().threads, mc::kRowwiseMaxThreads);
  EXPECT_EQ(FakeCall(64, 256, q).plan().threads, 32);  // 16 groups
  for (int64_t T : {1, 64, 4096}) {
    const mc::Plan p = FakeCall(T, 7168, q).plan();
    EXPECT_EQ(p.quant_blocks, T * p.row_split);  // one block per row (part)
    // split rows: the top-k entries in blocks of their own (K = 8)
    EXPECT_EQ(p.grid - p.quant_blocks, p.row_split > 1 ? mc::topk_block_count(T, T, 8, p.threads, false) : 0);
    EXPECT_EQ(p.threads % 32, 0);
  }
}

// At decode a row is split over 4 or 2 blocks while each has an SM of its own, its part at
// most kRowSplitMaxThreads groups and at least a warp's; vectorized rows only; check_plan
// refuses splits the kernel cannot run.
TEST(CudaPlan, RowKernelSplitsRowsAtDecode) {
  const QuantScheme q = QuantScheme::nvfp4_per_token();
  struct Want {
    int64_t T, H;
    int split, threads;
  };
  for (const Want& w : {Want{1, 7168, 4, 128}, Want{33, 7168, 4, 128}, Want{34, 7168, 2, 224}, Want{66, 4096, 2, 128},
                        Want{67, 7168, 1, 448}, Want{1, 16384, 4, 256}, Want{1, 256, 1, 32}, Want{1, 4096, 4, 64}}) {
    const mc::Plan p = FakeCall(w.T, w.H, q).plan();
    SCOPED_TRACE(mc::to_string(p));
    EXPECT_EQ(p.row_split, w.split);
    EXPECT_EQ(p.threads, w.threads);
    EXPECT_EQ(p.quant_blocks, w.T * w.split);
    EXPECT_EQ(p.grid, p.quant_blocks + (w.split > 1 ? mc::topk_block_count(w.T, w.T, 8, w.threads, false) : 0));
    EXPECT_FALSE(p.fused_tail);
  }
  Opts strided;
  strided.hidden_col_stride = true;
  EXPECT_EQ(FakeCall(1, 7168, q, strided).plan().row_split, 1);
  EXPECT_EQ(FakeCall(1, 7168, QuantScheme::mxfp4()).plan().row_split, 1);
  FakeCall c(1, 7168, q);
  auto rejected = [&](void (*change)(mc::Plan&)) { return changed_plan_rejected(c, change); };
  EXPECT_FALSE(rejected([](mc::Plan&) {}));
  EXPECT_TRUE(rejected([](mc::Plan& p) { p.row_split = 3; }));
  EXPECT_TRUE(rejected([](mc::Plan& p) { p.threads = 64; }));  // 4 x 64 < 448 groups
  EXPECT_TRUE(rejected([](mc::Plan& p) { p.threads = 512; }));
  EXPECT_TRUE(rejected([](mc::Plan& p) { p.vectorized = false; }));
  EXPECT_FALSE(rejected([](mc::Plan& p) { p.row_split = 2, p.threads = 224; }));
  // the split kernel's top-k entries need their blocks
  const megamoe::detail::Problem pc = megamoe::detail::validate_args(c.a);
  mc::Plan no_topk = c.plan();
  no_topk.grid = no_topk.quant_blocks;
  EXPECT_THROW(mc::check_plan(no_topk, pc, c.a), megamoe::Error);
  FakeCall m(1, 7168, QuantScheme::mxfp4());
  const megamoe::detail::Problem pm = megamoe::detail::validate_args(m.a);
  mc::Plan f = m.plan();
  f.row_split = 2;
  EXPECT_THROW(mc::check_plan(f, pm, m.a), megamoe::Error);
}

// Prefill rows of 16-bit inputs (T > SMs, 257..512 groups, vectorized) take the wide row
// kernel, four groups a thread in whole warps; fp32 inputs, strided rows, longer and shorter
// rows and decode sizes the others; check_plan refuses wide plans the kernel cannot run.
TEST(CudaPlan, RowKernelWide) {
  const QuantScheme q = QuantScheme::nvfp4_per_token();
  struct Want {
    int64_t T, H;
    bool wide;
    int threads;
  };
  for (const Want& w : {Want{133, 7168, true, 128}, Want{16384, 7168, true, 128}, Want{16384, 8192, true, 128},
                        Want{16384, 4224, true, 96}, Want{16384, 4096, false, 128}, Want{16384, 2048, false, 64},
                        Want{132, 7168, false, 448}, Want{16384, 1024, false, 32}, Want{16384, 8320, false, 288},
                        Want{16384, 16384, false, 512}}) {
    const mc::Plan p = FakeCall(w.T, w.H, q).plan();
    SCOPED_TRACE(mc::to_string(p));
    EXPECT_EQ(p.row_wide, w.wide);
    EXPECT_EQ(p.threads, w.threads);
    if (w.wide) {  // one block a row (within 16 waves of 128-thread blocks)
      EXPECT_EQ(p.grid, w.T);
    }
    EXPECT_NE(mc::to_string(p).find(w.wide ? "row_wide=on" : "row_wide=off"), std::string::npos);
  }
  Opts f32;
  f32.in = DType::kFloat32;
  EXPECT_FALSE(FakeCall(16384, 7168, q, f32).plan().row_wide);
  Opts strided;
  strided.hidden_col_stride = true;
  EXPECT_FALSE(FakeCall(16384, 7168, q, strided).plan().row_wide);
  EXPECT_FALSE(FakeCall(16384, 7168, QuantScheme::mxfp4()).plan().row_wide);
  FakeCall c(16384, 7168, q);
  auto rejected = [&](void (*change)(mc::Plan&)) { return changed_plan_rejected(c, change); };
  EXPECT_FALSE(rejected([](mc::Plan&) {}));
  EXPECT_TRUE(rejected([](mc::Plan& p) { p.threads = 96; }));   // 4 x 96 < 448 groups
  EXPECT_TRUE(rejected([](mc::Plan& p) { p.threads = 160; }));  // beyond kRowWideMaxThreads
  EXPECT_TRUE(rejected([](mc::Plan& p) { p.vectorized = false; }));
  EXPECT_TRUE(rejected([](mc::Plan& p) { p.row_split = 4, p.threads = 128; }));  // a valid split otherwise
  EXPECT_FALSE(rejected([](mc::Plan& p) { p.row_wide = false, p.threads = 224; }));
  FakeCall m(16384, 7168, QuantScheme::mxfp4());
  const megamoe::detail::Problem pm = megamoe::detail::validate_args(m.a);
  mc::Plan f = m.plan();
  f.row_wide = true;
  EXPECT_THROW(mc::check_plan(f, pm, m.a), megamoe::Error);
  FakeCall c32(16384, 7168, q, f32);
  const megamoe::detail::Problem p32 = megamoe::detail::validate_args(c32.a);
  mc::Plan w32 = c32.plan();
  w32.row_wide = true, w32.threads = 128;
  mc::fill_grid(w32, p32, kH200);
  EXPECT_THROW(mc::check_plan(w32, p32, c32.a), megamoe::Error);
}

TEST(CudaPlan, Fp4XqNeedsOnly8ByteRows) {
  // x_q of fp4 is [T, H/2] bytes: an 8-byte aligned row start suffices for the 8-byte stores.
  FakeCall c(64, 7168, QuantScheme::mxfp4());
  c.a.x_q.data = static_cast<char*>(c.a.x_q.data) + 8;
  EXPECT_EQ(c.plan().role, mc::Role::kFast);
  c.a.x_q.data = static_cast<char*>(c.a.x_q.data) + 4;
  EXPECT_EQ(c.plan().role, mc::Role::kGeneric);
}

TEST(CudaPlan, PdlNeedsSm90) {
  Opts o;
  o.pdl = true;
  EXPECT_TRUE(FakeCall(8, 7168, QuantScheme::mxfp8(), o).plan().pdl);
  EXPECT_FALSE(FakeCall(8, 7168, QuantScheme::mxfp8(), o).plan(mc::DeviceInfo{108, 80}).pdl);
}

TEST(CudaPlan, SmCountScalesTheChoice) {
  // 128-thread blocks up to 1024 chunks per SM, and the loop cap in waves of the SM count.
  EXPECT_EQ(FakeCall(256, 7168, QuantScheme::mxfp8()).plan().threads, 128);
  const mc::Plan small_gpu = FakeCall(4096, 7168, QuantScheme::mxfp8()).plan(mc::DeviceInfo{16, 90});
  EXPECT_EQ(small_gpu.threads, 256);
  EXPECT_EQ(small_gpu.shape, mc::Shape::kLoop);
  EXPECT_EQ(small_gpu.grid, 16 * 16 * 8);
}

TEST(CudaPlan, SixtyFourBitOffsetsWhenStridesNeedThem) {
  // Negative strides (reversed top-k rows) leave the 32-bit modes.
  FakeCall c(64, 7168, QuantScheme::mxfp8());
  c.a.topk_ids.strides[0] = -8;
  c.a.topk_ids.data = static_cast<char*>(c.a.topk_ids.data) + 63 * 8 * 4;
  const mc::Plan p = c.plan();
  EXPECT_EQ(p.role, mc::Role::kFast);
  EXPECT_EQ(p.index, mc::IndexWidth::k64);
  EXPECT_EQ(p.shape, mc::Shape::kLoop);
  EXPECT_EQ(p.store, mc::StorePolicy::kEvictFirst);
}

TEST(CudaPlan, ToStringNamesEveryField) {
  Opts o;
  o.nonfinite = true;
  o.pdl = true;
  const mc::Plan p = FakeCall(64, 7168, QuantScheme::nvfp4_static(), o).plan();
  const std::string s = mc::to_string(p);
  for (const char* want : {"kernel=fast", "format=nvfp4_static", "in=bfloat16", "G=16", "index=32",
                           "shape=split_topk", "threads=128", "grid=", "quant_blocks=", "stores=default",
                           "pdl=on", "nonfinite=on", "vectorized=on", "row_split=1", "row_wide=off"}) {
    EXPECT_NE(s.find(want), std::string::npos) << want << " not in: " << s;
  }
  for (mc::Shape sh : {mc::Shape::kLoop, mc::Shape::kSplitTopk, mc::Shape::kSplitHalf, mc::Shape::kTile,
                       mc::Shape::kRowwise, mc::Shape::kGeneric}) {
    EXPECT_STRNE(mc::shape_name(sh), "?");
  }
  for (mc::Role r : {mc::Role::kFast, mc::Role::kGeneric, mc::Role::kRowwise}) EXPECT_STRNE(mc::role_name(r), "?");
  mc::Plan q = p;
  q.store = mc::StorePolicy::kEvictFirst;
  q.index = mc::IndexWidth::k64;
  q.pdl = q.count_nonfinite = q.vectorized = false;
  const std::string t = mc::to_string(q);
  for (const char* want : {"stores=evict_first", "index=64", "pdl=off", "nonfinite=off", "vectorized=off"}) {
    EXPECT_NE(t.find(want), std::string::npos) << want << " not in: " << t;
  }
}

// NVFP4 online: the amax launch (one block storing gs, or a memset and atomicMax blocks),
// then NVFP4 static's plan for the call.
mc::OnlinePlan online_of(const FakeCall& c, const mc::DeviceInfo& dev = kH200) {
  return mc::online_plan(megamoe::detail::validate_args(c.a), c.a, dev);
}

/// NVFP4 online's call of T x 7168 bf16 tokens at @p floor, PDL as asked.
FakeCall online_call(int64_t T, float floor, bool pdl) {
  Opts o;
  o.pdl = pdl;
  return FakeCall(T, 7168, QuantScheme::nvfp4_online().with_amax_floor(floor), o);
}

TEST(CudaPlan, OnlineDecodeIsOneBlockStoringGs) {
  for (float floor : {1e-4f, 0.0f}) {
    for (bool pdl : {false, true}) {
      const FakeCall c = online_call(1, floor, pdl);
      const mc::OnlinePlan op = online_of(c);
      const std::string s = mc::to_string(op);
      SCOPED_TRACE(s);
      EXPECT_EQ(op.grid, 1);
      EXPECT_EQ(op.row_units, 1);  // 7168 bf16 = 896 vectors <= 256 threads x 4
      EXPECT_TRUE(op.vectorized);
      EXPECT_FALSE(op.memset);
      EXPECT_FALSE(op.unit);
      EXPECT_EQ(op.pdl, pdl);
      ASSERT_TRUE(op.staging);
      EXPECT_EQ(op.stage.fmt, Format::kNvfp4Static);
      EXPECT_FALSE(op.stage.unit_gs);
      EXPECT_FALSE(op.stage.pdl);  // the staging reads gs: stream-ordered after the amax launch
      EXPECT_EQ(s.rfind("nvfp4_online: amax(grid=1 ", 0), 0u);
      EXPECT_NE(s.find("gs=store"), std::string::npos);
      EXPECT_NE(s.find(" + static staging: kernel=fast format=nvfp4_static"), std::string::npos);
      const megamoe::detail::Problem p = megamoe::detail::validate_args(c.a);
      EXPECT_NO_THROW(mc::check_plan(op.stage, mc::static_problem(p), c.a));
      // The static staging is the plan NVFP4 static gets for the same tensors, without PDL
      // (stream-ordered after the amax launch, whatever the call asks).
      FakeCall st(1, 7168, QuantScheme::nvfp4_static(), Opts{});
      EXPECT_EQ(mc::to_string(op.stage), mc::to_string(st.plan()));
    }
  }
}

TEST(CudaPlan, OnlinePrefillIsMemsetAndAtomicBlocks) {
  for (float floor : {1e-4f, 0.0f}) {
    const FakeCall c = online_call(4096, floor, true);
    const mc::OnlinePlan op = online_of(c);
    const std::string s = mc::to_string(op);
    SCOPED_TRACE(s);
    EXPECT_GT(op.grid, 1);
    // Grid-stride over 4096 units, capped at kOnlineMaxWaves waves of 8 blocks an SM.
    EXPECT_EQ(op.grid, std::min<int64_t>(4096, int64_t{mc::kOnlineMaxWaves} * 8 * kH200.sm_count));
    EXPECT_TRUE(op.memset);
    EXPECT_EQ(op.unit, floor == 0.0f);
    EXPECT_EQ(op.stage.unit_gs, floor == 0.0f);
    EXPECT_FALSE(op.pdl);         // after the memset node
    EXPECT_FALSE(op.stage.pdl);   // the staging reads gs: stream-ordered after the amax launch
    EXPECT_EQ(s.rfind("nvfp4_online: memset + amax(grid=", 0), 0u);
    EXPECT_NE(s.find("gs=atomic_max"), std::string::npos);
    EXPECT_NE(s.find(floor == 0.0f ? "unit=on" : "unit=off"), std::string::npos);
    EXPECT_NE(s.find(floor == 0.0f ? "unit_gs=on" : "unit_gs=off"), std::string::npos);
    const megamoe::detail::Problem p = megamoe::detail::validate_args(c.a);
    EXPECT_NO_THROW(mc::check_plan(op.stage, mc::static_problem(p), c.a));
  }
}

TEST(CudaPlan, OnlineUnitsCoverEveryElement) {
  struct L {
    DType in;
    bool misaligned, col_stride, strided;
    bool vec;
  };
  for (const L l : {L{DType::kBFloat16, false, false, false, true}, L{DType::kFloat32, false, false, false, true},
                    L{DType::kFloat16, true, false, false, false}, L{DType::kBFloat16, false, true, false, false},
                    L{DType::kFloat32, false, false, true, true}}) {
    for (int64_t T : {1, 3, 300, 70000}) {
      for (int64_t H : {128, 1024, 1152, 7168, 8192}) {
        Opts o;
        o.in = l.in;
        o.misaligned_hidden = l.misaligned;
        o.hidden_col_stride = l.col_stride;
        o.strided_hidden = l.strided;
        const FakeCall c(T, H, QuantScheme::nvfp4_online(), o);
        const mc::OnlinePlan op = online_of(c);
        SCOPED_TRACE(mc::to_string(op));
        EXPECT_EQ(op.vectorized, l.vec);
        const int64_t span = int64_t{op.threads} * mc::kOnlineVecsPerThread * (16 / megamoe::dtype_size(l.in));
        EXPECT_GE(op.row_units * span, H);
        EXPECT_LT((op.row_units - 1) * span, H);
        EXPECT_GE(op.grid, 1);
        EXPECT_LE(op.grid, T * op.row_units);
        EXPECT_EQ(op.memset, op.grid > 1);
        EXPECT_LE(op.grid, int64_t{mc::kOnlineMaxWaves} * 8 * kH200.sm_count);
      }
    }
  }
}

TEST(CudaPlan, OnlineWithoutColumnsStillWritesGs) {
  const FakeCall c(5, 0, QuantScheme::nvfp4_online().with_amax_floor(0.0f));
  const mc::OnlinePlan op = online_of(c);
  EXPECT_EQ(op.grid, 1);  // the one block stores online_global_scale(0, floor)
  EXPECT_FALSE(op.memset);
  EXPECT_FALSE(op.staging);
  EXPECT_NE(mc::to_string(op).find("H == 0"), std::string::npos);
}

TEST(CudaPlan, OnlineFormatHasNoPlanOfItsOwn) {
  const FakeCall c(4, 1024, QuantScheme::nvfp4_online());
  const megamoe::detail::Problem p = megamoe::detail::validate_args(c.a);
  EXPECT_THROW(mc::plan(p, c.a, kH200), megamoe::Error);
  mc::Plan bad = online_of(c).stage;
  bad.fmt = Format::kNvfp4Online;
  EXPECT_THROW(mc::check_plan(bad, p, c.a), megamoe::Error);
  // unit_gs belongs to NVFP4 static's kernels.
  const FakeCall m(4, 1024, QuantScheme::mxfp8());
  mc::Plan mp = m.plan();
  EXPECT_NO_THROW(mc::check_plan(mp, megamoe::detail::validate_args(m.a), m.a));
  mp.unit_gs = true;
  EXPECT_THROW(mc::check_plan(mp, megamoe::detail::validate_args(m.a), m.a), megamoe::Error);
}

TEST(CudaPlan, LibraryPlansPassTheirOwnCheck) {
  for (const QuantScheme& q : kAll) {
    for (int64_t T : {1, 65, 4096}) {
      for (int layout = 0; layout < 3; ++layout) {
        Opts o;
        o.sf_mn_major = layout == 1;
        o.misaligned_hidden = layout == 2;
        FakeCall c(T, 4096, q, o);
        const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
        const mc::Plan p = mc::plan(pr, c.a, kH200);
        EXPECT_NO_THROW(mc::check_plan(p, pr, c.a)) << mc::to_string(p);
      }
    }
  }
}

/// check_plan's verdict on @p p for @p c (the message when it rejects).
std::string verdict(const FakeCall& c, const mc::Plan& p) {
  try {
    mc::check_plan(p, megamoe::detail::validate_args(c.a), c.a);
    return "ok";
  } catch (const megamoe::Error& e) {
    EXPECT_EQ(e.code(), megamoe::ErrorCode::kInvalidArgument);
    return e.what();
  }
}

TEST(CudaPlan, CheckRejectsPlansThatCannotRunTheCall) {
  FakeCall c(65, 7168, QuantScheme::mxfp8());
  const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
  const mc::Plan base = c.plan();
  ASSERT_EQ(verdict(c, base), "ok");
  auto rejected = [&](mc::Plan p, const char* what) {
    const std::string v = verdict(c, p);
    EXPECT_NE(v, "ok") << what;
    EXPECT_NE(v.find("megamoe: plan:"), std::string::npos) << v;
  };
  mc::Plan p = base;
  p.fmt = Format::kFp8Fp32;
  rejected(p, "another format");
  p = base;
  p.count_nonfinite = true;
  rejected(p, "a counter the call does not have");
  p = base;
  p.threads = 100;
  rejected(p, "threads not whole warps");
  p = base;
  p.quant_blocks -= 1;
  rejected(p, "split_topk without one chunk per thread");
  p = base;
  p.grid = p.quant_blocks;
  rejected(p, "no top-k blocks");
  p = base;
  p.shape = mc::Shape::kTile;
  p.threads = 128;
  mc::fill_grid(p, pr, kH200);
  rejected(p, "tile blocks of 128 threads");
  p.threads = 256;
  mc::fill_grid(p, pr, kH200);
  EXPECT_EQ(verdict(c, p), "ok");
  p = base;
  p.index = mc::IndexWidth::k64;
  rejected(p, "64-bit split_topk");
  p.shape = mc::Shape::kLoop;
  mc::fill_grid(p, pr, kH200);
  rejected(p, "64-bit with default stores");
  p.store = mc::StorePolicy::kEvictFirst;
  EXPECT_EQ(verdict(c, p), "ok");
  p = base;
  p.role = mc::Role::kRowwise;
  p.shape = mc::Shape::kRowwise;
  rejected(p, "the row kernel for a format without per-token scales");
  p = base;
  p.role = mc::Role::kGeneric;
  p.shape = mc::Shape::kGeneric;
  p.index = mc::IndexWidth::k64;
  p.vectorized = false;
  mc::fill_grid(p, pr, kH200);
  EXPECT_EQ(verdict(c, p), "ok") << "the generic kernel runs any layout";
  // The fast kernel on a misaligned layout.
  Opts mis;
  mis.misaligned_hidden = true;
  FakeCall m(65, 7168, QuantScheme::mxfp8(), mis);
  mc::Plan f = base;
  EXPECT_NE(verdict(m, f), "ok");
  // Per-token formats only on the row kernel.
  FakeCall n(65, 7168, QuantScheme::nvfp4_per_token());
  const mc::Plan np = n.plan();
  EXPECT_EQ(verdict(n, np), "ok");
  mc::Plan g = np;
  g.role = mc::Role::kGeneric;
  g.shape = mc::Shape::kGeneric;
  EXPECT_NE(verdict(n, g), "ok");
  // Unsplit, the split plan's top-k blocks go (fill_grid); the unsplit kernel has none.
  mc::Plan r = np;
  ASSERT_GT(np.row_split, 1);
  r.threads = mc::kRowwiseMaxThreads;
  r.row_split = 1;
  EXPECT_NE(verdict(n, r), "ok") << "an unsplit row plan keeping the split plan's top-k blocks";
  mc::fill_grid(r, megamoe::detail::validate_args(n.a), kH200);
  EXPECT_EQ(r.grid, r.quant_blocks);
  EXPECT_EQ(verdict(n, r), "ok");
  // Row kernel blocks beyond its launch bounds.
  r.threads = mc::kRowwiseMaxThreads + 32;
  EXPECT_NE(verdict(n, r), "ok") << "row kernel blocks beyond kRowwiseMaxThreads";
  // A role no kernel has (a plan is a value a caller can build).
  mc::Plan u = base;
  u.role = static_cast<mc::Role>(static_cast<int>(mc::Role::kCopy) + 1);  // past the last role
  EXPECT_NE(verdict(c, u).find("unknown kernel role"), std::string::npos) << verdict(c, u);
  mc::Plan un = np;
  un.role = static_cast<mc::Role>(static_cast<int>(mc::Role::kCopy) + 1);
  EXPECT_NE(verdict(n, un).find("unknown kernel role"), std::string::npos) << verdict(n, un);
}

// Half chunks (8 elements a thread, twice the quantizing blocks): the library plans them
// for MXFP4 (ties toward zero) of 16-bit inputs up to kSplitHalfChunksPerSm chunks an SM;
// every FP4 format of 16-bit inputs can be forced onto them (NVFP4 per-token excepted, a row
// kernel format); check_plan refuses them elsewhere and a grid not of one half chunk a thread.
TEST(CudaPlan, SplitHalfForMxfp4DecodeOf16BitInputs) {
  // The measured sizes (H200 and H100, 2026-12-06): T = 1 at both H, T = 2 at H = 4096.
  const QuantScheme mx = QuantScheme::mxfp4();
  EXPECT_EQ(FakeCall(1, 7168, mx).plan().shape, mc::Shape::kSplitHalf);
  EXPECT_EQ(FakeCall(2, 7168, mx).plan().shape, mc::Shape::kSplitTopk);
  EXPECT_EQ(FakeCall(2, 4096, mx).plan().shape, mc::Shape::kSplitHalf);
  EXPECT_EQ(FakeCall(4, 4096, mx).plan().shape, mc::Shape::kSplitTopk);
  Opts bf16, f16, f32;
  f16.in = DType::kFloat16;
  f32.in = DType::kFloat32;
  for (const QuantScheme& q : kAll) {
    for (const Opts* o : {&bf16, &f16, &f32}) {
      for (int64_t T : {1, 2, 3, 64, 2048}) {
        for (int64_t H : {4096, 7168}) {
          const FakeCall c(T, H, q, *o);
          const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
          const mc::Plan p = c.plan();
          SCOPED_TRACE(mc::to_string(p));
          const bool fp4 = q.elem == megamoe::QuantElem::kFloat4E2M1 && q.scale2 != megamoe::Scale2::kPerToken;
          const bool ttz = q.scale == megamoe::ScaleType::kUE8M0 && q.rounding != megamoe::Rounding::kNearestEven;
          const bool small = T * (H / 16) <= mc::kSplitHalfChunksPerSm * 132;  // T = 1, and T = 2 at H = 4096
          EXPECT_EQ(p.shape == mc::Shape::kSplitHalf, fp4 && ttz && o != &f32 && small);
          if (p.role != mc::Role::kFast || p.shape == mc::Shape::kLoop) continue;
          mc::Plan forced = p;
          forced.shape = mc::Shape::kSplitHalf;
          mc::fill_grid(forced, pr, kH200);
          if (fp4 && o != &f32) {
            EXPECT_EQ(forced.quant_blocks, (T * (H / 16) * 2 + p.threads - 1) / p.threads);
            EXPECT_EQ(verdict(c, forced), "ok");
            mc::Plan whole = forced;  // one whole chunk a thread's grid is too small
            whole.shape = mc::Shape::kSplitTopk;
            mc::fill_grid(whole, pr, kH200);
            EXPECT_EQ(verdict(c, whole), "ok");
            mc::Plan short_grid = forced;
            short_grid.quant_blocks = whole.quant_blocks;
            short_grid.grid = whole.grid;
            EXPECT_NE(verdict(c, short_grid).find("one half chunk per thread"), std::string::npos)
                << verdict(c, short_grid);
          } else {
            EXPECT_NE(verdict(c, forced).find("split_half takes FP4 formats of 16-bit inputs"), std::string::npos)
                << verdict(c, forced);
          }
        }
      }
    }
  }
}

TEST(CudaPlan, FullBufferTailInTheTopkBlocks) {
  auto call = [](int64_t T, int64_t M, const QuantScheme& q, Opts o = {}) {
    o.max_tokens = M;
    return FakeCall(T, 7168, q, o);
  };
  // Decode: split-topk; the top-k blocks cover all M * K entries, the tail rows included.
  for (int64_t T : {1, 8, 64}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const FakeCall c = call(T, 4096, QuantScheme::mxfp8());
    const mc::Plan p = c.plan();
    EXPECT_EQ(p.shape, mc::Shape::kSplitTopk);
    EXPECT_TRUE(p.fused_tail);
    const int64_t tail_per_block = int64_t{p.threads} * mc::kTailEntriesPerThread;
    EXPECT_EQ(p.grid, p.quant_blocks + (T * 8 + p.threads - 1) / p.threads +
                          ((4096 - T) * 8 + tail_per_block - 1) / tail_per_block);
    EXPECT_NE(mc::to_string(p).find("fused_tail=on"), std::string::npos);
    EXPECT_NO_THROW(mc::check_plan(p, megamoe::detail::validate_args(c.a), c.a));
  }
  // Every format: the tail is fused exactly where the plan has top-k blocks of its own.
  for (const QuantScheme& q : kAll) {
    const mc::Plan p = call(4, 512, q).plan();
    EXPECT_EQ(p.fused_tail, p.shape == mc::Shape::kSplitTopk || p.shape == mc::Shape::kSplitHalf) << mc::to_string(p);
  }
  // max_tokens == T: no tail, no extra blocks.
  const mc::Plan same = call(8, 8, QuantScheme::mxfp8()).plan();
  EXPECT_FALSE(same.fused_tail);
  EXPECT_EQ(same.grid, same.quant_blocks + 1);
  // Tiles (MN-major scales from 2^18 chunks) fill it too, in 256-thread top-k blocks.
  Opts mn;
  mn.sf_mn_major = true;
  const mc::Plan tile = call(4096, 8192, QuantScheme::fp8_fp32_g128(), mn).plan();
  EXPECT_EQ(tile.shape, mc::Shape::kTile);
  EXPECT_TRUE(tile.fused_tail);
  EXPECT_EQ(tile.grid, tile.quant_blocks + (4096 * 8 + 255) / 256 + (4096 * 8 + 1023) / 1024);
  // The loop shape, the generic and the row kernels leave the tail to a second launch.
  EXPECT_FALSE(call(16384, 20000, QuantScheme::mxfp8()).plan().fused_tail);
  Opts mis;
  mis.misaligned_hidden = true;
  EXPECT_FALSE(call(4, 512, QuantScheme::mxfp8(), mis).plan().fused_tail);
  EXPECT_FALSE(call(4, 512, QuantScheme::nvfp4_per_token()).plan().fused_tail);
}

TEST(CudaPlan, CheckRejectsAFusedTailItCannotRun) {
  Opts o;
  o.max_tokens = 1024;
  const FakeCall c(4, 7168, QuantScheme::mxfp8(), o);
  const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
  const mc::Plan good = c.plan();
  ASSERT_TRUE(good.fused_tail);
  mc::Plan few = good;  // top-k blocks for T rows only
  few.grid = few.quant_blocks + (4 * 8 + few.threads - 1) / few.threads;
  EXPECT_THROW(mc::check_plan(few, pr, c.a), megamoe::Error);
  mc::Plan loop = good;  // the loop shape has no top-k blocks to fill it with
  loop.shape = mc::Shape::kLoop;
  loop.grid = loop.quant_blocks;
  EXPECT_THROW(mc::check_plan(loop, pr, c.a), megamoe::Error);
  mc::fill_grid(loop, pr, kH200);  // recomputed: the tail goes back to the second launch
  EXPECT_FALSE(loop.fused_tail);
  EXPECT_NO_THROW(mc::check_plan(loop, pr, c.a));
  // Without full-buffer mode a plan claiming to fill a tail is refused.
  const FakeCall plain(4, 7168, QuantScheme::mxfp8());
  mc::Plan claim = plain.plan();
  claim.fused_tail = true;
  EXPECT_THROW(mc::check_plan(claim, megamoe::detail::validate_args(plain.a), plain.a), megamoe::Error);
}

TEST(CudaPlan, FillGridAfterChangingShapeAndThreads) {
  FakeCall c(434, 7168, QuantScheme::mxfp8());
  const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
  mc::Plan p = c.plan();
  for (int threads : {64, 128, 256, 512, 1024}) {
    p.threads = threads;
    p.shape = mc::Shape::kSplitTopk;
    mc::fill_grid(p, pr, kH200);
    EXPECT_EQ(p.quant_blocks, (434 * 448 + threads - 1) / threads);
    EXPECT_EQ(verdict(c, p), "ok") << mc::to_string(p);
    p.shape = mc::Shape::kLoop;
    mc::fill_grid(p, pr, kH200, 1);
    EXPECT_EQ(p.grid, p.quant_blocks);
    EXPECT_LE(p.grid, 132 * 2048 / threads);
    EXPECT_EQ(verdict(c, p), "ok") << mc::to_string(p);
  }
}

// The router's tokens per block: one up to 8 (router kernel) / 16 (fused) tokens per SM;
// beyond, the router kernel's 4 or 2 where every selecting warp's slice fits the register
// selection, which follows from router_group, the fused kernel's 4 or what the block holds;
// a block never holds more than kRouterSmemEntries scores.
TEST(CudaPlan, RouterTokensPerBlock) {
  struct Want {
    int64_t T, E, K;
    int threads;
    bool fused;
    uint32_t tpb;
  };
  for (const Want& w : {Want{1, 256, 6, 256, false, 1}, Want{1056, 256, 6, 256, false, 1},
                        Want{1057, 256, 6, 256, false, 4}, Want{1057, 384, 6, 256, false, 2},
                        Want{1057, 512, 8, 256, false, 2}, Want{2112, 256, 6, 256, true, 1},
                        Want{2113, 256, 6, 256, true, 4}, Want{4096, 384, 6, 256, true, 4},
                        Want{4096, 512, 16, 256, true, 3}, Want{4096, 384, 6, 64, true, 2},
                        Want{65536, 256, 8, 256, false, 4}, Want{65536, 512, 16, 256, false, 1},
                        Want{65536, 256, 6, 128, true, 4}, Want{65536, 64, 6, 256, false, 4},
                        Want{65536, 32, 1, 32, false, 1}, Want{0, 256, 6, 256, true, 1}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << w.T << " E=" << w.E << " K=" << w.K << " threads=" << w.threads
                                      << " fused=" << w.fused);
    EXPECT_EQ(mc::router_tokens_per_block(w.T, w.E, w.K, w.threads, w.fused, kH200), w.tpb);
  }
  for (int64_t E : {8, 64, 100, 256, 384, 512}) {
    for (int64_t K : {1, 6, 8, 16}) {
      if (K > E) continue;
      for (int threads : {32, 128, 256}) {
        EXPECT_EQ(mc::router_tokens_per_block(int64_t{1} << 20, E, K, threads, true, kH200),
                  std::min<int64_t>({4, threads / 32, mc::kRouterSmemEntries / E}));
        const uint32_t t = mc::router_tokens_per_block(int64_t{1} << 20, E, K, threads, false, kH200);
        const uint32_t warps = static_cast<uint32_t>(threads / 32);
        EXPECT_GE(t, 1u);
        EXPECT_LE(t, warps);
        EXPECT_LE(t * E, mc::kRouterSmemEntries);
        if (t > 1) {
          const uint32_t cols = static_cast<uint32_t>((E + 31) / 32);
          const uint32_t g = mc::router_group(warps, t, static_cast<uint32_t>(E), static_cast<uint32_t>(K));
          EXPECT_LE((cols + g - 1) / g, mc::kRouterRegColumns) << "E=" << E << " K=" << K << " threads=" << threads;
          EXPECT_EQ(mc::router_columns_per_warp(warps, t, static_cast<uint32_t>(E), static_cast<uint32_t>(K)),
                    (cols + g - 1) / g);
          EXPECT_LE(g * K, 32u);
        }
      }
    }
  }
  // Other SM counts scale the one-token range.
  EXPECT_EQ(mc::router_tokens_per_block(8 * 78, 256, 6, 256, false, mc::DeviceInfo{78, 90}), 1u);
  EXPECT_EQ(mc::router_tokens_per_block(8 * 78 + 1, 256, 6, 256, false, mc::DeviceInfo{78, 90}), 4u);
}

// The fused kernel's decode variant while its router blocks fit one wave of 4 blocks an SM.
TEST(CudaPlan, FusedDecodeVariantWhileTheRouterBlocksFitAWave) {
  EXPECT_TRUE(mc::fused_decode_variant(1, kH200));
  EXPECT_TRUE(mc::fused_decode_variant(4 * 132, kH200));
  EXPECT_FALSE(mc::fused_decode_variant(4 * 132 + 1, kH200));
  EXPECT_TRUE(mc::fused_decode_variant(4 * 20, mc::DeviceInfo{20, 90}));
  EXPECT_FALSE(mc::fused_decode_variant(4 * 20 + 1, mc::DeviceInfo{20, 90}));
}

// ---------------------------------------------------------------------------------------
// The routing-only and router launches as plan values (routing_plan, router_plan).

TEST(CudaPlan, RoutingPlanOneThreadPerEntryCappedGrid) {
  for (int64_t M : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{1} << 24}) {
    for (int64_t K : {1, 6, 8}) {
      const mc::RoutingPlan p = mc::routing_plan(M, K, false, kH200);
      SCOPED_TRACE(mc::to_string(p));
      EXPECT_EQ(p.threads, 256);
      EXPECT_EQ(p.grid, M * K == 0 ? 0 : std::min<int64_t>((M * K + 255) / 256, mc::kRoutingMaxBlocks));
      EXPECT_FALSE(p.pdl);
    }
  }
  EXPECT_TRUE(mc::routing_plan(4, 8, true, kH200).pdl);
  EXPECT_FALSE(mc::routing_plan(4, 8, true, mc::DeviceInfo{108, 80}).pdl);
  EXPECT_EQ(mc::to_string(mc::routing_plan(4, 8, true, kH200)), "kernel=routing threads=256 grid=1 pdl=on");
}

/// A router call at made-up device addresses, with route_and_stage's staging from FakeCall.
struct FakeRouter {
  FakeCall stage;
  megamoe::RouterArgs r;
  FakeRouter(int64_t T, int64_t E, const QuantScheme& q, const Opts& o = {}) : stage(T, 7168, q, o) {
    const Device d = Device::cuda(0);
    r.router_logits = TensorRef(stage.alloc(T * E * 4), DType::kFloat32, {T, E}, d);
    r.e_score_correction_bias = TensorRef(stage.alloc(E * 4), DType::kFloat32, {E}, d);
    r.top_k = o.K;
    r.topk_ids = TensorRef(stage.alloc(T * o.K * 4), DType::kInt32, {T, o.K}, d);
    r.topk_weights = TensorRef(stage.alloc(T * o.K * 4), DType::kFloat32, {T, o.K}, d);
  }
  mc::RouterPlan route(const mc::DeviceInfo& dev = kH200) const {
    return mc::router_plan(megamoe::detail::validate_router(r, nullptr), nullptr, r.enable_pdl, dev);
  }
  mc::RouterPlan route_and_stage(const mc::DeviceInfo& dev = kH200) const {
    const StageArgs a = megamoe::detail::staged_args(r, stage.a);
    return mc::router_plan(megamoe::detail::validate_router(r, &stage.a), &a, stage.a.enable_pdl, dev);
  }
  /// The staging plan of the same call run by the staging kernel.
  mc::Plan staging_plan() const {
    const StageArgs a = megamoe::detail::staged_args(r, stage.a);
    return mc::plan(megamoe::detail::validate_router(r, &stage.a).stage, a, kH200);
  }
};

TEST(CudaPlan, RouterPlanOfRouteIsTheRouterKernel) {
  for (int64_t T : {1, 64, 1056, 1057, 65536}) {
    for (int64_t E : {256, 384}) {
      const mc::RouterPlan p = FakeRouter(T, E, QuantScheme::mxfp8()).route();
      SCOPED_TRACE(mc::to_string(p));
      EXPECT_EQ(p.launch, mc::RouterLaunch::kRouter);
      EXPECT_EQ(p.threads, 256);
      EXPECT_EQ(p.tokens_per_block, mc::router_tokens_per_block(T, E, 8, 256, false, kH200));
      EXPECT_EQ(p.router_blocks, (T + p.tokens_per_block - 1) / p.tokens_per_block);
      EXPECT_EQ(mc::to_string(p).rfind("kernel=router threads=256 tokens_per_block=", 0), 0u);
    }
  }
}

TEST(CudaPlan, RouterPlanFusesFastStagingPlans) {
  for (const QuantScheme& q : kAll) {
    for (int64_t T : {1, 2, 64, 2048, 16384}) {
      const FakeRouter c(T, 256, q);
      const mc::RouterPlan p = c.route_and_stage();
      const mc::Plan staging = c.staging_plan();
      SCOPED_TRACE(mc::to_string(p) + " / staging kernel: " + mc::to_string(staging));
      if (staging.role != mc::Role::kFast) {
        EXPECT_EQ(p.launch, mc::RouterLaunch::kRouterThenStage);
        EXPECT_EQ(p.threads, 256);
        EXPECT_EQ(mc::to_string(p.stage), mc::to_string(staging));  // the second launch is the staging plan
        continue;
      }
      EXPECT_EQ(p.launch, mc::RouterLaunch::kFused);
      // The fused kernel's quantizing blocks: whole chunks, no multiplier table, split-topk
      // in blocks of at least 256 threads; the router blocks follow them in the grid.
      EXPECT_NE(p.stage.shape, mc::Shape::kSplitHalf);
      if (p.stage.shape == mc::Shape::kSplitTopk) {
        EXPECT_GE(p.stage.threads, 256);
      }
      EXPECT_EQ(p.threads, p.stage.threads);
      EXPECT_EQ(p.tokens_per_block, mc::router_tokens_per_block(T, 256, 8, p.threads, true, kH200));
      EXPECT_EQ(p.router_blocks, (T + p.tokens_per_block - 1) / p.tokens_per_block);
      EXPECT_EQ(p.fused.grid, p.stage.quant_blocks + p.router_blocks);
      EXPECT_EQ(mc::to_string(p.fused), mc::to_string([&] {  // the staging plan but for the grid
        mc::Plan f = p.stage;
        f.grid = p.fused.grid;
        return f;
      }()));
      EXPECT_EQ(p.decode, mc::fused_decode_variant(p.router_blocks, kH200));
      EXPECT_EQ(p.stage.fmt, staging.fmt);
      EXPECT_EQ(p.stage.index, staging.index);
      EXPECT_EQ(p.stage.store, staging.store);
      // Without a split-half shape or NVFP4 static's table-driven loop, the staging
      // kernel's shape stands.
      if (staging.shape != mc::Shape::kSplitHalf && !(q == QuantScheme::nvfp4_static())) {
        EXPECT_EQ(p.stage.shape, staging.shape);
      }
      const megamoe::detail::RouterProblem pr = megamoe::detail::validate_router(c.r, &c.stage.a);
      EXPECT_NO_THROW(mc::check_plan(p.stage, pr.stage, megamoe::detail::staged_args(c.r, c.stage.a)));
      EXPECT_NE(mc::to_string(p).find("kernel=router+stage (one launch)"), std::string::npos);
      EXPECT_NE(mc::to_string(p).find("| quantizing blocks: " + mc::to_string(p.stage)), std::string::npos);
    }
  }
  // MXFP4 at T = 1: the staging kernel's split-half shape becomes whole chunks.
  const FakeRouter c(1, 256, QuantScheme::mxfp4());
  EXPECT_EQ(c.staging_plan().shape, mc::Shape::kSplitHalf);
  EXPECT_EQ(c.route_and_stage().stage.shape, mc::Shape::kSplitTopk);
  EXPECT_EQ(c.route_and_stage().stage.threads, 256);
}

TEST(CudaPlan, RouterPlanTwoLaunchesForGenericStaging) {
  Opts o;
  o.strided_hidden = true;
  o.hidden_col_stride = true;
  const FakeRouter c(64, 256, QuantScheme::mxfp8(), o);
  const mc::RouterPlan p = c.route_and_stage();
  EXPECT_EQ(p.launch, mc::RouterLaunch::kRouterThenStage);
  EXPECT_EQ(p.stage.role, mc::Role::kGeneric);
  EXPECT_NE(mc::to_string(p).find(" ; then kernel=generic"), std::string::npos) << mc::to_string(p);
}

TEST(CudaPlan, RouterPlanFillsTheTailWithoutTokens) {
  Opts o;
  o.max_tokens = 4096;
  const FakeRouter c(0, 256, QuantScheme::mxfp8(), o);
  const mc::RouterPlan p = c.route_and_stage();
  EXPECT_EQ(p.launch, mc::RouterLaunch::kRouter);
  EXPECT_EQ(p.router_blocks, (4096 * 8 + 256 * mc::kRouterTailPerThread - 1) / (256 * mc::kRouterTailPerThread));
}

TEST(CudaPlan, RouterPlanPdlNeedsSm90) {
  FakeRouter c(8, 256, QuantScheme::mxfp8());
  c.r.enable_pdl = true;
  EXPECT_TRUE(c.route().pdl);
  EXPECT_FALSE(c.route(mc::DeviceInfo{108, 80}).pdl);
  EXPECT_FALSE(c.route_and_stage().pdl);  // route_and_stage takes StageArgs::enable_pdl
  c.stage.a.enable_pdl = true;
  EXPECT_TRUE(c.route_and_stage().pdl);
}

// The norm kernel: one block a row, threads = min(N, 256) for the tree width N (the power
// of two >= H / 16), N / threads chunk slots a thread, the row's bf16 values in shared memory.
TEST(CudaPlan, NormPlanFollowsTheTreeWidth) {
  const mc::DeviceInfo dev{132, 90};
  struct Want {
    int64_t H;
    int threads, per_thread;
  };
  for (const Want w : {Want{128, 8, 1}, Want{2048, 128, 1}, Want{4096, 256, 1}, Want{7168, 256, 2},
                       Want{mc::kNormMaxH, 256, 16}}) {
    const mc::NormPlan np = mc::norm_plan(5, w.H, true, dev);
    EXPECT_EQ(np.threads, w.threads) << w.H;
    EXPECT_EQ(np.per_thread, w.per_thread) << w.H;
    EXPECT_EQ(np.grid, 5);
    EXPECT_EQ(np.smem, w.H * 2);
    EXPECT_TRUE(np.pdl);
    EXPECT_EQ(int64_t{np.threads} * np.per_thread * 16 >= w.H, true);
  }
  EXPECT_EQ(mc::norm_plan(0, 7168, false, dev).grid, 0);
  EXPECT_FALSE(mc::norm_plan(3, 7168, true, mc::DeviceInfo{132, 80}).pdl);
  EXPECT_EQ(mc::to_string(mc::norm_plan(4, 7168, false, dev)), "kernel=rmsnorm threads=256 grid=4 smem=14336 per_thread=2 pdl=off");
}

// The fused norm kernel: the same row blocks, then ceil(tail entries / (threads * 4))
// blocks marking the full-buffer tail; a grid past CUDA's limit is refused.
TEST(CudaPlan, FusedNormPlanAddsTailBlocks) {
  const mc::DeviceInfo dev{132, 90};
  const mc::NormPlan np = mc::norm_plan(4, 7168, true, dev, true, 36 * 6);
  EXPECT_TRUE(np.fused);
  EXPECT_EQ(np.tail_blocks, 1);
  EXPECT_EQ(np.grid, 5);
  EXPECT_EQ(mc::to_string(np), "kernel=rmsnorm_stage threads=256 grid=5 smem=14336 per_thread=2 tail_blocks=1 pdl=on");
  EXPECT_EQ(mc::norm_plan(4, 7168, false, dev, true, 0).tail_blocks, 0);
  EXPECT_EQ(mc::norm_plan(4, 7168, false, dev, true, 1025).tail_blocks, 2);  // 1024 entries a block
  // A whole warp at least (the lanes stage groups together): 128 entries a tail block.
  const mc::NormPlan narrow = mc::norm_plan(4, 128, false, dev, true, 129);
  EXPECT_EQ(narrow.threads, 32);
  EXPECT_EQ(narrow.per_thread, 1);
  EXPECT_EQ(narrow.tail_blocks, 2);
  EXPECT_EQ(mc::norm_plan(4, 128, false, dev, false, 0).threads, 8);  // the unfused kernel: the tree's width
  EXPECT_EQ(mc::norm_plan(4, 7168, false, dev, false, 5000).tail_blocks, 0);  // the unfused kernel has none
  EXPECT_THROW(mc::norm_plan(mc::kMaxGridBlocks, 7168, false, dev, true, 1), megamoe::Error);
}

// The mHC kernel: one block a token, threads = min(N_K, 256), at least 32, for the mixed
// row's tree width N_K (the power of two >= hc H / 16); per_thread / lanes of both trees;
// the sums in passes of 4; tail blocks when fused; rows past kMhcMaxK refused.
TEST(CudaPlan, MhcPlanFollowsBothTrees) {
  const mc::DeviceInfo dev{132, 90};
  struct Want {
    int64_t H;
    int hc, threads, per_thread_k, lanes_k, per_thread_h, lanes_h, passes;
  };
  for (const Want w : {Want{128, 1, 32, 1, 8, 1, 8, 1}, Want{384, 1, 32, 1, 32, 1, 32, 1},
                       Want{128, 4, 32, 1, 32, 1, 8, 7}, Want{4096, 4, 256, 4, 256, 1, 256, 7},
                       Want{7168, 4, 256, 8, 256, 2, 256, 7}, Want{7168, 8, 256, 16, 256, 2, 256, 21},
                       Want{4096, 16, 256, 16, 256, 1, 256, 73}}) {
    const mc::MhcPlan mp = mc::mhc_plan(5, w.H, w.hc, true, dev);
    const std::string at = std::to_string(w.H) + " hc=" + std::to_string(w.hc);
    EXPECT_EQ(mp.threads, w.threads) << at;
    EXPECT_EQ(mp.per_thread_k, w.per_thread_k) << at;
    EXPECT_EQ(mp.lanes_k, w.lanes_k) << at;
    EXPECT_EQ(mp.per_thread_h, w.per_thread_h) << at;
    EXPECT_EQ(mp.lanes_h, w.lanes_h) << at;
    EXPECT_EQ(mp.passes, w.passes) << at;
    EXPECT_EQ(mp.mix_group, 4);
    EXPECT_EQ(mp.grid, 5);
    EXPECT_EQ(mp.smem, w.H * w.hc * 2);
    EXPECT_TRUE(mp.pdl);
    EXPECT_LE(mp.per_thread_k, 16) << at;  // the kernel's register slots
  }
  EXPECT_EQ(mc::mhc_plan(0, 7168, 4, false, dev).grid, 0);
  EXPECT_FALSE(mc::mhc_plan(3, 7168, 4, true, mc::DeviceInfo{132, 80}).pdl);
  EXPECT_EQ(mc::to_string(mc::mhc_plan(4, 7168, 4, false, dev)),
            "kernel=mhc threads=256 grid=4 smem=57344 per_thread_k=8 lanes_k=256 per_thread_h=2 lanes_h=256 "
            "mix_group=4 passes=7 pdl=off");
  const mc::MhcPlan fused = mc::mhc_plan(4, 7168, 4, true, dev, true, 36 * 6);
  EXPECT_EQ(mc::to_string(fused),
            "kernel=mhc_stage threads=256 grid=5 smem=57344 per_thread_k=8 lanes_k=256 per_thread_h=2 lanes_h=256 "
            "mix_group=4 passes=7 tail_blocks=1 pdl=on");
  EXPECT_EQ(mc::mhc_plan(4, 128, 1, false, dev, true, 129).tail_blocks, 2);  // 32 threads: 128 entries a block
  EXPECT_EQ(mc::mhc_plan(4, 7168, 4, false, dev, false, 5000).tail_blocks, 0);  // the unfused kernel has none
  EXPECT_THROW(mc::mhc_plan(1, 8192, 16, false, dev), megamoe::Error);  // hc H = 131072 > kMhcMaxK
  EXPECT_NO_THROW(mc::mhc_plan(1, mc::kMhcMaxK / 8, 8, false, dev));
  EXPECT_THROW(mc::mhc_plan(mc::kMaxGridBlocks, 7168, 4, false, dev, true, 1), megamoe::Error);
}

// The gate: blocks of kGateWarps experts times S = max(1, N / 32) chunk shares (N the tree
// width, the power of two >= ceil(H / 16)), so a share has at most 32 chunks (a warp's
// lanes); at most kGateTokens tokens a launch; one scratch allocation of the partial sums,
// the logits and the counters, each region 256-byte aligned.
TEST(CudaPlan, GatePlanSplitsTheTreeIntoShares) {
  const mc::DeviceInfo dev{132, 90};
  struct Want {
    int64_t H, chunks, width, shares, share_chunks;
  };
  for (const Want w : {Want{1, 1, 1, 1, 1}, Want{16, 1, 1, 1, 1}, Want{17, 2, 2, 1, 2}, Want{200, 13, 16, 1, 16},
                       Want{512, 32, 32, 1, 32}, Want{513, 33, 64, 2, 32}, Want{2048, 128, 128, 4, 32},
                       Want{4096, 256, 256, 8, 32}, Want{7168, 448, 512, 16, 32},
                       Want{mc::kGateMaxH, 4096, 4096, 128, 32}}) {
    const mc::GatePlan gp = mc::gate_plan(4, 256, w.H, false, dev);
    EXPECT_EQ(gp.chunks, w.chunks) << w.H;
    EXPECT_EQ(gp.width, w.width) << w.H;
    EXPECT_EQ(gp.shares, w.shares) << w.H;
    EXPECT_EQ(gp.share_chunks, w.share_chunks) << w.H;
    EXPECT_EQ(gp.shares * gp.share_chunks, gp.width) << w.H;
    EXPECT_EQ(gp.fold_per_lane, (w.shares + 31) / 32) << w.H;
    EXPECT_LE(gp.fold_per_lane, mc::kGateMaxFoldPerLane) << w.H;
    EXPECT_EQ(gp.tiles, 256 / mc::kGateWarps);
    EXPECT_EQ(gp.grid, gp.tiles * gp.shares) << w.H;
    EXPECT_EQ(gp.threads, 32 * mc::kGateWarps);
  }
  // Every width up to 8192 columns: shares of at most 32 chunks, S * M = N.
  for (int64_t H = 1; H <= 8192; H += 7) {
    const mc::GatePlan gp = mc::gate_plan(1, 64, H, false, dev);
    ASSERT_GE(gp.width, gp.chunks);
    ASSERT_LT(gp.width, 2 * gp.chunks + 1);
    ASSERT_LE(gp.share_chunks, 32);
    ASSERT_EQ(gp.shares * gp.share_chunks, gp.width);
    ASSERT_TRUE(gp.shares == 1 || gp.share_chunks == 32);
  }
  EXPECT_THROW(mc::gate_plan(4, 256, mc::kGateMaxH + 1, false, dev), megamoe::Error);
  EXPECT_EQ(mc::gate_plan(0, 256, 7168, false, dev).grid, 0);
}

// The split the gate kernel runs from a plan (kernels/gate.cuh), played on the host with
// core::gate_step / add_rn: lane m of share r chains chunk r + S m, a share folds by
// shuffle-down levels M/2 .. 1 (a lane past 31 reads itself), the last block's lane l
// holds shares l + 32 k, folds them inside the lane for the levels >= 32, then shuffles
// the levels below: the same bits as the contract's tree over all chunks, for trees of 1
// to 4096 chunks (1 to 128 shares).
TEST(CudaPlan, GatePlanSharesFoldToTheContractsTree) {
  namespace core = megamoe::core;
  const auto shuffle_fold = [](float (&lane)[32], int levels_from) {
    for (int h = levels_from / 2; h >= 1; h /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = core::add_rn(lane[l], l + h < 32 ? lane[l + h] : lane[l]);
      std::copy(next, next + 32, lane);
    }
  };
  uint32_t state = 12345;
  const auto rnd = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) * 0x1p-23f;
  };
  for (int64_t H : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{200}, int64_t{511}, int64_t{512},
                    int64_t{513}, int64_t{1000}, int64_t{2048}, int64_t{4096}, int64_t{7168}, int64_t{9000},
                    int64_t{30000}, mc::kGateMaxH}) {
    std::vector<float> y(static_cast<size_t>(H)), w(static_cast<size_t>(H));
    for (size_t i = 0; i < y.size(); ++i) {
      y[i] = rnd();
      w[i] = rnd() * 0.05f;
    }
    const mc::GatePlan gp = mc::gate_plan(1, 8, H, false, mc::DeviceInfo{132, 90});
    const int64_t n = gp.chunks, S = gp.shares;
    const auto chunk = [&](int64_t j) {
      return j < n ? core::gate_chunk(&y[static_cast<size_t>(16 * j)], &w[static_cast<size_t>(16 * j)],
                                      static_cast<int>(std::min<int64_t>(16, H - 16 * j)))
                   : 0.0f;
    };
    std::vector<float> tree(static_cast<size_t>(gp.width));
    for (int64_t j = 0; j < gp.width; ++j) tree[static_cast<size_t>(j)] = chunk(j);
    core::gate_fold<1>(tree.data(), gp.width);
    std::vector<float> partial(static_cast<size_t>(S));
    for (int64_t r = 0; r < S; ++r) {
      float lane[32];
      for (int m = 0; m < 32; ++m) lane[m] = m < gp.share_chunks ? chunk(r + S * m) : 0.0f;
      shuffle_fold(lane, static_cast<int>(gp.share_chunks));
      partial[static_cast<size_t>(r)] = lane[0];
    }
    float lane[32];
    for (int l = 0; l < 32; ++l) {
      float v[mc::kGateMaxFoldPerLane] = {};
      for (int64_t k = 0; k < gp.fold_per_lane; ++k) {
        if (l + 32 * k < S) v[k] = partial[static_cast<size_t>(l + 32 * k)];
      }
      for (int64_t m = gp.fold_per_lane; m > 1; m /= 2) {
        for (int64_t k = 0; k < m / 2; ++k) v[k] = core::add_rn(v[k], v[k + m / 2]);
      }
      lane[l] = v[0];
    }
    shuffle_fold(lane, static_cast<int>(std::min<int64_t>(S, 32)));
    EXPECT_EQ(core::float_bits(lane[0]), core::float_bits(tree[0])) << "H=" << H;
  }
}

TEST(CudaPlan, GatePlanScratchLaunchesAndPdl) {
  const mc::DeviceInfo dev{132, 90};
  // T = 4, E = 256, H = 7168: 16 shares x 4 tokens x 256 experts of partial sums (64 KiB),
  // then 4 x 256 logits, then 32 counters.
  const mc::GatePlan gp = mc::gate_plan(4, 256, 7168, true, dev);
  EXPECT_EQ(gp.partial_bytes, 16 * 4 * 256 * 4);
  EXPECT_EQ(gp.logits_at, 65536);
  EXPECT_EQ(gp.counters_at, 65536 + 4096);
  EXPECT_EQ(gp.counter_bytes, 32 * 4);
  EXPECT_EQ(gp.scratch_bytes, 65536 + 4096 + 256);
  EXPECT_TRUE(gp.pdl);
  EXPECT_TRUE(gp.decode);
  EXPECT_EQ(gp.launches, 1);
  EXPECT_EQ(mc::to_string(gp),
            "kernel=gate threads=256 tile=8 tiles=32 chunks=448 width=512 shares=16 share_chunks=32 fold_per_lane=1 "
            "grid=512 token_block=4 launches=1 scratch=69888 (partials 65536, logits at 65536, counters at 69632) "
            "pdl=on decode=on");
  EXPECT_FALSE(mc::gate_plan(4, 256, 7168, true, mc::DeviceInfo{108, 80}).pdl);
  EXPECT_FALSE(mc::gate_plan(4, 256, 7168, false, dev).pdl);
  // Odd E: a partial last tile.
  EXPECT_EQ(mc::gate_plan(1, 144, 4096, false, dev).tiles, 18);
  EXPECT_EQ(mc::gate_plan(1, 7, 4096, false, dev).tiles, 1);
  // Above the decode range: launches of kGateTokens tokens, counters for each.
  const mc::GatePlan big = mc::gate_plan(100, 384, 7168, true, dev);
  EXPECT_EQ(big.token_block, mc::kGateTokens);
  EXPECT_EQ(big.launches, 2);
  EXPECT_FALSE(big.decode);
  EXPECT_EQ(big.partial_bytes, 16 * 64 * 384 * 4);
  EXPECT_EQ(big.counter_bytes, 2 * 48 * 4);
  EXPECT_EQ(big.counters_at, big.logits_at + 100 * 384 * 4);
  EXPECT_EQ(mc::gate_plan(64, 512, 2048, false, dev).launches, 1);
  EXPECT_EQ(mc::gate_plan(65, 512, 2048, false, dev).launches, 2);
  // Every region 256-byte aligned, whatever T and E.
  for (int64_t T : {1, 3, 63, 64, 65, 1000}) {
    for (int64_t E : {1, 7, 144, 512}) {
      const mc::GatePlan g = mc::gate_plan(T, E, 300, false, dev);
      EXPECT_EQ(g.logits_at % 256, 0);
      EXPECT_EQ(g.counters_at % 256, 0);
      EXPECT_GE(g.logits_at, g.partial_bytes);
      EXPECT_GE(g.counters_at - g.logits_at, T * E * 4);
      EXPECT_GE(g.scratch_bytes - g.counters_at, g.counter_bytes);
      EXPECT_EQ(g.launches * g.token_block >= T, true);
    }
  }
  // Sizes whose scratch does not fit int64 are refused, not wrapped.
  EXPECT_THROW(mc::gate_plan(int64_t{1} << 55, 512, 7168, false, dev), megamoe::Error);
}

// The GPU tests' expected images come from the reference; here they are built for every
// format and several layouts from host mirrors alone (no device needed) and compared with
// what the CPU backend writes into the same poisoned buffers: equal images mean the
// harness lays the reference out right (the CPU backend itself is held to the reference
// by tests/cpp).
// bf16 pass-through: the copy kernel, one launch with the top-k and the full-buffer tail.
TEST(CudaPlan, Bf16CopyKernelEveryInputAndLayout) {
  for (DType in : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (int64_t T : {1, 64, 16384, 70000}) {
      for (int layout = 0; layout < 3; ++layout) {
        Opts o;
        o.in = in;
        o.hidden_col_stride = layout == 1;
        o.misaligned_hidden = layout == 2;
        o.nonfinite = T == 64;
        o.pdl = T == 1;
        const FakeCall c(T, 7168, QuantScheme::bf16(), o);
        const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
        const mc::Plan p = c.plan();
        SCOPED_TRACE(mc::to_string(p));
        EXPECT_EQ(p.role, mc::Role::kCopy);
        EXPECT_EQ(p.shape, mc::Shape::kCopy);
        EXPECT_EQ(p.fmt, Format::kBf16);
        EXPECT_EQ(p.vectorized, layout == 0);
        EXPECT_EQ(p.index, mc::IndexWidth::k64);
        EXPECT_EQ(p.store, mc::StorePolicy::kDefault);
        EXPECT_EQ(p.threads, mc::kCopyThreads);
        EXPECT_EQ(p.grid, p.quant_blocks);
        EXPECT_FALSE(p.fused_tail);
        EXPECT_EQ(p.count_nonfinite, o.nonfinite);
        EXPECT_EQ(p.pdl, o.pdl);
        // Enough blocks for the work up to the loop's cap (16 waves of 2048 threads an SM).
        const int64_t units = layout == 0 ? T * (7168 / 16) : T * 7168;
        EXPECT_EQ(p.grid, std::min<int64_t>((units + 255) / 256, int64_t{132} * 16 * 2048 / 256));
        EXPECT_NO_THROW(mc::check_plan(p, pr, c.a));
        EXPECT_EQ(mc::to_string(p).rfind("kernel=copy format=bf16 in=" + std::string(megamoe::dtype_name(in)), 0), 0u);
      }
    }
  }
}

TEST(CudaPlan, Bf16CopyKernelFillsTheTailInItsLaunch) {
  for (int64_t T : {1, 5, 4096}) {
    Opts o;
    o.max_tokens = T + 8192;
    const FakeCall c(T, 4096, QuantScheme::bf16(), o);
    const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
    const mc::Plan p = c.plan();
    SCOPED_TRACE(mc::to_string(p));
    EXPECT_TRUE(p.fused_tail);
    EXPECT_EQ(p.grid, p.quant_blocks);
    // At decode the tail's entries, not the chunks, size the grid.
    EXPECT_GE(p.grid * p.threads, std::min<int64_t>((T + 8192) * 8, int64_t{132} * 16 * 2048));
    EXPECT_NO_THROW(mc::check_plan(p, pr, c.a));
    mc::Plan q = p;
    q.fused_tail = false;  // the tail would be left to a second launch
    EXPECT_THROW(mc::check_plan(q, pr, c.a), megamoe::Error);
  }
}

TEST(CudaPlan, Bf16CheckRejectsOtherKernelsAndBadCopyPlans) {
  const FakeCall c(64, 7168, QuantScheme::bf16());
  const megamoe::detail::Problem pr = megamoe::detail::validate_args(c.a);
  const mc::Plan p = c.plan();
  auto rejected = [&](mc::Plan q, const char* what) {
    EXPECT_THROW(mc::check_plan(q, pr, c.a), megamoe::Error) << what;
  };
  mc::Plan q = p;
  q.role = mc::Role::kGeneric;
  q.shape = mc::Shape::kGeneric;
  rejected(q, "the generic kernel for bf16");
  q = p;
  q.role = mc::Role::kFast;
  q.shape = mc::Shape::kLoop;
  rejected(q, "the fast kernel for bf16");
  q = p;
  q.shape = mc::Shape::kLoop;
  rejected(q, "the copy kernel in another shape");
  q = p;
  q.threads = 512;
  rejected(q, "more threads than the launch bounds");
  q = p;
  q.index = mc::IndexWidth::k32;
  rejected(q, "32-bit indices");
  q = p;
  q.store = mc::StorePolicy::kEvictFirst;
  rejected(q, "evict-first stores");
  Opts o;
  o.hidden_col_stride = true;
  const FakeCall s(64, 7168, QuantScheme::bf16(), o);
  mc::Plan v = s.plan();
  v.vectorized = true;
  EXPECT_THROW(mc::check_plan(v, megamoe::detail::validate_args(s.a), s.a), megamoe::Error) << "vectorized strided rows";
  // And no other format runs the copy kernel.
  const FakeCall m(64, 7168, QuantScheme::mxfp8());
  mc::Plan w = c.plan();
  w.fmt = Format::kFp8Ue8m0;
  w.G = 32;
  EXPECT_THROW(mc::check_plan(w, megamoe::detail::validate_args(m.a), m.a), megamoe::Error) << "copy kernel for mxfp8";
}

TEST(CudaPlan, Bf16RouteAndStageIsTheRouterThenTheCopyKernel) {
  const FakeRouter c(64, 256, QuantScheme::bf16());
  const mc::RouterPlan p = c.route_and_stage();
  EXPECT_EQ(p.launch, mc::RouterLaunch::kRouterThenStage);
  EXPECT_EQ(p.stage.role, mc::Role::kCopy);
  EXPECT_NE(mc::to_string(p).find(" ; then kernel=copy format=bf16"), std::string::npos) << mc::to_string(p);
}

TEST(CudaHarness, ReferenceImagesEqualTheCpuBackend) {
  std::vector<QuantScheme> schemes = harness::all_schemes();
  // NVFP4 online (its global_scale an output image of the harness), floor 0 on inputs below
  // 2^-100 too (layout 2: fp32 times 2^-120).
  schemes.push_back(QuantScheme::nvfp4_online());
  schemes.push_back(QuantScheme::nvfp4_online().with_amax_floor(0.0f));
  for (const QuantScheme& q : schemes) {
    for (int layout = 0; layout < 3; ++layout) {
      harness::Case c;
      c.T = 37;
      c.H = 512;
      c.K = 5;
      c.q = q;
      c.count = true;
      c.in = layout == 0 ? DType::kBFloat16 : layout == 1 ? DType::kFloat16 : DType::kFloat32;
      c.hs_noncontig = c.misaligned = layout == 1;
      c.sf_mn_major = c.strided_topk = c.reversed_topk_in = layout == 2;
      if (q.ue8m0()) c.bm = 32, c.shared_transposed = layout != 0;
      c.tiny = q.scale2 == megamoe::Scale2::kOnline && q.amax_floor == 0.0f && layout == 2;
      harness::Staged s(c);
      s.fill_inputs(11 + layout);
      const harness::Images want = s.expected(), cpu = s.cpu_backend_images();
      const auto outs = s.outputs();
      for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(want[i] == cpu[i]) << outs[i].first << ": " << c.name();
    }
  }
}

}  // namespace
