// plan.cpp: the CUDA backend's kernel choice (plan.h). Pure host code: no CUDA calls, so
// the choice is unit-tested without a GPU (tests/cuda/test_plan.cpp). The thresholds are
// measurements on an H200 (docs/DESIGN.md, PERFORMANCE.md).
#include "cuda/policy/plan.h"

#include <algorithm>
#include <string>

#include "core/checked.h"
#include "megamoe/error.h"

namespace megamoe {
namespace cuda {
namespace {

constexpr int64_t kChunkElems = 16;

// Evict-first stores once the output outgrows L2's useful share (T*H >= 8M elements,
// e.g. T >= 1171 at H = 7168): measured time -18% at 2048 x 7168 and -17% at 4096 x 4096,
// neutral at 2048 x 4096, at 1024 x 7168 (below the threshold) and at prefill sizes.
constexpr int64_t kStreamStoresFrom = int64_t{1} << 19;  // 16-element chunks

// Token tiles pay for their barrier and shared-memory pass only where scale stores are
// scattered: an MN-major x_sf or shared_x_sf (consecutive tokens adjacent), from 2^18
// chunks (T >= 1024 at H = 4096, >= 586 at 7168). Measured (bench_kernel scale_layouts,
// H200): at T = 1024-16384 tiles are 2-12% faster for MN-major x_sf and transposed
// shared_x_sf (one exception: 4096 x 7168 with bm = 64, +1.2%); up to 23% slower at
// T <= 256 and 0.4-23% slower with row-major scales.
constexpr int64_t kTileFrom = int64_t{1} << 18;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_fp4(core::Format f) { return core::values_per_byte(f) == 2; }

bool mn_major_scales(const StageArgs& a) {
  auto mn = [](const TensorRef& t) { return t.shape[0] > 1 && t.shape[1] > 1 && t.strides[0] < t.strides[1]; };
  return mn(a.x_sf) || (a.shared_x_sf && mn(*a.shared_x_sf));
}

bool aligned(const void* ptr, int64_t n) { return (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(n)) == 0; }

/// Rows contiguous, with every row's start aligned to @p align bytes.
bool rows_vectorizable(const TensorRef& t, int64_t align) {
  const int64_t es = dtype_size(t.dtype);
  return t.strides[1] == 1 && ((t.strides[0] * es) % align == 0 || t.shape[0] == 1) && aligned(t.data, align);
}

/// Hidden rows for 16-byte loads, x_q rows for the 16-byte (fp8) or 8-byte (fp4) stores.
bool layout_vectorizable(const detail::Problem& p, const StageArgs& a) {
  return rows_vectorizable(a.hidden_states, 16) && rows_vectorizable(a.x_q, is_fp4(p.fmt) ? 8 : 16);
}

/// The fast kernel has a variant for this format and group size (the registry's "fast").
bool fast_variant(core::Format f, int64_t G) { return core::fast_group(f, G); }

/// Blocks for a grid-stride kernel: enough resident blocks to cover the chip max_waves
/// times (the kernel loops beyond), never more than kMaxGridThreads threads.
int64_t capped_blocks(int64_t work_items, int threads, const DeviceInfo& dev, int max_waves) {
  const int64_t waves = max_waves > 0 ? max_waves : kDefaultMaxWaves;
  // A wave: the SM's resident threads (1536 on sm_86/87/89, 2048 on sm_80/90/100).
  const int64_t sm_threads = dev.arch == 86 || dev.arch == 87 || dev.arch == 89 ? 1536 : 2048;
  const int64_t max_blocks = static_cast<int64_t>(std::max(1, dev.sm_count)) * waves * sm_threads / threads;
  return std::max<int64_t>(1, std::min({ceil_div(work_items, threads), max_blocks, kMaxGridThreads / threads}));
}

/// Blocks a row of the row kernel (Plan::row_split): 4, else 2, while every block still has
/// an SM of its own (T * split <= SMs) and a part is at most kRowSplitMaxThreads groups and at
/// least a warp's; vectorized rows only.
int rowwise_split(int64_t T, int64_t H, bool vectorized, const DeviceInfo& dev) {
  const int64_t groups = H / kChunkElems;
  if (!vectorized) return 1;
  for (int s : {4, 2}) {
    if (T * s <= std::max(1, dev.sm_count) && ceil_div(groups, s) <= kRowSplitMaxThreads && groups >= 32 * s) return s;
  }
  return 1;
}

/// Threads of the row kernel, whole warps, 32..kRowwiseMaxThreads: split rows, one group a
/// thread of the block's part; otherwise one group a thread while every row has an SM of its
/// own (T <= SMs: the call is one row's latency, which halves with the thread's work), two a
/// thread beyond (the register path, fewer barriers and block maxima a group).
int rowwise_threads(int64_t T, int64_t H, int split, const DeviceInfo& dev) {
  const int64_t groups = H / kChunkElems;
  const int64_t per = split > 1 ? ceil_div(groups, split) : T <= std::max(1, dev.sm_count) ? groups : ceil_div(groups, 2);
  return static_cast<int>(std::min<int64_t>(kRowwiseMaxThreads, std::max<int64_t>(32, ceil_div(per, 32) * 32)));
}

/// The wide row kernel (Plan::row_wide) for rows of 16-bit inputs at prefill (T > SMs, as
/// the full kernel's two groups a thread), kRowWideMinGroups..kRowWideGroups *
/// kRowWideMaxThreads groups (4096 < H <= 8192), vectorized and unsplit.
bool rowwise_wide(int64_t T, int64_t H, DType in, bool vectorized, int split, const DeviceInfo& dev) {
  const int64_t groups = H / kChunkElems;
  return vectorized && split == 1 && in != DType::kFloat32 && T > std::max(1, dev.sm_count) &&
         groups >= kRowWideMinGroups && groups <= int64_t{kRowWideGroups} * kRowWideMaxThreads;
}

[[noreturn]] void reject(const Plan& plan, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, "megamoe: plan: " + why + " (" + to_string(plan) + ")");
}

/// The shapes whose top-k blocks also fill a full buffer's tail rows (a few more threads of
/// the same launch); the others leave the tail to a routing-only launch.
bool tail_in_topk_blocks(Shape s) { return s == Shape::kSplitTopk || s == Shape::kSplitHalf || s == Shape::kTile; }
/// The shapes that fill a full buffer's tail in their own launch: those, and the copy
/// kernel's grid-stride top-k pass (bf16: the copy, the top-k and the tail in one launch).
bool fills_tail(Shape s) { return tail_in_topk_blocks(s) || s == Shape::kCopy; }

/// The plans with top-k blocks of their own after quant_blocks (topk_block_count): those
/// shapes, and split rows (decode), where the warp of a row's part 0 that held the entries
/// reached the row max's barrier ~1000 cycles after the others (clock64 trace of graph
/// replays, H100) and every warp of that block waited for it.
bool topk_blocks_of_their_own(const Plan& pl) {
  return tail_in_topk_blocks(pl.shape) || (pl.shape == Shape::kRowwise && pl.row_split > 1);
}

/// The calls whose loop shape builds the multiplier table (quantize_fast.cuh kRecipTable).
bool recip_format(const detail::Problem& p, const StageArgs& a, const DeviceInfo& dev) {
  return p.fmt == core::Format::kNvfp4Static && a.hidden_states.dtype == DType::kBFloat16 && dev.arch >= 89;
}

}  // namespace

bool split_half_applies(core::Format fmt, DType in) {
  return in != DType::kFloat32 && core::values_per_byte(fmt) == 2 && !core::row_scaled(fmt);
}

const char* role_name(Role r) {
  switch (r) {
    case Role::kFast: return "fast";
    case Role::kGeneric: return "generic";
    case Role::kRowwise: return "rowwise";
    case Role::kCopy: return "copy";
  }
  return "?";
}

const char* shape_name(Shape s) {
  switch (s) {
    case Shape::kLoop: return "loop";
    case Shape::kSplitTopk: return "split_topk";
    case Shape::kSplitHalf: return "split_half";
    case Shape::kTile: return "tile";
    case Shape::kRowwise: return "rowwise";
    case Shape::kGeneric: return "generic";
    case Shape::kCopy: return "copy";
  }
  return "?";
}

bool fits_idx32(const detail::Problem& p, const StageArgs& a) {
  // No tensor reaches below its data pointer (negative strides) or 2^31 elements above it;
  // chunk indices never wrap (n_chunks plus one loop grid of threads < 2^32: no loop grid
  // has more than kMaxGridThreads, a one-pass grid ends within a block of n_chunks); the
  // M * K top-k entries (M >= T: the full buffer's rows) fit 31 bits.
  for (const detail::NamedTensor& n : detail::named_tensors(a)) {
    const detail::Extent e = detail::element_extent(*n.t);
    if (e.lo < 0 || e.hi >= (int64_t{1} << 31)) return false;
  }
  const int64_t n_chunks = p.T * (p.H / kChunkElems);
  return n_chunks + kMaxGridThreads < (int64_t{1} << 32) && p.M * p.K < (int64_t{1} << 31);
}

void fill_grid(Plan& plan, const detail::Problem& p, const DeviceInfo& dev, int max_waves) {
  const int64_t th = std::max(1, plan.threads);
  const int64_t chunks = p.T * (p.H / kChunkElems);
  plan.fused_tail = fills_tail(plan.shape) && p.full_buffer && p.M > p.T;
  const int64_t topk_blocks = topk_block_count(p.T, p.M, p.K, th, plan.fused_tail);
  switch (plan.shape) {
    case Shape::kLoop: plan.quant_blocks = capped_blocks(chunks, plan.threads, dev, max_waves); break;
    case Shape::kSplitTopk: plan.quant_blocks = ceil_div(chunks, th); break;
    case Shape::kSplitHalf: plan.quant_blocks = ceil_div(2 * chunks, th); break;
    case Shape::kTile: {
      const int64_t tiles = ceil_div(p.T, kTileTokens) * ceil_div(p.H / kChunkElems, 32);
      plan.quant_blocks = capped_blocks(tiles * th, plan.threads, dev, max_waves);
      break;
    }
    case Shape::kGeneric: {
      const int64_t span = core::packed_scales(p.fmt) ? 4 * p.G : p.G;
      plan.quant_blocks = capped_blocks(p.T * (p.H / span), plan.threads, dev, max_waves);
      break;
    }
    case Shape::kRowwise:
      plan.quant_blocks = capped_blocks(p.T * std::max(1, plan.row_split) * th, plan.threads, dev, max_waves);
      break;
    case Shape::kCopy:
      // 16-element chunks, or elements; at least enough threads for the top-k entries a
      // chunk-less grid would leave to few blocks (a decode call's tail is most of its work).
      plan.quant_blocks = capped_blocks(std::max(plan.vectorized ? chunks : p.T * p.H,
                                                 (plan.fused_tail ? p.M : p.T) * p.K),
                                        plan.threads, dev, max_waves);
      break;
  }
  plan.grid = plan.quant_blocks + (topk_blocks_of_their_own(plan) ? topk_blocks : 0);
}

Plan plan(const detail::Problem& p, const StageArgs& a, const DeviceInfo& dev, PlanFor target) {
  if (core::online_scaled(p.fmt)) {
    throw Error(ErrorCode::kInternal, "megamoe: internal: NVFP4 online is planned by online_plan");
  }
  const bool fused = target == PlanFor::kFusedRouter;
  const bool recip = !fused && recip_format(p, a, dev);  // the staging kernel's loop builds the table
  Plan pl;
  pl.fmt = p.fmt;
  pl.in = a.hidden_states.dtype;
  pl.G = static_cast<int>(p.G);
  pl.pdl = a.enable_pdl && dev.arch >= 90;
  pl.count_nonfinite = p.has_nonfinite;
  pl.vectorized = layout_vectorizable(p, a);
  pl.store = StorePolicy::kDefault;
  pl.index = IndexWidth::k64;
  if (core::passthrough(p.fmt)) {
    // bf16 pass-through: one copy kernel, the top-k and the full-buffer tail in its launch.
    pl.role = Role::kCopy;
    pl.shape = Shape::kCopy;
    pl.threads = kCopyThreads;
  } else if (core::row_scaled(p.fmt)) {
    pl.role = Role::kRowwise;
    pl.shape = Shape::kRowwise;
    pl.row_split = rowwise_split(p.T, p.H, pl.vectorized, dev);
    pl.row_wide = rowwise_wide(p.T, p.H, pl.in, pl.vectorized, pl.row_split, dev);
    pl.threads = pl.row_wide ? static_cast<int>(ceil_div(ceil_div(p.H / kChunkElems, kRowWideGroups), 32) * 32)
                             : rowwise_threads(p.T, p.H, pl.row_split, dev);
  } else if (pl.vectorized && fast_variant(p.fmt, p.G)) {
    pl.role = Role::kFast;
    const int64_t chunks = p.T * (p.H / kChunkElems);
    // 128-thread blocks up to 1024 chunks per SM (T <= 256 at H = 7168): measured 1-2%
    // faster than 64 at T = 1..8 and than 256 at T = 256 (bench_kernel tune_block, H200);
    // 256 beyond (the blocks-per-SM limit then caps residency).
    pl.threads = chunks <= int64_t{1024} * dev.sm_count ? 128 : 256;
    if (fits_idx32(p, a)) {
      pl.index = IndexWidth::k32;
      pl.store = chunks >= kStreamStoresFrom ? StorePolicy::kEvictFirst : StorePolicy::kDefault;
      // Token tiles for MN-major scales from kTileFrom chunks; otherwise one pass whenever
      // the capped grid would not loop anyway.
      bool one_pass = ceil_div(chunks, pl.threads) <= capped_blocks(chunks, pl.threads, dev, kDefaultMaxWaves);
      // NVFP4 static of bf16 on sm_89+: the loop shape with its multiplier table from
      // kRecipLoopChunks chunks a thread of one wave (the table then costs a small part of a
      // thread's work; the one-pass shape has no table).
      if (recip && chunks >= kRecipLoopChunks * capped_blocks(chunks, 256, dev, kRecipLoopWaves) * 256) {
        one_pass = false;
        pl.threads = 256;
      }
      if (chunks >= kTileFrom && mn_major_scales(a)) {
        pl.shape = Shape::kTile;
        pl.threads = kTileThreads;
      } else {
        const bool half = !fused && p.fmt == core::Format::kMxfp4 && split_half_applies(p.fmt, pl.in) &&
                          chunks <= kSplitHalfChunksPerSm * std::max(1, dev.sm_count);
        pl.shape = !one_pass ? Shape::kLoop : half ? Shape::kSplitHalf : Shape::kSplitTopk;
        if (fused && pl.shape == Shape::kSplitTopk) pl.threads = std::max(pl.threads, 256);
      }
    } else {
      pl.shape = Shape::kLoop;
      pl.store = StorePolicy::kEvictFirst;
    }
  } else {
    pl.role = Role::kGeneric;
    pl.shape = Shape::kGeneric;
    pl.threads = 256;
    pl.vectorized = false;
  }
  const bool recip_loop = recip && pl.role == Role::kFast && pl.shape == Shape::kLoop;
  fill_grid(pl, p, dev, recip_loop ? kRecipLoopWaves : kDefaultMaxWaves);
  return pl;
}

void check_plan(const Plan& pl, const detail::Problem& p, const StageArgs& a) {
  if (pl.fmt != p.fmt || pl.G != p.G || pl.in != a.hidden_states.dtype) {
    reject(pl, "format, G and input dtype must be the call's (" + std::string(core::format_name(p.fmt)) + ", G=" +
                   std::to_string(p.G) + ", " + dtype_name(a.hidden_states.dtype) + ")");
  }
  if (core::online_scaled(pl.fmt)) {
    reject(pl, "NVFP4 online runs as its amax launch, then NVFP4 static's plan (online_plan)");
  }
  if (pl.unit_gs && pl.fmt != core::Format::kNvfp4Static) reject(pl, "unit_gs is NVFP4 static's (staging NVFP4 online)");
  if (pl.count_nonfinite != p.has_nonfinite) reject(pl, "count_nonfinite must match the call's nonfinite_count");
  if (pl.threads < 32 || pl.threads > 1024 || pl.threads % 32 != 0) reject(pl, "threads must be whole warps, 32..1024");
  if (pl.quant_blocks < 1 || pl.grid < pl.quant_blocks || pl.grid > 0x7FFFFFFF) reject(pl, "grid out of range");
  const bool per_token = core::row_scaled(p.fmt);
  const int64_t th = pl.threads;
  if (pl.fused_tail && !(fills_tail(pl.shape) && p.full_buffer)) {
    reject(pl, "only the split-topk, split-half, tile and copy shapes of a full-buffer call fill the tail in the kernel");
  }
  if (core::passthrough(p.fmt) != (pl.role == Role::kCopy)) {
    reject(pl, "the copy kernel takes exactly the formats without scales (bf16)");
  }
  if (pl.role == Role::kCopy && p.full_buffer && p.M > p.T && !pl.fused_tail) {
    reject(pl, "the copy kernel fills a full buffer's tail in its own launch (fused_tail)");
  }
  if (topk_blocks_of_their_own(pl)) {
    if (pl.grid - pl.quant_blocks < topk_block_count(p.T, p.M, p.K, th, pl.fused_tail)) reject(pl, "too few top-k blocks");
  } else if (pl.grid != pl.quant_blocks) {
    reject(pl, "only the split-topk, split-half and tile shapes and split rows have top-k blocks");
  }
  switch (pl.role) {
    case Role::kFast: {
      if (pl.shape != Shape::kLoop && pl.shape != Shape::kSplitTopk && pl.shape != Shape::kSplitHalf &&
          pl.shape != Shape::kTile) {
        reject(pl, "the fast kernel's shapes are loop, split_topk, split_half and tile");
      }
      if (pl.shape == Shape::kSplitHalf && !split_half_applies(p.fmt, pl.in)) {
        reject(pl, "split_half takes FP4 formats of 16-bit inputs");
      }
      if (!fast_variant(p.fmt, p.G)) reject(pl, "the fast kernel has no variant for this format and G");
      if (!pl.vectorized || !layout_vectorizable(p, a)) {
        reject(pl, "the fast kernel needs contiguous, aligned hidden_states and x_q rows");
      }
      const int64_t chunks = p.T * (p.H / kChunkElems);
      if (pl.index == IndexWidth::k64) {
        if (pl.shape != Shape::kLoop || pl.store != StorePolicy::kEvictFirst) {
          reject(pl, "64-bit indices come with the loop shape and evict-first stores");
        }
        break;
      }
      if (!fits_idx32(p, a)) reject(pl, "32-bit indices do not fit these tensors");
      if (pl.shape == Shape::kLoop && pl.grid * th > kMaxGridThreads) reject(pl, "loop grid beyond kMaxGridThreads");
      if (pl.shape == Shape::kSplitTopk && pl.quant_blocks != ceil_div(chunks, th)) {
        reject(pl, "split_topk needs exactly one chunk per thread");
      }
      if (pl.shape == Shape::kSplitHalf && pl.quant_blocks != ceil_div(2 * chunks, th)) {
        reject(pl, "split_half needs exactly one half chunk per thread");
      }
      if (pl.shape == Shape::kTile && (pl.threads != kTileThreads || pl.quant_blocks * th > kMaxGridThreads)) {
        reject(pl, "tile blocks have 256 threads and at most kMaxGridThreads in all");
      }
      break;
    }
    case Role::kGeneric:
      if (pl.shape != Shape::kGeneric || per_token) reject(pl, "the generic kernel has the generic shape, no per-token format");
      if (pl.store != StorePolicy::kDefault || pl.index != IndexWidth::k64) {
        reject(pl, "the generic kernel has 64-bit indices and default stores");
      }
      break;
    case Role::kCopy:
      if (pl.shape != Shape::kCopy) reject(pl, "the copy kernel has the copy shape");
      if (pl.store != StorePolicy::kDefault || pl.index != IndexWidth::k64) {
        reject(pl, "the copy kernel has 64-bit indices and default stores");
      }
      if (pl.threads > kCopyThreads) reject(pl, "copy kernel blocks have at most kCopyThreads threads");
      if (pl.vectorized && !layout_vectorizable(p, a)) {
        reject(pl, "vectorized rows need contiguous, 16-byte aligned hidden_states and x_q rows");
      }
      break;
    case Role::kRowwise:
      if (pl.shape != Shape::kRowwise || !per_token) reject(pl, "the row kernel has the rowwise shape, per-token formats");
      if (pl.store != StorePolicy::kDefault || pl.index != IndexWidth::k64) {
        reject(pl, "the row kernel has 64-bit indices and default stores");
      }
      if (pl.vectorized && !layout_vectorizable(p, a)) {
        reject(pl, "vectorized rows need contiguous, aligned hidden_states and x_q rows");
      }
      if (pl.threads > kRowwiseMaxThreads) reject(pl, "row kernel blocks have at most kRowwiseMaxThreads threads");
      if (pl.row_wide) {
        if (!pl.vectorized || pl.row_split != 1 || pl.in == DType::kFloat32) {
          reject(pl, "the wide row kernel takes vectorized, unsplit rows of 16-bit inputs");
        }
        if (pl.threads > kRowWideMaxThreads || int64_t{pl.threads} * kRowWideGroups < p.H / kChunkElems) {
          reject(pl, "wide row kernel blocks have at most kRowWideMaxThreads threads, kRowWideGroups groups each");
        }
      }
      if (pl.row_split != 1) {
        if (pl.row_split != 2 && pl.row_split != 4) reject(pl, "row_split is 1, 2 or 4");
        if (!pl.vectorized) reject(pl, "a split row kernel needs vectorized rows");
        if (pl.threads > kRowSplitMaxThreads) reject(pl, "split row kernel blocks have at most kRowSplitMaxThreads threads");
        if (int64_t{pl.threads} * pl.row_split < p.H / kChunkElems) {
          reject(pl, "a split row kernel's blocks hold one group a thread of their part");
        }
      }
      break;
    default: reject(pl, "unknown kernel role");
  }
  if (pl.role != Role::kRowwise && pl.row_split != 1) reject(pl, "only the row kernel splits rows");
  if (pl.role != Role::kRowwise && pl.row_wide) reject(pl, "only the row kernel has the wide variant");
}

std::string to_string(const Plan& pl) {
  std::string s = "kernel=";
  s += role_name(pl.role);
  s += " format=";
  s += core::format_name(pl.fmt);
  s += " in=";
  s += dtype_name(pl.in);
  s += " G=" + std::to_string(pl.G);
  s += pl.index == IndexWidth::k32 ? " index=32" : " index=64";
  s += " shape=";
  s += shape_name(pl.shape);
  s += " threads=" + std::to_string(pl.threads);
  s += " grid=" + std::to_string(pl.grid);
  s += " quant_blocks=" + std::to_string(pl.quant_blocks);
  s += pl.store == StorePolicy::kEvictFirst ? " stores=evict_first" : " stores=default";
  s += pl.pdl ? " pdl=on" : " pdl=off";
  s += pl.count_nonfinite ? " nonfinite=on" : " nonfinite=off";
  s += pl.vectorized ? " vectorized=on" : " vectorized=off";
  s += pl.fused_tail ? " fused_tail=on" : " fused_tail=off";
  s += " row_split=" + std::to_string(pl.row_split);
  s += pl.row_wide ? " row_wide=on" : " row_wide=off";
  s += pl.unit_gs ? " unit_gs=on" : " unit_gs=off";
  return s;
}

detail::Problem static_problem(const detail::Problem& p) {
  detail::Problem q = p;
  q.fmt = core::staged_format(p.fmt);
  return q;
}

OnlinePlan online_plan(const detail::Problem& p, const StageArgs& a, const DeviceInfo& dev) {
  OnlinePlan op;
  op.threads = 256;
  op.vectorized = rows_vectorizable(a.hidden_states, 16);
  // A unit: one block's pass over threads x kOnlineVecsPerThread 16-byte vectors of a row
  // (their elements, strided, when the rows are not vectorizable).
  const int64_t span = int64_t{op.threads} * kOnlineVecsPerThread * (16 / dtype_size(a.hidden_states.dtype));
  op.row_units = ceil_div(p.H, span);
  const int64_t units = p.T * op.row_units;  // <= T * H, which fits
  op.grid = std::max<int64_t>(1, std::min(units, capped_blocks(std::max<int64_t>(units, 1) * op.threads, op.threads,
                                                               dev, kOnlineMaxWaves)));
  op.memset = op.grid > 1;
  op.unit = op.memset && p.floor == 0.0f;
  op.pdl = !op.memset && a.enable_pdl && dev.arch >= 90;
  const detail::Problem q = static_problem(p);
  op.staging = !(q.H == 0 && !q.has_x_scales);  // H == 0: the routing-only kernel stages the top-k
  if (op.staging) {
    op.stage = plan(q, a, dev);
    op.stage.unit_gs = op.unit;
    // The staging reads gs, which the amax launch writes: stream-ordered after it, never
    // PDL-started early (an H100 run under graph capture read gs before the amax kernel's
    // store when the two were PDL-chained).
    op.stage.pdl = false;
  }
  return op;
}

std::string to_string(const OnlinePlan& op) {
  std::string s = "nvfp4_online: ";
  if (op.memset) s += "memset + ";
  s += "amax(grid=" + std::to_string(op.grid) + " threads=" + std::to_string(op.threads) +
       " row_units=" + std::to_string(op.row_units) + (op.vectorized ? " vectorized=on" : " vectorized=off") +
       (op.memset ? " gs=atomic_max" : " gs=store") + (op.unit ? " unit=on" : " unit=off") +
       (op.pdl ? " pdl=on" : " pdl=off") + ")";
  s += op.staging ? " + static staging: " + to_string(op.stage) : " (H == 0: no staging kernel)";
  return s;
}

uint32_t router_tokens_per_block(int64_t T, int64_t E, int64_t K, int threads, bool fused, const DeviceInfo& dev) {
  const int64_t one_token = (fused ? kFusedOneTokenPerSm : kRouteOneTokenPerSm) * std::max(1, dev.sm_count);
  if (T <= one_token || E < 1 || E > kRouterSmemEntries || K < 1 || K > 32) return 1;
  const int64_t warps = std::max(1, threads / 32);
  const int64_t most = std::min<int64_t>(warps, kRouterSmemEntries / E);
  // The fused kernel: 4 (or what the block holds), whatever the slices; fewer, larger
  // router blocks leave the quantizing blocks more of the first waves.
  if (fused) return static_cast<uint32_t>(std::min<int64_t>(4, most));
  for (int64_t t : {4, 2}) {
    if (t <= most && router_columns_per_warp(static_cast<uint32_t>(warps), static_cast<uint32_t>(t),
                                             static_cast<uint32_t>(E), static_cast<uint32_t>(K)) <= kRouterRegColumns) {
      return static_cast<uint32_t>(t);
    }
  }
  return 1;
}

bool fused_decode_variant(int64_t router_blocks, const DeviceInfo& dev) {
  return router_blocks <= int64_t{kFusedDecodeBlocksPerSm} * std::max(1, dev.sm_count);
}

RoutingPlan routing_plan(int64_t M, int64_t K, bool enable_pdl, const DeviceInfo& dev) {
  RoutingPlan rp;
  rp.pdl = enable_pdl && dev.arch >= 90;
  const int64_t n = M * K;  // validated: the outputs' element count fits int64
  rp.grid = n == 0 ? 0 : std::min<int64_t>(ceil_div(n, rp.threads), kRoutingMaxBlocks);
  return rp;
}

std::string to_string(const RoutingPlan& rp) {
  return "kernel=routing threads=" + std::to_string(rp.threads) + " grid=" + std::to_string(rp.grid) +
         (rp.pdl ? " pdl=on" : " pdl=off");
}

namespace {

/// A producer's grid: one block per row (@p unit), then @p tail_blocks; refused past CUDA's limit.
int64_t producer_grid(int64_t T, int64_t tail_blocks, const char* who, const char* unit) {
  const int64_t grid = T + tail_blocks;
  if (grid > kMaxGridBlocks) {
    throw Error(ErrorCode::kUnsupported, std::string("megamoe: ") + who + ": " + std::to_string(grid) +
                                             " blocks (one a " + unit + "), more than a CUDA grid holds (" +
                                             std::to_string(kMaxGridBlocks) + ")");
  }
  return grid;
}

/// The power of two >= @p n (n >= 1): the contract's tree width over n chunks.
int64_t tree_width(int64_t n) {
  int64_t w = 1;
  while (w < n) w *= 2;
  return w;
}

}  // namespace

NormPlan norm_plan(int64_t T, int64_t H, bool enable_pdl, const DeviceInfo& dev, bool fused, int64_t tail_entries) {
  NormPlan np;
  if (T == 0 || H == 0) return np;
  const int64_t width = tree_width(H / 16);  // N
  np.threads = static_cast<int>(std::min<int64_t>(width, kNormMaxThreads));
  // The fused kernel's lanes stage groups together (whole warps): at least 32 threads, the
  // ones past the tree's width adding +0 partial sums (exact: the sums are >= +0).
  if (fused) np.threads = std::max(np.threads, 32);
  np.per_thread = static_cast<int>(std::max<int64_t>(1, width / np.threads));
  np.fused = fused;
  if (fused) np.tail_blocks = ceil_div(tail_entries, np.threads * kNormTailEntriesPerThread);
  np.grid = producer_grid(T, np.tail_blocks, "rmsnorm_and_stage", "row");
  np.smem = H * 2;
  np.pdl = enable_pdl && dev.arch >= 90;
  return np;
}

std::string to_string(const NormPlan& np) {
  return std::string(np.fused ? "kernel=rmsnorm_stage" : "kernel=rmsnorm") + " threads=" + std::to_string(np.threads) +
         " grid=" + std::to_string(np.grid) + " smem=" + std::to_string(np.smem) +
         " per_thread=" + std::to_string(np.per_thread) +
         (np.fused ? " tail_blocks=" + std::to_string(np.tail_blocks) : std::string()) +
         (np.pdl ? " pdl=on" : " pdl=off");
}

MhcPlan mhc_plan(int64_t T, int64_t H, int hc, bool enable_pdl, const DeviceInfo& dev, bool fused,
                 int64_t tail_entries) {
  MhcPlan mp;
  if (T == 0 || H == 0 || hc == 0) return mp;
  const int64_t K = H * hc;  // H <= 2^24 / hc (validated): no overflow
  if (K > kMhcMaxK) {
    throw Error(ErrorCode::kUnsupported, "megamoe: mhc_pre_and_stage: hc_mult * H = " + std::to_string(K) +
                                             " values a token; the CUDA kernel holds at most " +
                                             std::to_string(kMhcMaxK) + " (in shared memory)");
  }
  const int64_t wk = tree_width(K / 16), wh = tree_width(H / 16);
  mp.threads = static_cast<int>(std::max<int64_t>(std::min<int64_t>(wk, kNormMaxThreads), 32));
  mp.per_thread_k = static_cast<int>(std::max<int64_t>(1, wk / mp.threads));
  mp.lanes_k = static_cast<int>(std::min<int64_t>(wk, mp.threads));
  mp.per_thread_h = static_cast<int>(std::max<int64_t>(1, wh / mp.threads));
  mp.lanes_h = static_cast<int>(std::min<int64_t>(wh, mp.threads));
  mp.mix_group = kMhcMixGroup;
  mp.passes = static_cast<int>(ceil_div(int64_t{hc} * (hc + 2) + 1, kMhcMixGroup));
  mp.fused = fused;
  if (fused) mp.tail_blocks = ceil_div(tail_entries, int64_t{mp.threads} * kNormTailEntriesPerThread);
  mp.grid = producer_grid(T, mp.tail_blocks, "mhc_pre_and_stage", "token");
  mp.smem = K * 2;
  mp.pdl = enable_pdl && dev.arch >= 90;
  return mp;
}

std::string to_string(const MhcPlan& mp) {
  return std::string(mp.fused ? "kernel=mhc_stage" : "kernel=mhc") + " threads=" + std::to_string(mp.threads) +
         " grid=" + std::to_string(mp.grid) + " smem=" + std::to_string(mp.smem) +
         " per_thread_k=" + std::to_string(mp.per_thread_k) + " lanes_k=" + std::to_string(mp.lanes_k) +
         " per_thread_h=" + std::to_string(mp.per_thread_h) + " lanes_h=" + std::to_string(mp.lanes_h) +
         " mix_group=" + std::to_string(mp.mix_group) + " passes=" + std::to_string(mp.passes) +
         (mp.fused ? " tail_blocks=" + std::to_string(mp.tail_blocks) : std::string()) +
         (mp.pdl ? " pdl=on" : " pdl=off");
}

GatePlan gate_plan(int64_t T, int64_t E, int64_t H, bool enable_pdl, const DeviceInfo& dev) {
  GatePlan gp;
  if (T <= 0) return gp;
  if (H < 1 || H > kGateMaxH || E < 1) {
    throw Error(ErrorCode::kUnsupported, "megamoe: gate: y: expected 1 to " + std::to_string(kGateMaxH) +
                                             " columns on CUDA, got " + std::to_string(H));
  }
  gp.threads = kGateWarps * 32;
  gp.tile = kGateWarps;
  gp.tiles = ceil_div(E, gp.tile);
  gp.chunks = ceil_div(H, kChunkElems);
  gp.width = 1;
  while (gp.width < gp.chunks) gp.width *= 2;
  gp.shares = std::max<int64_t>(1, gp.width / 32);
  gp.share_chunks = gp.width / gp.shares;
  gp.fold_per_lane = ceil_div(gp.shares, 32);
  gp.grid = gp.tiles * gp.shares;  // <= 64 * 128
  gp.token_block = std::min(T, kGateTokens);
  gp.launches = ceil_div(T, gp.token_block);
  gp.decode = gp.launches == 1;
  // Regions 256-byte aligned (cudaMallocAsync returns 256-byte aligned memory): the
  // partial sums, the logits, the counters. Checked: T is any validated row count.
  const auto align = [](core::Checked v) { return core::round_up(v, 256); };
  const core::Checked partial = core::Checked(gp.shares) * gp.token_block * E * 4;
  const core::Checked logits = core::Checked(T) * E * 4;
  const core::Checked counters = core::Checked(gp.launches) * gp.tiles * 4;
  const core::Checked logits_at = align(partial);
  const core::Checked counters_at = logits_at + align(logits);
  const core::Checked total = counters_at + align(counters);
  if (!total.ok()) {
    throw Error(ErrorCode::kInvalidArgument, "megamoe: gate: " + std::to_string(T) + " x " + std::to_string(E) +
                                                 " logits and their scratch: byte count overflows int64");
  }
  gp.partial_bytes = partial.value();
  gp.logits_at = logits_at.value();
  gp.counters_at = counters_at.value();
  gp.counter_bytes = counters.value();
  gp.scratch_bytes = total.value();
  gp.pdl = enable_pdl && dev.arch >= 90;
  return gp;
}

std::string to_string(const GatePlan& gp) {
  return "kernel=gate threads=" + std::to_string(gp.threads) + " tile=" + std::to_string(gp.tile) +
         " tiles=" + std::to_string(gp.tiles) + " chunks=" + std::to_string(gp.chunks) + " width=" +
         std::to_string(gp.width) + " shares=" + std::to_string(gp.shares) + " share_chunks=" +
         std::to_string(gp.share_chunks) + " fold_per_lane=" + std::to_string(gp.fold_per_lane) + " grid=" +
         std::to_string(gp.grid) + " token_block=" + std::to_string(gp.token_block) + " launches=" +
         std::to_string(gp.launches) + " scratch=" + std::to_string(gp.scratch_bytes) + " (partials " +
         std::to_string(gp.partial_bytes) + ", logits at " + std::to_string(gp.logits_at) + ", counters at " +
         std::to_string(gp.counters_at) + ")" + (gp.pdl ? " pdl=on" : " pdl=off") +
         (gp.decode ? " decode=on" : " decode=off");
}

namespace {

/// Router blocks of @p threads threads for T tokens whose staged outputs (when @p staged)
/// have @p M rows: one per tokens_per_block tokens, or enough to fill the tail, at least one.
void size_router_blocks(RouterPlan& rp, const detail::RouterProblem& p, int64_t M, bool fused, const DeviceInfo& dev) {
  rp.tokens_per_block = router_tokens_per_block(p.T, p.E, p.K, rp.threads, fused, dev);
  const int64_t token_blocks = ceil_div(p.T, rp.tokens_per_block);
  const int64_t tail_blocks = ceil_div((M - p.T) * p.K, rp.threads * kRouterTailPerThread);
  rp.router_blocks = std::max<int64_t>({1, token_blocks, tail_blocks});
  // One block per tokens_per_block tokens, no loop over token blocks: a grid beyond CUDA's
  // limit is refused before any launch.
  if (rp.router_blocks > kMaxGridBlocks) {
    throw Error(ErrorCode::kUnsupported, "megamoe: route: " + std::to_string(p.T) + " tokens need " +
                                             std::to_string(rp.router_blocks) +
                                             " router blocks, more than a CUDA grid holds (" +
                                             std::to_string(kMaxGridBlocks) + ")");
  }
}

}  // namespace

RouterPlan router_plan(const detail::RouterProblem& p, const StageArgs* staged, bool enable_pdl,
                       const DeviceInfo& dev) {
  RouterPlan rp;
  rp.pdl = enable_pdl && dev.arch >= 90;
  const int64_t M = staged != nullptr ? p.stage.M : p.T;
  // The router alone: route(); T == 0 (only the staged tail); H == 0 without per-token
  // scales (no activation to stage: the router writes the staged top-k itself).
  if (staged == nullptr || p.stage.T == 0 || (p.stage.H == 0 && !p.stage.has_x_scales)) {
    size_router_blocks(rp, p, M, false, dev);
    return rp;
  }
  rp.stage = plan(p.stage, *staged, dev, PlanFor::kFusedRouter);
  if (rp.stage.role != Role::kFast) {
    // Generic and row-kernel plans keep their block loops inside their own kernels: the
    // router kernel, then the staging kernel.
    rp.launch = RouterLaunch::kRouterThenStage;
    size_router_blocks(rp, p, M, false, dev);
    return rp;
  }
  rp.launch = RouterLaunch::kFused;
  rp.threads = rp.stage.threads;
  size_router_blocks(rp, p, M, true, dev);
  if (rp.stage.quant_blocks + rp.router_blocks > kMaxGridBlocks) {
    throw Error(ErrorCode::kUnsupported, "megamoe: route_and_stage: " + std::to_string(rp.stage.quant_blocks) +
                                             " quantizing and " + std::to_string(rp.router_blocks) +
                                             " router blocks, more than a CUDA grid holds");
  }
  rp.fused = rp.stage;
  rp.fused.grid = rp.stage.quant_blocks + rp.router_blocks;
  rp.decode = fused_decode_variant(rp.router_blocks, dev);
  return rp;
}

std::string to_string(const RouterPlan& rp) {
  std::string router = "threads=" + std::to_string(rp.threads) + " tokens_per_block=" +
                       std::to_string(rp.tokens_per_block) + " router_blocks=" + std::to_string(rp.router_blocks) +
                       (rp.pdl ? " pdl=on" : " pdl=off");
  switch (rp.launch) {
    case RouterLaunch::kRouter: return "kernel=router " + router;
    case RouterLaunch::kFused:
      return "kernel=router+stage (one launch) grid=" + std::to_string(rp.fused.grid) + " " + router +
             (rp.decode ? " decode=on" : " decode=off") + " | quantizing blocks: " + to_string(rp.stage);
    case RouterLaunch::kRouterThenStage:
      return "kernel=router " + router + " ; then " + to_string(rp.stage);
  }
  return "kernel=router (unknown launch)";
}

}  // namespace cuda
}  // namespace megamoe
