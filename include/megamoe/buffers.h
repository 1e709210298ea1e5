/// @file buffers.h
/// @brief DeepGEMM's MegaMoE symmetric buffer, exactly: every region of the one allocation
/// DeepGEMM's MegaMoE kernels read and write (name, byte offset, dtype, shape, element
/// strides, bytes), which regions staging fills and which are the kernel's scratch, the
/// total size and the token alignment; and the block size DeepGEMM picks per call, which
/// fixes the row order of the shared-expert scale copy.
///
/// The layouts are DeepGEMM's as recorded in docs/BUFFERS.md (which names the DeepGEMM
/// versions). Every size is computed with checked arithmetic; every precondition DeepGEMM
/// asserts while sizing the buffer is a megamoe::Error (kInvalidArgument) naming the
/// argument and the rule, and so is any size DeepGEMM would compute past the 32-bit
/// integers it holds it in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megamoe/tensor.h"

namespace megamoe {
namespace deepgemm {

/// @brief Which of DeepGEMM's MegaMoE buffers.
enum class Variant : uint8_t {
  /// Hopper FP8 MegaMoE (`get_symm_buffer_for_sm90_mega_moe`, `fp8_mega_moe`): e4m3 tokens
  /// with fp32 scales per 128 columns, a full token pool, T aligned to 128.
  kSm90Fp8,
  /// Blackwell MegaMoE (`get_symm_buffer_for_mega_moe`, `fp8_fp4_mega_moe`,
  /// `fp4_fp4_mega_moe`, `bf16_mega_moe`): optional shared experts, a ring sized from the
  /// SM count the kernel runs on, T aligned to 1920.
  kSm100,
  /// The earlier Blackwell layout: fp8xfp4 or bf16xbf16, no shared experts, a ring whose
  /// size the caller chooses (DeepGEMM's Python picks one, `num_ring_tokens` = 0 here),
  /// T aligned to 384.
  kSm100Ring,
};

/// @brief DeepGEMM's `mma_type` (activations x weights).
enum class MmaType : uint8_t {
  kFp8xFp4,    ///< "fp8xfp4": e4m3 tokens, UE8M0 scales per 32 columns
  kFp8xFp8,    ///< "fp8xfp8": the same token layout as fp8xfp4
  kBf16xBf16,  ///< "bf16xbf16": bf16 tokens, no scales
  kFp4xFp4,    ///< "fp4xfp4": NVFP4, packed e2m1 tokens, e4m3 scales per 16 columns
};

/// @brief DeepGEMM's `activation` (the layout does not depend on it; DeepGEMM checks it).
enum class Activation : uint8_t {
  kSwiglu,  ///< "swiglu": every variant
  kSitu,    ///< "situ": kSm100 with fp8xfp4 only
};

/// @brief Who writes a region.
enum class Role : uint8_t {
  kInput,    ///< staging fills it before each kernel call (rows [0, num_tokens))
  kScratch,  ///< the kernel's own (workspace counters, rings, combine buffers)
};

/// @brief The arguments of DeepGEMM's buffer sizing. Which fields a variant reads:
/// every field but the last three is read by all; `num_shared_experts` must be 0 but for
/// kSm100; `mma_type` is read by kSm100 and kSm100Ring (kSm90Fp8 is FP8 only);
/// `num_sms` by kSm100 only; `num_ring_tokens` by kSm100Ring only.
struct BufferArgs {
  Variant variant = Variant::kSm100;
  int64_t num_ranks = 1;                ///< world size R (DeepGEMM: the group's size)
  int64_t num_experts = 0;              ///< experts E over all ranks (E % R == 0)
  int64_t num_max_tokens_per_rank = 0;  ///< tokens a rank stages at most (aligned up here)
  int64_t num_topk = 0;                 ///< K
  int64_t hidden = 0;                   ///< H
  int64_t intermediate_hidden = 0;      ///< IH, one expert's intermediate size
  int64_t num_shared_experts = 0;       ///< kSm100: shared experts S (0: none)
  MmaType mma_type = MmaType::kFp8xFp4;
  Activation activation = Activation::kSwiglu;
  /// kSm100: the SM count the kernel runs on (DeepGEMM takes the device's at sizing time;
  /// even, for its 2-CTA clusters).
  int64_t num_sms = 0;
  /// kSm100Ring: the ring's tokens, a multiple of 384 within DeepGEMM's limits; 0 picks
  /// the size DeepGEMM's Python picks.
  int64_t num_ring_tokens = 0;
};

/// @brief One region of the buffer. Regions tile [0, nbytes) in DeepGEMM's order, each
/// starting where the previous ends; a region DeepGEMM sizes at 0 bytes is not listed.
struct Region {
  std::string name;    ///< DeepGEMM's view name ("x", "x_sf", ...), or the buffer's name
  int64_t offset = 0;  ///< bytes from the start of the buffer
  int64_t nbytes = 0;  ///< bytes of the region (= the view's elements times the element size)
  DType dtype = DType::kUInt8;
  int ndim = 1;                 ///< 1 or 2
  int64_t shape[2] = {0, 0};    ///< elements (shape[1] unused when ndim == 1)
  int64_t strides[2] = {1, 0};  ///< elements; (1, rows) for the MN-major scale views
  Role role = Role::kScratch;
  /// DeepGEMM's buffer object hands out this tensor (false: the workspace, the combine
  /// buffer and the top-k weight side buffers, which only the kernel addresses).
  bool sliced = false;
};

/// @brief The whole buffer.
struct BufferLayout {
  BufferArgs args;                   ///< as given (num_ring_tokens: as given, 0 included)
  int64_t token_alignment = 0;       ///< 128, 1920 or 384
  int64_t num_max_tokens = 0;        ///< T: num_max_tokens_per_rank aligned up, the rows of x
  int64_t num_max_pool_tokens = 0;   ///< P: the workspace's (and kSm90Fp8's) token pool
  int64_t num_ring_tokens = 0;       ///< N: the L1/L2 rows (P for kSm90Fp8)
  int64_t num_sf_ring_tokens = 0;    ///< rows of the MN-major L1/L2 scale views (0: none)
  int64_t num_shared_sf_tokens = 0;  ///< rows of the shared-expert scale views (0: none)
  int64_t workspace_bytes = 0;       ///< the first region's bytes
  int64_t nbytes = 0;                ///< the whole buffer (DeepGEMM's size)
  std::vector<Region> regions;       ///< in DeepGEMM's order

  /// @brief The region called @p name, or nullptr.
  const Region* find(const std::string& name) const noexcept;
};

/// @brief DeepGEMM's buffer for @p args.
/// @throws megamoe::Error (kInvalidArgument) naming the argument and the rule for every
///   precondition DeepGEMM asserts (and a negative count, a zero H / IH, a size beyond its
///   32-bit integers or a total beyond int64).
BufferLayout buffer_layout(const BufferArgs& args);

/// @brief DeepGEMM's block size M for a kSm100 call of @p num_tokens tokens
/// (`get_block_m_for_mega_moe`), the `shared_block_m` that orders the rows of
/// `shared_l1_acts_sf` for that call (docs/CONTRACT.md, `shared_x_sf`). It depends on
/// num_tokens * R * K / E only; the layout's token count and the MMA type do not change it.
/// @throws megamoe::Error (kInvalidArgument) for num_ranks < 1, num_experts < 1,
///   num_tokens or num_topk < 0, an argument beyond int32, or a block count past int32.
int64_t block_m(int64_t num_ranks, int64_t num_experts, int64_t num_max_tokens_per_rank, int64_t num_tokens,
                int64_t num_topk, MmaType mma_type = MmaType::kFp8xFp4);

/// @brief "sm90_fp8", "sm100", "sm100_ring".
const char* to_string(Variant v) noexcept;
/// @brief DeepGEMM's spelling: "fp8xfp4", "fp8xfp8", "bf16xbf16", "fp4xfp4".
const char* to_string(MmaType m) noexcept;
/// @brief "swiglu", "situ".
const char* to_string(Activation a) noexcept;
/// @brief "input", "scratch".
const char* to_string(Role r) noexcept;

}  // namespace deepgemm
}  // namespace megamoe
