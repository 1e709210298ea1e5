// geometry.h: what the kernels and the policy (policy/plan.h) share: the grid shapes and
// the block geometry each kernel is compiled for (its launch bounds, its shared memory).
// Kernels include this, never the policy; each tuned number says what was measured.
#pragma once

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace cuda {

/// How the grid covers the work.
enum class Shape : uint8_t {
  kLoop,       ///< fast: grid-stride loop over chunks (grid capped); top-k by a grid-stride pass before them
  kSplitTopk,  ///< fast, 32-bit: one chunk per thread; top-k in blocks of their own after the quantizing ones
  kSplitHalf,  ///< as kSplitTopk with half a chunk (8 elements) per thread: FP4 formats of 16-bit inputs at decode
  kTile,       ///< fast, 32-bit: 256-thread blocks of 8 tokens x 512 columns, scales stored token-fastest
  kRowwise,    ///< row kernel: block-stride loop over token rows
  kGeneric,    ///< general kernel: grid-stride loop over scale units
  kCopy,       ///< bf16 pass-through: grid-stride top-k pass (tail included), then 16-element chunks or elements
};

/// No loop grid has more threads (the 32-bit modes rely on it: chunk + grid < 2^32).
constexpr int64_t kMaxGridThreads = int64_t{1} << 26;
/// Threads of the copy kernel's blocks (bf16 pass-through; its launch bounds) and the blocks
/// an SM keeps resident: 8 x 256 = 2048 threads, the SM's limit (32 registers a thread), so
/// that each SM has the most 16-byte loads in flight.
constexpr int kCopyThreads = 256;
constexpr int kCopyBlocksPerSm = 8;
/// Threads of the tile shape's blocks (8 warps: one per token of a tile).
constexpr int kTileThreads = 256;
constexpr int kTileTokens = 8;
/// Threads of the row kernel's blocks at most (its launch bounds: 3 such blocks an SM, 42
/// registers a thread; fp32 inputs 2, 64 registers).
constexpr int kRowwiseMaxThreads = 512;
/// Threads of a split row kernel's blocks at most (Plan::row_split > 1).
constexpr int kRowSplitMaxThreads = 256;
/// The wide row kernel (Plan::row_wide): groups a thread, threads a block at most (its
/// launch bounds: 8 such blocks an SM, 64 registers a thread for four chunks in flight), and
/// the fewest groups a row it takes: more than 256 (H > 4096, blocks of 96 or 128 threads;
/// at H = 4096 its 64-thread blocks were 5% slower than two groups a thread at T = 16384
/// on an H100, at H = 7168 1.5% faster).
constexpr int kRowWideGroups = 4;
constexpr int kRowWideMaxThreads = 128;
/// Full-buffer tail entries (-1 / +0.0) per thread of a top-k block: the tail of a decode
/// call is most of its top-k entries (M * K against T * K), and four per thread keep its
/// blocks within one wave where one per thread took four.
constexpr int kTailEntriesPerThread = 4;
/// Full-buffer tail entries per thread of the fused norm kernel's tail blocks (the same
/// reason as kTailEntriesPerThread).
constexpr int kNormTailEntriesPerThread = kTailEntriesPerThread;
/// Sums (the squares, then the mixes) the mHC kernel computes side by side in a pass over
/// its token's row: each takes per_thread registers a thread (up to 16), so four keep the
/// pass within 64 of them.
constexpr int kMhcMixGroup = 4;
/// The largest mixed row (hc H values) the mHC kernel holds (its bf16 values in shared
/// memory, 128 KiB).
constexpr int64_t kMhcMaxK = 65536;
/// Top-k blocks of a split-topk or tile plan: one entry of rows 0..T-1 per thread, then
/// (fused tail) kTailEntriesPerThread entries of rows T..M-1 per thread.
inline int64_t topk_block_count(int64_t T, int64_t M, int64_t K, int64_t threads, bool fused_tail) {
  const int64_t real = (T * K + threads - 1) / threads;
  const int64_t per_block = threads * kTailEntriesPerThread;
  return real + (fused_tail ? ((M - T) * K + per_block - 1) / per_block : 0);
}

/// Shared-memory score entries of one router block (tokens per block x E at most; key and
/// score, 8 bytes: 12 KiB, 13 KiB with the selection candidates), small enough not to cut
/// the quantizing blocks' occupancy in the fused kernel (static, so every block of that
/// kernel has it) on any architecture built (100 KiB per SM on sm_86/89).
constexpr int kRouterSmemEntries = 1536;
/// Columns of 32 experts a lane keeps in registers in the router's register selection.
constexpr uint32_t kRouterRegColumns = 4;
/// Resident blocks per SM of the fused kernel's decode variant (its launch bounds).
constexpr int kFusedDecodeBlocksPerSm = 4;
/// Warps that select one token together in a router block of @p warps warps holding
/// @p ntok tokens: as many as the block has per token, at most one per 32-expert column and
/// at most 32 / K (the merge ranks G * K <= 32 candidates, one per lane); the fewest that
/// give the same columns per warp. Block-uniform.
MEGAMOE_HD uint32_t router_group(uint32_t warps, uint32_t ntok, uint32_t E, uint32_t K) {
  const uint32_t cols = (E + 31u) / 32u;
  uint32_t g = warps / ntok;
  g = g < cols ? g : cols;
  g = g < 32u / K ? g : 32u / K;
  const uint32_t per = (cols + g - 1u) / g;  // columns of the busiest warp
  return (cols + per - 1u) / per;
}

/// Columns of 32 experts the busiest of a token's router_group warps selects over.
MEGAMOE_HD uint32_t router_columns_per_warp(uint32_t warps, uint32_t ntok, uint32_t E, uint32_t K) {
  const uint32_t cols = (E + 31u) / 32u, g = router_group(warps, ntok, E, K);
  return (cols + g - 1u) / g;
}

}  // namespace cuda
}  // namespace megamoe
