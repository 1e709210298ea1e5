// plan.h: the CUDA backend's kernel choice as a value. plan() is a pure function of the
// validated problem, the tensors' layout and a description of the device, so it runs (and
// is tested) on a host without a GPU; launch() runs a plan, whoever made it (the library's
// own prepare_inputs, or a test or benchmark that changed its fields).
// Plain C++ (no CUDA headers): host tests include it.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/kernels/geometry.h"
#include "formats/format_list.h"
#include "megamoe/stage.h"
#include "megamoe/tensor.h"
#include "contract/validate.h"

namespace megamoe {
namespace cuda {

/// Which kernel quantizes the hidden states.
enum class Role : uint8_t {
  kFast,     ///< vectorized: 16-element chunks of contiguous, aligned rows (quantize_fast.cuh)
  kGeneric,  ///< any strides and alignment, one scale word or group per thread (quantize_generic.cuh)
  kRowwise,  ///< one block per token row, two passes: row amax, then groups (quantize_rowwise.cuh)
  kCopy,     ///< bf16 pass-through, no scales: top-k then a grid-stride copy (copy_bf16.cuh)
};

/// Offsets and chunk indices in 32 or 64 bits.
enum class IndexWidth : uint8_t { k32, k64 };

/// Stores of the quantized values.
enum class StorePolicy : uint8_t {
  kDefault,     ///< ordinary stores (the consumer may find them in L2)
  kEvictFirst,  ///< st.global.cs: outputs larger than what L2 would keep anyway
};

/// What plan() needs to know about the device.
struct DeviceInfo {
  int sm_count = 132;  ///< multiprocessors
  int arch = 90;       ///< compute capability, major * 10 + minor
};

/// The kernel choice of one call.
struct Plan {
  Role role = Role::kFast;
  core::Format fmt = core::Format::kFp8Ue8m0;
  DType in = DType::kBFloat16;  ///< hidden_states dtype
  int G = 32;                   ///< group size
  IndexWidth index = IndexWidth::k32;
  Shape shape = Shape::kSplitTopk;
  int threads = 128;             ///< per block
  int64_t grid = 1;              ///< blocks
  int64_t quant_blocks = 1;      ///< blocks that quantize; the rest (split-topk, tile) repack top-k
  StorePolicy store = StorePolicy::kDefault;
  bool pdl = false;              ///< programmatic dependent launch (sm_90+)
  bool count_nonfinite = false;  ///< the kernel variant that counts NaN / Inf into nonfinite_count
  bool vectorized = true;        ///< 16-byte loads and vector stores (rows contiguous and aligned)
  /// Full-buffer mode: the kernel's top-k blocks also fill the tail rows T..M-1 (split-topk,
  /// split-half and tile shapes; the copy kernel's top-k pass); otherwise prepare_inputs
  /// fills them with a second, routing-only launch.
  bool fused_tail = false;
  /// Row kernel: blocks that share each row (1, 2 or 4). At decode a row's groups are more
  /// work than one SM issues quickly; split, each block loads the whole row for its max and
  /// encodes a part of it (threads * row_split >= the row's groups), and the top-k entries
  /// have blocks of their own after the quant_blocks (topk_block_count).
  int row_split = 1;
  /// Row kernel at prefill: kRowWideGroups groups a thread in blocks of at most
  /// kRowWideMaxThreads (16-bit inputs, vectorized rows of 257..512 groups, no split): the
  /// row's barriers and constants shared by four groups a thread instead of two, and more
  /// of each SM's loads in flight (stage_rowwise_wide_kernel).
  bool row_wide = false;
  /// NVFP4 static's kernels staging an NVFP4 online call of floor 0 whose amax blocks
  /// accumulated into global_scale (OnlinePlan::unit): a gs of 0 read is the unit scale 1,
  /// which block 0's first thread also stores (idempotent: any block reads 0 or 1).
  bool unit_gs = false;
};

/// Half chunks (Shape::kSplitHalf, one 8-element half chunk a thread): a shape of the fast
/// kernel's FP4 formats of 16-bit inputs (split_half_applies), which plan() gives MXFP4
/// (ties toward zero) calls of at most kSplitHalfChunksPerSm chunks an SM (T = 1 at H = 7168,
/// T <= 2 at 4096): there the launch is one warp's chain, and halving its encode took
/// 0.03 us off it on the H200 (2.1-2.5%), while from T = 64 the doubled per-thread index and
/// scale work cost more (+0.7-1.3% at T = 64, +4-7% at 256); NVFP4 static's per-group
/// thresholds made it slower at every size.
bool split_half_applies(core::Format fmt, DType in);
constexpr int64_t kSplitHalfChunksPerSm = 4;

/// Grid caps of the looping shapes, in waves of the SM's resident threads (2048, or 1536 on
/// sm_86/87/89) in blocks of the plan's threads.
constexpr int kDefaultMaxWaves = 16;
/// The loop shape of NVFP4 static of bf16 on sm_89+: one wave, so that each block's table of
/// multipliers (quantize_fast.cuh kRecipTable) serves many chunks...
constexpr int kRecipLoopWaves = 1;
/// ... and it takes the loop shape from this many chunks a thread of that wave.
constexpr int64_t kRecipLoopChunks = 8;
/// The wide row kernel's fewest groups a row (kernels/geometry.h kRowWideGroups).
constexpr int64_t kRowWideMinGroups = 257;
/// The kernel a staging plan is for: the staging kernel, or the quantizing blocks of the
/// fused router + staging kernel, which quantize whole chunks (no split-half shape), build
/// no NVFP4 multiplier table in their loop (the plan they would have without it) and run
/// split-topk in blocks of at least 256 threads (at decode the router blocks, of the same
/// size, are the launch's critical path and their latency falls with more threads, while
/// the quantizing blocks, one chunk a thread, do not care).
enum class PlanFor : uint8_t { kStaging, kFusedRouter };
/// The library's choice for a validated call with T > 0.
Plan plan(const detail::Problem& p, const StageArgs& a, const DeviceInfo& dev, PlanFor target = PlanFor::kStaging);

/// Recompute grid and quant_blocks from the plan's role, shape and threads (after a caller
/// changed them); max_waves caps the looping shapes' grids.
void fill_grid(Plan& plan, const detail::Problem& p, const DeviceInfo& dev, int max_waves = kDefaultMaxWaves);

/// One line naming every field, e.g. "kernel=fast format=fp8_ue8m0 in=bfloat16 G=32 ...".
std::string to_string(const Plan& plan);
const char* role_name(Role r);
const char* shape_name(Shape s);

/// Throws megamoe::Error (kInvalidArgument) unless this plan can run these arguments safely
/// (the kernel variant exists, the layout suits it, the grid covers the work and its indices
/// cannot wrap). launch() calls it; plans from plan() always pass.
void check_plan(const Plan& plan, const detail::Problem& p, const StageArgs& a);

/// The fast kernel's 32-bit modes apply to these arguments.
bool fits_idx32(const detail::Problem& p, const StageArgs& a);

/// SM count and compute capability of CUDA device @p device (cached; throws kCuda).
DeviceInfo device_info(int device);

/// Run @p plan on @p stream (a cudaStream_t) of the tensors' device. Throws megamoe::Error:
/// kInvalidArgument for a plan check_plan rejects, kCuda when a CUDA call or the launch
/// fails (faults inside the kernel are asynchronous: they surface at the caller's next
/// synchronization, or at the next launch as a sticky error).
void launch(const Plan& plan, const StageArgs& a, const detail::Problem& p, Stream stream);

/// The plan text for validated CUDA arguments (explain()).
std::string explain_plan(const StageArgs& a, const detail::Problem& p);

// ---------------------------------------------------------------------------------------
// NVFP4 online (docs/DESIGN.md "NVFP4 online"): the global scale needs the whole tensor's
// amax before any group is encoded, so the call is two launches on the caller's stream: the
// amax kernel (kernels/online_amax.cuh) writes gs into global_scale, then NVFP4 static's
// staging plan reads it back (PDL-chained when the call asks). One kernel cannot do both
// without a grid-wide barrier, which needs every block co-resident (a cooperative launch,
// which can fail under MPS or beside other resident kernels). With more than one amax block
// each block atomicMax-es its candidate core::online_candidate (monotone in its amax) into
// the word, which a memset node zeroes first (an accumulator needs a start value); with one
// block (decode sizes, H == 0) the block stores gs itself and no memset runs.

/// The amax kernel's launch and the staging after it.
struct OnlinePlan {
  int threads = 256;
  int64_t grid = 1;          ///< blocks (at least 1: gs is written even without elements)
  int64_t row_units = 1;     ///< units a row (a unit: threads x kOnlineVecsPerThread 16-byte vectors' span)
  bool vectorized = false;   ///< 16-byte loads of contiguous, 16-byte aligned rows; else strided scalars
  bool memset = false;       ///< grid > 1: global_scale zeroed first, the blocks atomicMax into it
  /// Floor 0 with memset: a total of 0 (every block below 2^-100) is the unit scale, which
  /// the staging kernel maps (kFlagUnitGs) and stores.
  bool unit = false;
  bool pdl = false;          ///< the amax kernel with PDL (no memset before it)
  bool staging = true;       ///< the static staging plan runs (false: H == 0, routing-only)
  Plan stage;                ///< NVFP4 static's plan for the call (when staging)
};
/// 16-byte vectors (or their elements, strided) a thread of the amax kernel takes per unit.
constexpr int kOnlineVecsPerThread = 4;
/// The amax kernel's grid caps at this many waves of the SMs' resident threads.
constexpr int kOnlineMaxWaves = 4;
/// The library's choice for a validated NVFP4 online call with T > 0.
OnlinePlan online_plan(const detail::Problem& p, const StageArgs& a, const DeviceInfo& dev);
/// "nvfp4_online: memset + amax(...) + static staging: <stage>".
std::string to_string(const OnlinePlan& plan);
/// @p p as NVFP4 static's problem (the staging launch's).
detail::Problem static_problem(const detail::Problem& p);

// ---------------------------------------------------------------------------------------
// The router's launch choices (router.cu; docs/ROUTER.md "Tokens per block"), host
// functions of the problem and the device, tested without a GPU.

/// One token a router block up to this many tokens per SM: the router kernel (one block a
/// token is the shortest chain, and up to here the most blocks are the better trade) and
/// the fused kernel's router blocks (which share the SMs with the quantizing blocks).
/// Measured on the H200 against 2, 3, 4 and 6 tokens a block, T = 256..4096.
constexpr int64_t kRouteOneTokenPerSm = 8;
constexpr int64_t kFusedOneTokenPerSm = 16;

/// Tokens per router block of @p threads threads for T tokens of E experts, top K: one up
/// to kRouteOneTokenPerSm (@p fused: kFusedOneTokenPerSm) tokens per SM; beyond, for the
/// router kernel 4 or else 2 when the block holds them and each selecting warp's slice then
/// fits the register selection (E = 256: 4, E = 384 / 512: 2), else 1; for the fused kernel
/// 4, or as many as the block holds (E = 512: 3).
uint32_t router_tokens_per_block(int64_t T, int64_t E, int64_t K, int threads, bool fused, const DeviceInfo& dev);

/// The fused kernel's decode variant (inlined router, kFusedDecodeBlocksPerSm blocks per
/// SM) where the plan has one: while the router blocks, which come first in the grid, fit
/// one wave of it (their chain is then the launch's critical path; beyond, the quantizing
/// blocks' occupancy matters more).
bool fused_decode_variant(int64_t router_blocks, const DeviceInfo& dev);

// ---------------------------------------------------------------------------------------
// The other launches as plan values: the routing-only kernel (stage_routing, a full-buffer
// tail, staging without activations) and the router's (route, route_and_stage). Made here,
// run as they are by the launch units; explain() prints them.

/// The routing-only kernel: one thread per top-k entry of the [M, K] outputs.
struct RoutingPlan {
  int threads = 256;
  int64_t grid = 0;  ///< blocks; 0: nothing to launch (M * K == 0)
  bool pdl = false;
};
/// The routing-only kernel's grid caps at this many blocks (it loops beyond).
constexpr int64_t kRoutingMaxBlocks = 65536;
RoutingPlan routing_plan(int64_t M, int64_t K, bool enable_pdl, const DeviceInfo& dev);
std::string to_string(const RoutingPlan& plan);

/// The RMSNorm kernel of rmsnorm_and_stage: one block per row of `threads` =
/// min(N, kNormMaxThreads) threads, N the power of two >= H / 16 (the contract's tree
/// width: thread t folds chunks t, t + threads, ... in the tree's order), the row's values
/// in `smem` bytes of dynamic shared memory. Fused (kernels/norm_stage.cuh, every format but
/// NVFP4 online): the same kernel stages its rows, and `tail_blocks` blocks after the T row
/// blocks mark the full-buffer tail; otherwise (kernels/norm.cuh) the staging launch follows.
struct NormPlan {
  int threads = 0;
  int64_t grid = 0;   ///< blocks (rows, then tail blocks); 0: nothing to launch
  int64_t smem = 0;   ///< dynamic shared memory bytes (the row's bf16 values)
  int per_thread = 0; ///< chunks a thread folds in its registers (N / threads)
  bool fused = false;       ///< norm and staging in one launch
  int64_t tail_blocks = 0;  ///< fused: blocks marking full-buffer tail entries
  bool pdl = false;
};
constexpr int kNormMaxThreads = 256;
/// The largest row the norm kernel holds (its values in shared memory, 128 KiB).
constexpr int64_t kNormMaxH = 65536;
/// @p fused: the norm_stage kernel, @p tail_entries the (M - T) * K tail entries it marks.
NormPlan norm_plan(int64_t T, int64_t H, bool enable_pdl, const DeviceInfo& dev, bool fused = false,
                   int64_t tail_entries = 0);
std::string to_string(const NormPlan& plan);

/// The mHC pre kernel of mhc_pre_and_stage (kernels/mhc_stage.cuh): one block per token of
/// `threads` = min(N_K, kNormMaxThreads) threads, at least 32 (the staging's lanes work in
/// whole warps), N_K the power of two >= hc H / 16 (the mixed row's tree width); the
/// token's hc H bf16 values in `smem` bytes of dynamic shared memory. The row's sums (the
/// squares and the hc (hc + 2) mixes) take `passes` passes of `mix_group` sums: thread t
/// folds per_thread_k chunks t, t + threads, ..., then the block the first lanes_k =
/// min(threads, N_K) partials; z's norm likewise (per_thread_h, lanes_h over N_H, the power
/// of two >= H / 16). Fused (every format but NVFP4 online): the kernel stages y, and
/// `tail_blocks` blocks after the T token blocks mark the full-buffer tail; otherwise it
/// writes y and the staging launch follows.
struct MhcPlan {
  int threads = 0;
  int64_t grid = 0;    ///< blocks (tokens, then tail blocks); 0: nothing to launch
  int64_t smem = 0;    ///< dynamic shared memory bytes (the token's hc H bf16 values)
  int per_thread_k = 0;
  int lanes_k = 0;
  int per_thread_h = 0;
  int lanes_h = 0;
  int mix_group = 0;   ///< sums a pass over the row computes (kMhcMixGroup)
  int passes = 0;      ///< ceil((hc (hc + 2) + 1) / mix_group)
  bool fused = false;  ///< mHC pre, norm and staging in one launch
  int64_t tail_blocks = 0;
  bool pdl = false;
};
/// Throws megamoe::Error (kUnsupported) for hc H > kMhcMaxK or a grid beyond CUDA's limit.
MhcPlan mhc_plan(int64_t T, int64_t H, int hc, bool enable_pdl, const DeviceInfo& dev, bool fused = false,
                 int64_t tail_entries = 0);
std::string to_string(const MhcPlan& plan);

/// The gate of gate_route_and_stage / gate_and_route (kernels/gate.cuh, launch/gate.cu): the
/// logits in the contract's order (core/gate.h) split over the GPU, then the router call
/// (router_plan) on them, stream-ordered after it. A block takes a tile of `tile` experts
/// (one warp each) and one of the S = max(1, N / 32) interleaved chunk shares of the tree
/// (N the power of two >= ceil(H / 16)), so a share has M = N / S <= 32 chunks: lane m of
/// the expert's warp runs the chain of chunk r + S m, holding its 16 weight values in
/// registers over the launch's tokens, and a shuffle fold over the levels below M is the
/// contract's tree restricted to the share. The S partial sums of each (token, expert) go to
/// stream-ordered scratch; the block that arrives last at its tile's counter (zeroed by a
/// memset node before the first launch) folds them highest first and writes the logits. A
/// launch takes at most kGateTokens tokens (their partial sums fit `partial_bytes`); more
/// tokens take more launches of the same grid, one after another on the stream.
struct GatePlan {
  int threads = 0;              ///< per block: one warp an expert of the tile
  int64_t tile = 0;             ///< experts a block
  int64_t tiles = 0;            ///< expert tiles: ceil(E / tile)
  int64_t chunks = 0;           ///< n = ceil(H / 16)
  int64_t width = 0;            ///< N, the tree width (power of two >= n)
  int64_t shares = 0;           ///< S = max(1, N / 32)
  int64_t share_chunks = 0;     ///< M = N / S (<= 32): the lanes a share uses
  int64_t fold_per_lane = 0;    ///< partial sums a lane of the last block folds in registers (ceil(S / 32))
  int64_t grid = 0;             ///< blocks a launch: tiles * S; 0: nothing to launch
  int64_t token_block = 0;      ///< tokens a launch (<= kGateTokens)
  int64_t launches = 0;         ///< ceil(T / token_block)
  int64_t partial_bytes = 0;    ///< scratch of the S partial sums of a launch: [S][token_block][E] fp32
  int64_t logits_at = 0;        ///< scratch offset of the [T, E] fp32 logits the router reads
  int64_t counters_at = 0;      ///< scratch offset of the launches * tiles arrival counters (uint32)
  int64_t counter_bytes = 0;
  int64_t scratch_bytes = 0;    ///< the one stream-ordered allocation (partials, logits, counters)
  bool pdl = false;             ///< the first gate launch with PDL (sm_90+, enable_pdl)
  bool decode = false;          ///< T <= kGateTokens: one gate launch
};
constexpr int kGateWarps = 8;                 ///< experts (warps) a gate block
constexpr int64_t kGateTokens = 64;           ///< tokens a gate launch; above, a GEMM then route_and_stage is faster
constexpr int64_t kGateMaxH = 65536;          ///< the widest row on CUDA (S <= 128: 4 partial sums a lane to fold)
constexpr int64_t kGateMaxFoldPerLane = 4;    ///< kGateMaxH's S / 32
/// The library's choice for a gate call of T >= 1 tokens, E experts, H columns. Throws
/// megamoe::Error (kUnsupported) for H > kGateMaxH, (kInvalidArgument) for sizes whose
/// scratch does not fit int64.
GatePlan gate_plan(int64_t T, int64_t E, int64_t H, bool enable_pdl, const DeviceInfo& dev);
std::string to_string(const GatePlan& plan);

/// What a router call launches.
enum class RouterLaunch : uint8_t {
  kRouter,           ///< the router kernel alone (route(); route_and_stage without activations to stage)
  kFused,            ///< one launch: router blocks, then the staging plan's quantizing blocks
  kRouterThenStage,  ///< two launches: the router kernel, then the staging plan's kernel
};

/// A router call's launches.
struct RouterPlan {
  RouterLaunch launch = RouterLaunch::kRouter;
  int threads = 256;              ///< threads of the router blocks (fused: the staging plan's)
  uint32_t tokens_per_block = 1;  ///< router_tokens_per_block
  int64_t router_blocks = 1;      ///< token blocks, or the blocks that fill the staged tail
  bool decode = false;            ///< kFused: the decode variant (fused_decode_variant)
  bool pdl = false;
  /// kFused: the quantizing blocks' plan, kRouterThenStage: the second launch's; as plan()
  /// gives it for that kernel (check_plan holds it to the staging rules). Unused for kRouter.
  Plan stage;
  /// kFused: the one launch, stage's quantizing blocks then the router blocks (grid =
  /// stage.quant_blocks + router_blocks; no top-k blocks: the router writes the top-k).
  Plan fused;
};
/// Tail entries a router block fills per thread before more blocks are added.
constexpr int64_t kRouterTailPerThread = 8;
/// The most blocks of a grid's x dimension.
constexpr int64_t kMaxGridBlocks = 0x7FFFFFFF;
/// The library's choice for a validated router call with work; @p staged: route_and_stage's
/// staging (detail::staged_args), null for route(). Throws megamoe::Error (kUnsupported)
/// for a grid beyond CUDA's limit (about 2^33 tokens).
RouterPlan router_plan(const detail::RouterProblem& p, const StageArgs* staged, bool enable_pdl, const DeviceInfo& dev);
std::string to_string(const RouterPlan& plan);

}  // namespace cuda
}  // namespace megamoe
