// GPU staging tests: every format, every plan shape (forced through launch(plan)) and the
// library's own choice, eagerly and under CUDA-graph capture (two replays, the second on new
// inputs written into the same buffers), PDL off and on; every WHOLE output allocation is
// compared byte for byte with the oracle of stage_harness.h. Skipped without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/e2m1/fp32.h"
#include "formats/recipe.h"
#include "megamoe/plan.h"
#include "stage_harness.h"

namespace {

using namespace harness;

bool fast_format(const QuantScheme& q) { return q.scale2 != megamoe::Scale2::kPerToken; }

/// Plan changes of one shape, named.
struct Forced {
  const char* name;
  Force f;
};

/// Every plan shape that can run @p q on contiguous, aligned tensors.
std::vector<Forced> shapes_for(const QuantScheme& q) {
  using mc::IndexWidth;
  using mc::Role;
  using mc::Shape;
  using mc::StorePolicy;
  auto fast = [](Shape sh, int threads, StorePolicy st, IndexWidth ix = IndexWidth::k32) {
    return [=](mc::Plan& p) {
      p.role = Role::kFast;
      p.shape = sh;
      p.threads = threads;
      p.store = st;
      p.index = ix;
      p.vectorized = true;
    };
  };
  if (!fast_format(q)) {
    auto row = [](int threads, bool vectorized) {
      return [=](mc::Plan& p) {
        p.threads = threads;
        p.vectorized = vectorized;
        p.row_split = 1;
        p.row_wide = false;
      };
    };
    return {{"library", {}}, {"rowwise_t32", row(32, true)}, {"rowwise_t256", row(256, true)},
            {"rowwise_scalar_t64", row(64, false)}};
  }
  std::vector<Forced> v{{"library", {}},
          {"loop_t128", fast(Shape::kLoop, 128, StorePolicy::kDefault)},
          {"loop_t256_evict", fast(Shape::kLoop, 256, StorePolicy::kEvictFirst)},
          {"split_t64", fast(Shape::kSplitTopk, 64, StorePolicy::kDefault)},
          {"split_t256_evict", fast(Shape::kSplitTopk, 256, StorePolicy::kEvictFirst)},
          {"tile", fast(Shape::kTile, mc::kTileThreads, StorePolicy::kDefault)},
          {"tile_evict", fast(Shape::kTile, mc::kTileThreads, StorePolicy::kEvictFirst)},
          {"loop_64bit", fast(Shape::kLoop, 128, StorePolicy::kEvictFirst, IndexWidth::k64)},
          {"generic", [](mc::Plan& p) {
             p.role = Role::kGeneric;
             p.shape = Shape::kGeneric;
             p.index = IndexWidth::k64;
             p.store = StorePolicy::kDefault;
             p.vectorized = false;
             p.threads = 256;
           }}};
  if (q.elem == megamoe::QuantElem::kFloat4E2M1) {  // (16-bit inputs only: see half_applies)
    v.push_back({"split_half_t64", fast(Shape::kSplitHalf, 64, StorePolicy::kDefault)});
    v.push_back({"split_half_t256_evict", fast(Shape::kSplitHalf, 256, StorePolicy::kEvictFirst)});
  }
  return v;
}

/// A forced shape applies to the case: half chunks take 16-bit inputs.
bool half_applies(const Forced& f, const Case& c) {
  return std::string(f.name).rfind("split_half", 0) != 0 || c.in != DType::kFloat32;
}

// Every format x every plan shape, at sizes with partial blocks, partial tiles in both
// directions (T % 8 != 0, rows shorter than a warp's 512 columns) and K > H/16; inputs of
// all three dtypes; the counter on for some; shared and MN-major scales where the format
// allows them. Eager for every shape, graph + PDL for the library's own plan and the tile.
TEST(CudaStage, EveryFormatEveryShape) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : all_schemes()) {
    for (int64_t T : {1, 65, 135}) {
      for (int64_t H : {128, 7168}) {
        if (q.ue8m0() && (H / q.group_k) % 4 != 0) continue;  // no whole scale word
        Case c;
        c.T = T;
        c.H = H;
        c.q = q;
        c.K = H == 128 ? 9 : (T % 2 ? 8 : 16);
        c.in = T == 1 ? DType::kFloat16 : (T == 65 ? DType::kFloat32 : DType::kBFloat16);
        c.ids = T % 3 == 0 ? DType::kInt64 : DType::kInt32;
        c.w = T == 65 ? DType::kBFloat16 : DType::kFloat32;
        c.count = T != 65;
        if (q.ue8m0()) c.bm = T == 1 ? 8 : 96, c.shared_transposed = T % 2 == 1;
        c.sf_mn_major = T == 135;
        c.gs = T == 65 ? 0.0f : 0.37f;  // gs = 0: every quotient 0 / 0 -> the clamp's lower end
        for (const Forced& f : shapes_for(q)) {
          if (!half_applies(f, c)) continue;
          SCOPED_TRACE(std::string("shape ") + f.name);
          const bool both = !f.f || std::string(f.name) == "tile" || std::string(f.name) == "split_half_t64";
          run_case(c, false, false, f.f);
          if (both && !HasFailure()) run_case(c, true, true, f.f);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// The row kernel with a grid far smaller than T (one SM's wave): every block takes many
// rows in turn, through both shared buffers of its block max, on the register path
// (library threads, H <= 8192) and the two-pass path (32 threads, and H = 20480).
TEST(CudaStage, RowKernelBlocksTakeManyRows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Force same = [](mc::Plan&) {};
  const Force t32 = [](mc::Plan& p) { p.threads = 32, p.row_wide = false; };
  for (int64_t H : {128, 7168, 20480}) {
    for (DType in : {DType::kBFloat16, DType::kFloat32}) {
      for (const Force* f : {&same, &t32}) {
        Case c;
        c.T = 135;
        c.H = H;
        c.K = 8;
        c.q = QuantScheme::nvfp4_per_token();
        c.in = in;
        c.count = true;
        c.one_sm_waves = 1;
        SCOPED_TRACE(f == &same ? "library threads" : "32 threads");
        run_case(c, false, false, *f);
        if (!HasFailure()) run_case(c, true, true, *f);
        if (HasFailure()) return;
      }
    }
  }
}

// NVFP4 static's loop shape of bf16 (its per-block table of multipliers by scale byte,
// quantize_fast.cuh kRecipTable): blocks that take many chunks each, global scales for which
// every byte has a multiplier (1.0, 3e-3), one for which byte 0x38 has none (1 - 2^-24: its
// groups take the per-value division) and 0 (no byte has one), every loop variant.
TEST(CudaStage, Nvfp4StaticLoopTable) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  namespace core = megamoe::core;
  const float below_one = std::nextafter(1.0f, 0.0f);
  ASSERT_EQ(core::nvfp4_static_multiplier(core::nvfp4_static_divisor(0x38u, below_one)), 0.0f);
  ASSERT_NE(core::nvfp4_static_multiplier(core::nvfp4_static_divisor(0x38u, 1.0f)), 0.0f);
  for (float gs : {1.0f, below_one, 0.0f, 3e-3f}) {
    for (const Forced& f : shapes_for(QuantScheme::nvfp4_static())) {
      if (std::string(f.name).rfind("loop", 0) != 0 && std::string(f.name) != "library") continue;
      Case c;
      c.T = 135;
      c.H = 7168;
      c.K = 8;
      c.q = QuantScheme::nvfp4_static();
      c.gs = gs;
      c.count = gs == 0.0f;
      c.one_sm_waves = 1;
      SCOPED_TRACE(std::string("shape ") + f.name + " gs " + std::to_string(gs));
      run_case(c, false, false, f.f);
      if (HasFailure()) return;
    }
  }
}

// The library's own plan of NVFP4 static at a size where it takes the loop shape (4.6M
// chunks: beyond one pass of 16 waves; the loop then runs one wave), eager and in a graph.
TEST(CudaStage, Nvfp4StaticLoopTableLibraryPlan) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case big;
  big.T = 10240;
  big.H = 7168;
  big.q = QuantScheme::nvfp4_static();
  big.gs = std::nextafter(1.0f, 0.0f);
  run_case(big, false, false, {});
  if (!HasFailure()) run_case(big, true, true, {});
}

// The row kernel with each row shared by 2 or 4 blocks (Plan::row_split, the decode plan):
// the library's choice and forced splits, every input dtype, the counter on and off, rows of
// 1024 to 8192 elements (parts with idle threads: H / 16 not a multiple of the split's
// warps), and grids of one SM's wave where blocks take many row parts in turn.
TEST(CudaStage, RowKernelSplitRows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t H : {1024, 4096, 7168, 8192}) {
    for (int split : {0, 2, 4}) {
      const Force f = split == 0 ? Force{} : Force([=](mc::Plan& p) {
        p.row_split = split;
        p.row_wide = false;
        p.vectorized = true;
        p.threads = static_cast<int>((H / 16 / split + 31) / 32 * 32);
      });
      for (int64_t T : {1, 5, 33, 66}) {
        Case c;
        c.T = T;
        c.H = H;
        c.K = T == 5 ? 16 : 8;
        c.q = QuantScheme::nvfp4_per_token();
        c.in = T == 33 ? DType::kFloat32 : (T == 5 ? DType::kFloat16 : DType::kBFloat16);
        c.count = T != 66;
        c.one_sm_waves = T == 66 && split != 0 ? 1 : 0;
        SCOPED_TRACE("split " + std::to_string(split));
        run_case(c, false, false, f);
        if (!HasFailure() && T == 1) run_case(c, true, true, f);
        if (HasFailure()) return;
      }
    }
  }
}

// The wide row kernel (Plan::row_wide, the prefill plan of 16-bit rows): the library's
// choice (H > 4096) and forced wide plans, bf16 and f16, the counter on and off, rows of 128
// to 512 groups (whole and partial last warps: H = 2176, 7168), grids of one SM's wave where blocks
// take many rows in turn, and decode sizes forced wide; eager and in a graph.
TEST(CudaStage, RowKernelWide) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t H : {2048, 2176, 4096, 7168, 8192}) {
    for (bool forced : {false, true}) {
      const int threads = static_cast<int>((H / 16 / mc::kRowWideGroups + 31) / 32 * 32);
      const Force f = !forced ? Force{} : Force([=](mc::Plan& p) {
        p.row_wide = true;
        p.row_split = 1;
        p.vectorized = true;
        p.threads = threads;
      });
      for (int64_t T : {1, 67, 300}) {
        if (!forced && (T != 300 || H <= 4096)) continue;  // the library's wide plans: T > SMs, H > 4096
        Case c;
        c.T = T;
        c.H = H;
        c.K = T == 67 ? 16 : 8;
        c.q = QuantScheme::nvfp4_per_token();
        c.in = T == 67 ? DType::kFloat16 : DType::kBFloat16;
        c.count = T != 1;
        c.one_sm_waves = T == 300 && forced ? 1 : 0;
        SCOPED_TRACE(std::string(forced ? "forced" : "library") + " T " + std::to_string(T));
        if (!forced) {  // the library's plan for these tensors is the wide one
          Staged s(c);
          ASSERT_TRUE(s.ok()) << "cudaMalloc";
          const StageArgs a = s.args(true, false);
          const mc::Plan lib = mc::plan(megamoe::detail::validate_args(a), a, mc::device_info(0));
          EXPECT_TRUE(lib.row_wide) << mc::to_string(lib);
        }
        run_case(c, false, false, f);
        if (!HasFailure() && T != 67) run_case(c, true, true, f);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(CudaStage, InputDtypesAndTopK) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : {QuantScheme::mxfp8(), QuantScheme::mxfp4(), QuantScheme::nvfp4_static(),
                               QuantScheme::nvfp4_per_token()}) {
    for (int64_t K : {1, 9, 16}) {
      for (DType ids : {DType::kInt32, DType::kInt64}) {
        for (DType w : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          for (DType in : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
            Case c;
            c.T = 65;
            c.H = 256;
            c.K = K;
            c.q = q;
            c.ids = ids;
            c.w = w;
            c.in = in;
            c.strided_topk = (K % 2) == 1;
            run_all_modes(c);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

TEST(CudaStage, StridesAlignmentAndLayouts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : all_schemes()) {
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
      c.count = variant % 2 == 0;
      if (q.ue8m0() && variant >= 1) c.bm = 96, c.shared_transposed = true;
      for (DType in : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
        c.in = in;
        run_all_modes(c);
        if (HasFailure()) return;
      }
    }
  }
}

// Every tensor of wider elements one byte off its element size (a data pointer the kernels
// cannot access as typed words): staged through aligned copies (cuda/aligned.cuh), the
// same bytes in every buffer, gaps included, eagerly and under graph capture (the copies'
// scratch become allocation and free nodes), with and without the counter.
TEST(CudaStage, ElementMisalignedTensors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : all_schemes()) {
    for (int64_t T : {1, 135}) {
      Case c;
      c.T = T;
      c.H = 2048;
      c.q = q;
      c.skewed = true;
      c.count = T == 135;
      c.strided_topk = T == 1;
      c.reversed_topk_in = T == 135;  // negative strides
      if (q.ue8m0()) c.bm = 96;
      for (DType in : {DType::kBFloat16, DType::kFloat32}) {
        c.in = in;
        run_all_modes(c);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(CudaStage, SharedScalesAllBlockM) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : {QuantScheme::mxfp8(), QuantScheme::mxfp4()}) {
    for (int64_t bm : {8, 32, 96, 128, 192}) {
      for (int64_t T : {1, 135, 434}) {
        for (bool transposed : {false, true}) {
          Case c;
          c.T = T;
          c.H = 7168;
          c.q = q;
          c.bm = bm;
          c.shared_transposed = transposed;
          run_all_modes(c);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// Sizes where the library picks token tiles (MN-major x_sf, transposed shared_x_sf, at
// least 2^18 chunks), with a last partial tile of tokens.
TEST(CudaStage, TokenTilesForMnMajorScales) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : all_schemes()) {
    if (!fast_format(q)) continue;
    for (int64_t T : {1030, 4099}) {
      Case c;
      c.T = T;
      c.H = 4096;
      c.q = q;
      c.sf_mn_major = true;
      if (q.ue8m0()) c.bm = T == 1030 ? 64 : 96, c.shared_transposed = true;
      run_all_modes(c);
      if (HasFailure()) return;
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
      c.count = G % 2 == 0;
      if (ue) c.bm = 32;
      run_all_modes(c);
      if (HasFailure()) return;
    }
  }
}

// The counter counts exactly: hidden rows with a known number of NaN / +-Inf (padded
// tokens' too, they are quantized like the others), added to what the counter held, again
// on a second call; every format, on each of its kernels (fast, generic, row).
TEST(CudaStage, NonfiniteCounterCountsExactlyAndAccumulates) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const QuantScheme& q : all_schemes()) {
    for (int layout = 0; layout < 2; ++layout) {
      for (DType in : {DType::kBFloat16, DType::kFloat32}) {
        Case c;
        c.T = 37;
        c.H = 1024;
        c.q = q;
        c.in = in;
        c.count = true;
        c.misaligned = layout == 1;  // the generic kernel (the row kernel's scalar loads)
        c.edge_values = false;
        SCOPED_TRACE(c.name());
        Staged s(c);
        ASSERT_TRUE(s.ok());
        s.fill_inputs(5);
        // Overwrite element (t, h) with a special value where (t * 31 + h * 7) % 97 == 0.
        int64_t specials = 0;
        const float kinds[] = {NAN, -NAN, INFINITY, -INFINITY};
        for (int64_t t = 0; t < c.T; ++t) {
          for (int64_t h = 0; h < c.H; ++h) {
            if ((t * 31 + h * 7) % 97 != 0) continue;
            const float v = kinds[specials % 4];
            uint8_t* dst = s.hsb->host.data() + s.hs.at(t, h);
            if (in == DType::kFloat32) {
              std::memcpy(dst, &v, 4);
            } else {
              const uint16_t b = f32_to_bf16_trunc(v);
              std::memcpy(dst, &b, 2);
            }
            ++specials;
          }
        }
        s.hsb->upload();
        ASSERT_GT(specials, 300);
        s.poison_outputs();
        cudaStream_t stream;
        CUDA_OK(cudaStreamCreate(&stream));
        for (int call = 1; call <= 2; ++call) {
          stage_on_device(s, {}, false, stream);
          CUDA_OK(cudaStreamSynchronize(stream));
          int64_t got = 0;
          CUDA_OK(cudaMemcpy(&got, static_cast<uint8_t*>(s.nfb->dev) + s.nf.at(0), 8, cudaMemcpyDeviceToHost));
          EXPECT_EQ(got, s.counter_start + call * specials) << "after call " << call;
        }
        cudaStreamDestroy(stream);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(CudaStage, CounterAbsentLeavesItsBufferAlone) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 65;
  c.H = 1024;
  c.count = false;
  Staged s(c);
  ASSERT_TRUE(s.ok());
  s.fill_inputs(3);
  s.poison_outputs();
  stage_on_device(s, {}, false, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  int64_t got = 0;
  CUDA_OK(cudaMemcpy(&got, static_cast<uint8_t*>(s.nfb->dev) + s.nf.at(0), 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, s.counter_start);
}

TEST(CudaStage, LargeT) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 16384;
  c.H = 7168;
  c.edge_values = false;
  run_case(c, false, false);
  if (HasFailure()) return;
  c.q = QuantScheme::nvfp4_per_token();
  c.count = true;
  run_case(c, false, true);
  if (HasFailure()) return;
  c.T = 70000;  // more rows than a grid's y/z dimension allows
  c.H = 2048;
  c.q = QuantScheme::mxfp8();
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

/// The nodes of a graph captured around prepare_inputs(@p a).
size_t captured_nodes(const StageArgs& a) {
  cudaStream_t s;
  EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaGraph_t g;
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  megamoe::prepare_inputs(a, s);
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  size_t nodes = 99;
  EXPECT_EQ(cudaGraphGetNodes(g, nullptr, &nodes), cudaSuccess);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return nodes;
}

TEST(CudaStage, ZeroTokensLaunchesNothing) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // T == 0: no error, no launch, even under capture (an empty graph).
  StageArgs a;
  a.hidden_states = TensorRef(reinterpret_cast<void*>(16), DType::kBFloat16, {0, 7168}, Device::cuda(0));
  EXPECT_EQ(captured_nodes(a), 0u);
}

// NVFP4 online: x_q, x_sf and the global scale it writes against the reference, eagerly
// (under both poisons) and in a graph whose second replay sees new inputs (gs follows them),
// PDL off and on; one amax block storing gs (decode sizes) and many accumulating after a
// memset (the prefill sizes); floors 1e-4 and 0, the latter with inputs below 2^-100 (the
// unit scale, stored by the single block or mapped and stored by the staging kernel).
TEST(CudaStage, Nvfp4Online) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Size {
    int64_t T, H;
    DType in;
  };
  for (float floor : {1e-4f, 0.0f}) {
    for (const Size z : {Size{1, 7168, DType::kBFloat16}, Size{65, 128, DType::kFloat32}, Size{300, 7168, DType::kFloat16},
                         Size{4096, 4096, DType::kBFloat16}, Size{2000, 7168, DType::kFloat32}}) {
      for (bool tiny : {false, true}) {
        if (tiny && floor != 0.0f) continue;
        Case c;
        c.T = z.T;
        c.H = z.H;
        c.in = z.in;
        c.q = QuantScheme::nvfp4_online().with_amax_floor(floor);
        c.edge_values = z.T == 65;  // an Inf among them: gs = Inf
        c.count = z.T != 300;
        c.tiny = tiny;
        run_all_modes(c);
        if (HasFailure()) return;
      }
    }
  }
}

// NVFP4 online on odd layouts: strided hidden rows, every tensor one element off (the
// amax kernel's strided path), tensors off their element size (dense copies, global_scale
// scattered back), MN-major scales, column-major top-k.
TEST(CudaStage, Nvfp4OnlineLayouts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int variant = 0; variant < 4; ++variant) {
    for (int64_t T : {3, 1500}) {
      Case c;
      c.T = T;
      c.H = 1024;
      c.q = QuantScheme::nvfp4_online().with_amax_floor(variant == 3 ? 0.0f : 1e-4f);
      c.edge_values = false;
      c.count = true;
      c.hs_noncontig = variant == 0;
      c.misaligned = variant == 1;
      c.skewed = variant == 2;
      c.sf_mn_major = variant == 3;
      c.strided_topk = variant == 3;
      c.tiny = variant == 3 && T == 1500;
      run_case(c, false, false);
      if (!HasFailure()) run_case(c, true, true);
      if (HasFailure()) return;
    }
  }
}

// NVFP4 online's explain() names both launches; T == 0 launches nothing.
TEST(CudaStage, Nvfp4OnlineExplainAndZeroTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t T : {1, 4096}) {
    Case c;
    c.T = T;
    c.q = QuantScheme::nvfp4_online();
    Staged s(c);
    ASSERT_TRUE(s.ok());
    const std::string e = megamoe::explain(s.args(true));
    const std::string want = T == 1 ? "cuda backend: nvfp4_online: amax(grid=1 " : "cuda backend: nvfp4_online: memset + amax(";
    EXPECT_EQ(e.rfind(want, 0), 0u) << e;
    EXPECT_NE(e.find(" + static staging: kernel="), std::string::npos) << e;
  }
  Case z;
  z.T = 0;
  z.q = QuantScheme::nvfp4_online();
  Staged s(z);
  ASSERT_TRUE(s.ok());
  s.poison_outputs();
  EXPECT_EQ(captured_nodes(s.args(true)), 0u);
  for (uint8_t b : s.gsob->download()) EXPECT_EQ(b, s.poison) << "global_scale written at T = 0";
}

TEST(CudaStage, ExplainNamesThePlan) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 64;
  c.q = QuantScheme::nvfp4_per_token();
  Staged s(c);
  ASSERT_TRUE(s.ok());
  const std::string e = megamoe::explain(s.args(true));
  EXPECT_EQ(e.rfind("cuda backend: kernel=rowwise format=nvfp4_per_token", 0), 0u) << e;
  const std::string h = megamoe::explain(s.args(false));
  EXPECT_EQ(h.rfind("cpu backend:", 0), 0u) << h;
}

TEST(CudaStage, ExplainNamesTheRoutingPlan) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 64;
  Staged s(c);
  ASSERT_TRUE(s.ok());
  const megamoe::StageArgs a = s.args(true);
  megamoe::RoutingArgs r;
  r.topk_ids = a.topk_ids;
  r.topk_weights = a.topk_weights;
  r.topk_idx_out = a.topk_idx_out;
  r.topk_weights_out = a.topk_weights_out;
  const std::string e = megamoe::explain(r);
  const int64_t blocks = (a.topk_ids.shape[0] * a.topk_ids.shape[1] + 255) / 256;
  EXPECT_EQ(e, "cuda backend: kernel=routing threads=256 grid=" + std::to_string(blocks) + " pdl=off") << e;
}

// ---------------------------------------------------------------------------------------
// bf16 pass-through (the copy kernel): every input dtype, contiguous and strided layouts,
// the vectorized and the any-stride path forced on the same call, the full-buffer tail and
// the counter in the one launch, PDL, a graph replay. Every byte of every output allocation
// (poisoned first) equals the CPU backend's, and x_q equals megamoe_ref::bf16_rne.

/// One bf16 staging call's host and device allocations.
struct Bf16Call {
  int64_t T, H, K, M;
  DType in;
  View hs, xq, ids, w, io, wo, pad, cnt;
  Buf bhs, bxq, bids, bw, bio, bwo, bpad, bcnt;
  Bf16Call(int64_t T_, int64_t H_, int64_t K_, DType in_, int layout, int64_t M_)
      : T(T_), H(H_), K(K_), M(M_), in(in_),
        hs(layout == 1 ? View{in_, 2, {T_, H_}, {2 * H_ + 8, 2}, 0} : dense(in_, T_, H_)),
        xq(layout == 2 ? View{DType::kBFloat16, 2, {M_, H_}, {1, M_}, 0} : dense(DType::kBFloat16, M_, H_)),
        ids(dense(DType::kInt64, T_, K_)), w(dense(DType::kBFloat16, T_, K_)), io(dense(DType::kInt64, M_, K_)),
        wo(dense(DType::kFloat32, M_, K_)), pad(vec(DType::kBool, T_, 1)), cnt(vec(DType::kInt64, 1, 1)),
        bhs(hs.bytes()), bxq(xq.bytes()), bids(ids.bytes()), bw(w.bytes()), bio(io.bytes()), bwo(wo.bytes()),
        bpad(pad.bytes()), bcnt(cnt.bytes()) {}
  bool ok() const {
    for (const Buf* b : {&bhs, &bxq, &bids, &bw, &bio, &bwo, &bpad, &bcnt}) {
      if (b->dev == nullptr) return false;
    }
    return true;
  }
  void fill(uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& b : bhs.host) b = static_cast<uint8_t>(rng());
    if (in == DType::kFloat32) {  // plant ties and overflow edges among the random bits
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < H; h += 3) {
          uint32_t v;
          std::memcpy(&v, bhs.host.data() + hs.at(t, h), 4);
          v = (v & 0xFFFF0000u) | 0x8000u;
          std::memcpy(bhs.host.data() + hs.at(t, h), &v, 4);
        }
      }
    }
    for (int64_t i = 0; i < T * K; ++i) {
      const int64_t id = static_cast<int64_t>(rng() % 384);
      const uint16_t wb = static_cast<uint16_t>(0x3C00u + rng() % 512);
      std::memcpy(bids.host.data() + ids.at(i / K, i % K), &id, 8);
      std::memcpy(bw.host.data() + w.at(i / K, i % K), &wb, 2);
    }
    for (int64_t t = 0; t < T; ++t) bpad.host[static_cast<size_t>(pad.at(t))] = t % 5 == 1;
    for (Buf* b : {&bhs, &bids, &bw, &bpad}) b->upload();
    for (Buf* b : {&bxq, &bio, &bwo}) b->poison(0x5A);
    const int64_t zero = 3;
    std::memcpy(bcnt.host.data(), &zero, 8);
    bcnt.upload();
  }
  StageArgs args(bool gpu) {
    const Device d = gpu ? Device::cuda(0) : Device::cpu();
    auto base = [&](Buf& b) { return gpu ? b.dev : static_cast<void*>(b.host.data()); };
    StageArgs a;
    a.hidden_states = hs.ref(base(bhs), d);
    a.x_q = xq.ref(base(bxq), d);
    a.topk_ids = ids.ref(base(bids), d);
    a.topk_weights = w.ref(base(bw), d);
    a.topk_idx_out = io.ref(base(bio), d);
    a.topk_weights_out = wo.ref(base(bwo), d);
    a.is_padding = pad.ref(base(bpad), d);
    a.nonfinite_count = cnt.ref(base(bcnt), d);
    a.hidden_quant = QuantScheme::bf16();
    a.full_buffer = M != T;
    a.routed_scaling_factor = 1.5f;
    return a;
  }
  /// The CPU backend on the host mirrors (poisoned like the device's), then every device
  /// allocation against it.
  void expect_equal_to_cpu(const std::string& what) {
    for (Buf* b : {&bxq, &bio, &bwo}) std::fill(b->host.begin(), b->host.end(), uint8_t{0x5A});
    const int64_t start = 3;
    std::memcpy(bcnt.host.data(), &start, 8);
    megamoe::prepare_inputs(args(false));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; h += 7) {
        uint32_t v = 0;
        std::memcpy(&v, bhs.host.data() + hs.at(t, h), static_cast<size_t>(megamoe::dtype_size(in)));
        uint16_t want = static_cast<uint16_t>(v), got;
        if (in == DType::kFloat16) want = megamoe_ref::bf16_rne_half(static_cast<uint16_t>(v));
        if (in == DType::kFloat32) want = megamoe_ref::bf16_rne(megamoe_ref::detail::float_of(v));
        std::memcpy(&got, bxq.host.data() + xq.at(t, h), 2);
        ASSERT_EQ(got, want) << what << " CPU t=" << t << " h=" << h;
      }
    }
    const char* names[] = {"x_q", "topk_idx_out", "topk_weights_out", "nonfinite_count"};
    int i = 0;
    for (Buf* b : {&bxq, &bio, &bwo, &bcnt}) {
      EXPECT_TRUE(b->download() == b->host) << what << ": " << names[i] << " differs from the CPU backend";
      ++i;
    }
  }
};

TEST(CudaStage, Bf16PassThroughEveryInputLayoutAndPath) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t sizes[][2] = {{1, 128}, {7, 384}, {300, 7168}, {16384, 512}};
  for (DType in : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (int layout = 0; layout < 3; ++layout) {
      for (const auto& sz : sizes) {
        for (int64_t extra : {int64_t{0}, int64_t{37}}) {
          const int64_t T = sz[0], H = sz[1];
          Bf16Call c(T, H, 6, in, layout, T + extra);
          ASSERT_TRUE(c.ok());
          const std::string what = std::string(megamoe::dtype_name(in)) + " layout " + std::to_string(layout) +
                                   " T=" + std::to_string(T) + " H=" + std::to_string(H) + " M=" + std::to_string(c.M);
          // The library's plan, then (contiguous) the any-stride path forced on the same call.
          for (int forced = 0; forced < (layout == 0 ? 2 : 1); ++forced) {
            c.fill(static_cast<uint32_t>(T * 31 + H + layout));
            const StageArgs a = c.args(true);
            if (forced == 0) {
              megamoe::prepare_inputs(a);
            } else {
              const megamoe::detail::Problem p = megamoe::detail::validate_args(a);
              mc::Plan pl = mc::plan(p, a, mc::device_info(0));
              ASSERT_TRUE(pl.vectorized);
              pl.vectorized = false;
              mc::fill_grid(pl, p, mc::device_info(0));
              mc::launch(pl, a, p, nullptr);
            }
            CUDA_OK(cudaDeviceSynchronize());
            c.expect_equal_to_cpu(what + (forced ? " (any-stride path)" : " (library plan)"));
          }
        }
      }
    }
  }
}

TEST(CudaStage, Bf16PassThroughPdlAndGraphReplay) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Bf16Call c(64, 7168, 8, DType::kFloat32, 0, 100);
  ASSERT_TRUE(c.ok());
  c.fill(1);
  StageArgs a = c.args(true);
  a.enable_pdl = true;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  megamoe::prepare_inputs(a, s);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  size_t nodes = 0;
  CUDA_OK(cudaGraphGetNodes(g, nullptr, &nodes));
  EXPECT_EQ(nodes, 1u) << "copy, top-k and tail in one launch";
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  CUDA_OK(cudaGraphLaunch(ge, s));
  CUDA_OK(cudaStreamSynchronize(s));
  c.expect_equal_to_cpu("graph replay 1");
  c.fill(2);  // new inputs in the same buffers
  CUDA_OK(cudaGraphLaunch(ge, s));
  CUDA_OK(cudaStreamSynchronize(s));
  c.expect_equal_to_cpu("graph replay 2");
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  const std::string e = megamoe::explain(a);
  EXPECT_EQ(e.rfind("cuda backend: kernel=copy format=bf16 in=float32", 0), 0u) << e;
  EXPECT_NE(e.find("fused_tail=on"), std::string::npos) << e;
}

}  // namespace
