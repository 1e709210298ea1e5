// router.cuh: the fused DeepSeek-V4 router's device code (docs/ROUTER.md "CUDA"): a
// router block routes up to RouterParams::tpb consecutive tokens with the numeric rules of
// core/router.h (the CPU backend's), then fills its share of the staged top-k buffers'
// full-buffer tail. What it costs is latency inside one block, so each phase spreads over
// the whole block and keeps independent work in flight.
//
//  0. Parameters: route_kernel inlines the block (router_block_body), each field a
//     constant-bank operand; the fused kernel copies them into shared memory (one word a
//     thread) before it calls the noinline router_block: read through the generic address
//     of the kernel's parameter space, each field would be a slow round trip.
//  1. Scoring, the whole block: the block's tokens' tpb x E scores (the expensive part:
//     exp and log1p in double, core::router_scores' fast path: some 40 dependent double
//     operations each) are spread over all its threads (T = 1, E = 384, 256 threads: one
//     or two scores a thread). A thread issues the loads of up to kChains of its entries
//     (logit, bias, padding flag) before any arithmetic, then runs their scores side by
//     side, and writes each key and score to shared memory. kChains is what the kernel's
//     register budget holds. The inlined blocks (route_kernel, the fused decode variant)
//     take the branch-free square root and reciprocal (core::router_scores' kBranchFree),
//     so that their chains interleave; router_block's 32 registers keep the IEEE forms,
//     whose slow-path branches put its chains one after another.
//  2. Selection, G warps per token (router_group, computed on the host for full blocks: the
//     block's warps shared among its tokens, at most one per 32-expert column and
//     G * K <= 32): each warp finds the top K of its slice of the token's experts (whole
//     columns of 32, lane l holding expert 32 c + l) in K rounds of a warp-wide argmax.
//     Slices of up to 4 columns a lane (the decode shapes) keep their experts in registers
//     as packed 64-bit candidates (key above, complemented id below: the integer order is
//     the selection order) and a round is branch-free (router_slice_topk_regs); wider
//     slices rescan shared memory (router_slice_topk). With G > 1, after a barrier the
//     token's first warp ranks the G * K candidates, one per lane, against each other by
//     broadcast shared-memory reads (router_rank), which gives the same winners in the
//     same order as one argmax over all E.
//     A block's only token with K at most its warps holding experts (decode) skips the
//     rounds: router_select_single, two barriers and one ranking of the few experts at or
//     above a threshold.
//  3. Weights and stores, the token's first warp, lane k for k < K: winner k's score; the
//     scores are summed in k order (every lane adds the K shuffled scores in the CPU loop's
//     order), then the weight, the EPLB map and load (with R <= 4 slots the replica count
//     and the map row are loaded side by side; the record flag was loaded at the start),
//     the public outputs and the staged top-k entry.
// Hash layers skip 1 (except for counting non-finite logits) and 2: one warp per token,
// lane k reads its table entry and scores that one expert.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/numerics.h"
#include "core/router.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/geometry.h"
#include "cuda/kernels/topk.cuh"

namespace megamoe {
namespace cuda {

/// Everything a router block reads and writes (outside the anonymous namespace: the
/// fused kernel's launch units take it from router.cu) (64-bit offsets: router tensors are small,
/// the cost is a few instructions per token).
struct RouterParams {
  // Laid out by first use on the decode path (one token a block): what the block reads
  // before its first logit load, then the scores' operands, then the stores'; EPLB and
  // hash layers last. Kernel parameters are constant-bank operands, fetched a line at a
  // time: fields read together share lines.
  int64_t T;
  uint32_t tpb;      // tokens per router block, 1..warps per block
  uint32_t flags;    // kRoute*
  int64_t E, K;
  const void* logits;
  int64_t lg_s0, lg_s1;
  const void* bias;                  // nullable
  int64_t bias_s0;
  const uint8_t* pad;                // nullable
  int64_t pad_s0;
  const int32_t* record;             // EPLB flag
  unsigned long long* nonfinite;     // nullable: NaN / Inf logits are added to it
  uint32_t group;    // router_group of a block of tpb tokens (computed on the host)
  float alpha;
  void* ids;                         // public [T, K] int32 / int64
  int64_t ids_s0, ids_s1;
  float* w;                          // public [T, K]
  int64_t w_s0, w_s1;
  int64_t* idx_out;                  // staged [M, K] (kRouteStaged)
  int64_t io_s0, io_s1;
  float* w_out;                      // staged [M, K]
  int64_t wo_s0, wo_s1;
  int64_t M;
  uint32_t blocks;   // router blocks
  const int32_t* l2p;                // EPLB [E, R]
  int64_t l2p_s0, l2p_s1, R;
  const int32_t* replicas;           // EPLB [E]
  int64_t rc_s0;
  void* load;                        // EPLB [P] int32 / int64
  int64_t load_s0, P;
  const int32_t* tid2eid;            // hash layers
  int64_t tab_s0, tab_s1, V;
  const void* input_ids;             // hash layers, int32 / int64
  int64_t iid_s0;
};

namespace {

/// Most warps of a router block (blockDim.x <= 256: both kernels' launch bounds).
constexpr int kRouterMaxWarps = 8;

enum : uint32_t {
  kRouteLogitsBF16 = 1u,
  kRouteBiasBF16 = 2u,
  kRouteBias = 4u,
  kRouteIdsI64 = 8u,
  kRouteHash = 16u,
  kRouteInputIdsI64 = 32u,
  kRouteEplb = 64u,
  kRouteLoadI64 = 128u,
  kRouteStaged = 256u,  // also write topk_idx_out / topk_weights_out (route_and_stage)
  kRoutePdl = 512u,     // the standalone router kernel was launched with PDL
};

/// The bits of element @p off of an fp32 or (@p bf16) bf16 array, a bf16 in the low half:
/// the loads of a step first, each widened by real_of_bits once all are issued. A 16-bit
/// load widened where it is loaded made the next load wait for it (sm_90 SASS: the widening
/// inside the load's branch, before the next load's).
__device__ __forceinline__ uint32_t load_real_bits(const void* p, int64_t off, bool bf16) {
  return bf16 ? static_cast<const uint16_t*>(p)[off] : static_cast<const uint32_t*>(p)[off];
}

__device__ __forceinline__ float real_of_bits(uint32_t u, bool bf16) {
  return bf16 ? core::bf16_to_float(static_cast<uint16_t>(u)) : core::bits_float(u);
}

__device__ __forceinline__ uint32_t router_logit_bits(const RouterParams& r, int64_t t, int64_t e) {
  return load_real_bits(r.logits, t * r.lg_s0 + e * r.lg_s1, (r.flags & kRouteLogitsBF16) != 0);
}

__device__ __forceinline__ uint32_t router_bias_bits(const RouterParams& r, int64_t e) {
  return load_real_bits(r.bias, e * r.bias_s0, (r.flags & kRouteBiasBF16) != 0);
}

__device__ __forceinline__ float router_logit(const RouterParams& r, int64_t t, int64_t e) {
  return real_of_bits(router_logit_bits(r, t, e), (r.flags & kRouteLogitsBF16) != 0);
}

__device__ __forceinline__ bool router_padded(const RouterParams& r, int64_t t) {
  return r.pad != nullptr && r.pad[t * r.pad_s0] != 0;
}

/// Token t's padding byte (0 without is_padding), for a test where it is used: loaded early
/// but compared late, so that no instruction waits for it before later loads issue (a
/// compare right after the load, as router_padded's, stalls the warp there).
__device__ __forceinline__ uint32_t router_pad_byte(const RouterParams& r, int64_t t) {
  return r.pad != nullptr ? r.pad[t * r.pad_s0] : 0u;
}

/// The warp's maximum (kMax) or minimum of @p v, in every lane.
template <bool kMax>
__device__ __forceinline__ uint32_t warp_extreme(uint32_t v) {
#if __CUDA_ARCH__ >= 800
  return kMax ? __reduce_max_sync(0xFFFFFFFFu, v) : __reduce_min_sync(0xFFFFFFFFu, v);
#else
  for (int off = 16; off >= 1; off >>= 1) {
    const uint32_t o = __shfl_xor_sync(0xFFFFFFFFu, v, off);
    v = kMax ? max(v, o) : min(v, o);
  }
  return v;
#endif
}

/// Lane k's entry of token t: logical id @p id (-1: none) with weight @p w, mapped and
/// recorded (EPLB; @p rec: the record flag, read at the block's start), written to the
/// public and the staged outputs. @p keep: the token is routed (not padded, a valid hash
/// row). With R <= 4 replica slots the replica count and the whole map row are loaded side
/// by side (one memory round trip instead of two dependent ones).
__device__ __forceinline__ void router_store(const RouterParams& r, int64_t t, int64_t k, bool keep, int64_t id,
                                             float w, bool rec) {
  if (!keep || id < 0) {
    id = -1;
    w = 0.0f;
  } else if (r.flags & kRouteEplb) {
    const int64_t R = r.R;
    const int32_t* row = r.l2p + id * r.l2p_s0;
    const int32_t count = r.replicas[id * r.rc_s0];
    if (R <= 4) {
      int32_t m[4];
      MEGAMOE_UNROLL
      for (int j = 0; j < 4; ++j) m[j] = j < R ? row[j * r.l2p_s1] : -1;
      const int64_t slot = core::replica_slot(t * r.K + k, count, R);
      id = slot == 0 ? m[0] : slot == 1 ? m[1] : slot == 2 ? m[2] : m[3];
    } else {
      id = row[core::replica_slot(t * r.K + k, count, R) * r.l2p_s1];
    }
    if (rec && id >= 0 && id < r.P) {
      if (r.flags & kRouteLoadI64) {
        atomicAdd(reinterpret_cast<unsigned long long*>(static_cast<int64_t*>(r.load) + id * r.load_s0), 1ull);
      } else {
        atomicAdd(static_cast<int*>(r.load) + id * r.load_s0, 1);
      }
    }
  }
  const int64_t io = t * r.ids_s0 + k * r.ids_s1;
  if (r.flags & kRouteIdsI64) static_cast<int64_t*>(r.ids)[io] = id;
  else static_cast<int32_t*>(r.ids)[io] = static_cast<int32_t>(id);
  r.w[t * r.w_s0 + k * r.w_s1] = w;
  if (r.flags & kRouteStaged) store_entry(r, t, k, id, w);
}

/// A selection candidate packed so that the selection order is the integer order: the key
/// above, the complement of the expert id below (a larger key first, equal keys to the
/// lower id). kNoCandidate (key 0, id kNoExpert) is below every real expert.
constexpr uint32_t kNoExpert = 0xFFFFFFFFu;
constexpr uint64_t kNoCandidate = 0;  // router_candidate(0, kNoExpert)
__device__ __forceinline__ uint64_t router_candidate(uint32_t key, uint32_t id) {
  return (static_cast<uint64_t>(key) << 32) | ~id;
}
__device__ __forceinline__ uint32_t candidate_id(uint64_t c) { return ~static_cast<uint32_t>(c); }

/// The top K of one warp's slice of a token (keys @p key of its E experts): the columns
/// g, g + G, ... of 32 experts, lane l holding expert 32 c + l of column c. Writes the K
/// candidates in selection order to @p out (kNoCandidate once the slice is exhausted).
/// K rounds of a warp-wide argmax: redux.sync max of the lanes' best keys; a single lane
/// holding it wins (the common case, one ballot), several go to the lowest id (redux.sync
/// min); only the winner's lane writes its candidate and rescans its own experts.
__device__ __forceinline__ void router_slice_topk(const uint32_t* key, uint32_t E, uint32_t K, uint32_t g,
                                                  uint32_t G, uint64_t* out) {
  const uint32_t lane = threadIdx.x % 32u;
  const uint32_t cols = (E + 31u) / 32u;
  const uint32_t J = cols > g ? (cols - g + G - 1u) / G : 0u;  // this warp's columns
  uint32_t removed = 0, bk = 0, bid = kNoExpert, bj = 0;
  auto rescan = [&] {
    bk = 0;
    bid = kNoExpert;
    for (uint32_t j = 0; j < J; ++j) {
      const uint32_t e = (g + j * G) * 32u + lane;
      if (e < E && ((removed >> j) & 1u) == 0u) {
        const uint32_t k = key[e];
        if (bid == kNoExpert || k > bk) {  // strictly larger: the lower id keeps a tie
          bk = k;
          bid = e;
          bj = j;
        }
      }
    }
  };
  rescan();
  for (uint32_t k = 0; k < K; ++k) {
    const uint32_t m = warp_extreme<true>(bk);
    const uint32_t hold = __ballot_sync(0xFFFFFFFFu, bk == m);
    bool won = lane == static_cast<uint32_t>(__ffs(hold) - 1);
    if ((hold & (hold - 1u)) != 0u) {  // a tie between lanes (warp-uniform)
      const uint32_t w = warp_extreme<false>(bk == m ? bid : kNoExpert);
      if (w != kNoExpert) won = bid == w;  // else the slice is exhausted: the lowest lane says so
    }
    if (won) {
      out[k] = router_candidate(m, bid);  // kNoCandidate when exhausted
      if (bid != kNoExpert) {
        removed |= 1u << bj;
        rescan();
      }
    }
  }
}

/// router_slice_topk for slices of at most kRouterRegColumns columns a warp (the decode shapes:
/// E = 256 / 384 / 512 with K = 6 split over 4 warps give 2 / 3 / 4): the lane's experts
/// stay in registers as packed candidates (0 once taken or absent), and a round has no
/// branch: the warp-wide maximum of the 64-bit candidates by two redux.sync (the upper
/// words, then the lower words among the lanes holding that maximum), the lane holding it
/// (ids are distinct: one lane) clears it, every lane re-takes the maximum of its few
/// registers, and lane 0 writes the winner, which is kNoCandidate (0) once the slice is
/// exhausted. The same winners in the same order as router_slice_topk.
__device__ __forceinline__ void router_slice_topk_regs(const uint32_t* key, uint32_t E, uint32_t K, uint32_t g,
                                                       uint32_t G, uint32_t J, uint64_t* out) {
  const uint32_t lane = threadIdx.x % 32u;
  uint64_t c[kRouterRegColumns];
  MEGAMOE_UNROLL
  for (uint32_t j = 0; j < kRouterRegColumns; ++j) {
    const uint32_t e = (g + j * G) * 32u + lane;
    c[j] = j < J && e < E ? router_candidate(key[e], e) : kNoCandidate;
  }
  for (uint32_t k = 0; k < K; ++k) {
    uint64_t best = c[0];
    MEGAMOE_UNROLL
    for (uint32_t j = 1; j < kRouterRegColumns; ++j) best = c[j] > best ? c[j] : best;
    const uint32_t hi = static_cast<uint32_t>(best >> 32), lo = static_cast<uint32_t>(best);
    const uint32_t mh = warp_extreme<true>(hi);
    const uint32_t ml = warp_extreme<true>(hi == mh ? lo : 0u);
    const uint64_t win = (static_cast<uint64_t>(mh) << 32) | ml;
    MEGAMOE_UNROLL
    for (uint32_t j = 0; j < kRouterRegColumns; ++j) c[j] = c[j] == win ? kNoCandidate : c[j];
    if (lane == 0u) out[k] = win;
  }
}

/// The sum of lanes 0..K-1's @p v (K <= kN) in k order, in every lane: the kN shuffles are
/// independent (issued together), the adds in k order (the CPU loop's).
template <int kN>
__device__ __forceinline__ float router_sum_in_k_order(float v, uint32_t K) {
  float x[kN];
  MEGAMOE_UNROLL
  for (int k = 0; k < kN; ++k) x[k] = __shfl_sync(0xFFFFFFFFu, v, k);
  float sum = 0.0f;
  MEGAMOE_UNROLL
  for (uint32_t k = 0; k < static_cast<uint32_t>(kN); ++k) {
    if (k < K) sum = core::add_rn(sum, x[k]);
  }
  return sum;
}

/// Token t's weights and stores by one warp from its K winners @p win (selection order)
/// and its scores @p s: lane k < K takes winner k; every lane sums the K scores in k order
/// (the CPU loop's order), then lane k writes its entry.
__device__ __forceinline__ void router_finish(const RouterParams& r, int64_t t, const uint64_t* win, const float* s,
                                              bool rec) {
  const uint32_t lane = threadIdx.x % 32u;
  const uint32_t K = static_cast<uint32_t>(r.K);
  uint32_t id = kNoExpert;
  float mine = 0.0f;
  if (lane < K) {
    id = candidate_id(win[lane]);
    mine = s[id];  // K <= E: every winner is a real expert
  }
  // K <= 8 (DeepSeek-V4's 6 and 8): half the shuffles and half the add chain.
  const float sum = K <= 8u ? router_sum_in_k_order<8>(mine, K) : router_sum_in_k_order<core::kMaxRouterTopk>(mine, K);
  if (lane < K) {
    router_store(r, t, lane, true, id, core::router_weight(mine, core::weight_denominator(sum), r.alpha), rec);
  }
}

/// The ranking of n <= 32 distinct candidates @p c (shared memory) by one warp: lane q
/// ranks candidate q among them (how many are larger: the order is strict, so the ranks of
/// the real candidates are distinct) and writes it to out[rank] when rank < K (@p out may
/// be @p c). Every lane reads all n candidates (the same address across the warp:
/// broadcasts, independent, issued back to back): 299 cycles for n = 24 on the H200 where
/// 32 shuffles of the 64-bit candidates took 512 (a clock64 latency probe).
/// How many of the n candidates @p c (shared memory) are larger than @p mine: its rank among
/// them. Eight reads at a time up to n (warp-uniform; a single token's threshold typically
/// lets K to 2K experts through), not all 32 slots.
__device__ __forceinline__ uint32_t router_rank_of(const uint64_t* c, uint32_t n, uint64_t mine) {
  uint32_t rank = 0;
  for (uint32_t q0 = 0; q0 < n; q0 += 8u) {
    MEGAMOE_UNROLL
    for (uint32_t j = 0; j < 8u; ++j) {
      if (q0 + j < n) rank += c[q0 + j] > mine ? 1u : 0u;
    }
  }
  return rank;
}

__device__ __forceinline__ void router_rank(const uint64_t* c, uint32_t n, uint32_t K, uint64_t* out) {
  const uint32_t lane = threadIdx.x % 32u;
  const uint64_t mine = lane < n ? c[lane] : kNoCandidate;
  const uint32_t rank = router_rank_of(c, n, mine);
  __syncwarp();
  if (lane < n && rank < K) out[rank] = mine;
  __syncwarp();
}

/// The merge of a token's G slices by one warp: @p c holds the G * K <= 32 candidates (each
/// slice's top K in selection order), ranked by router_rank with the winners k < K written
/// back to c[k]. The token's top K are among the candidates (an expert beaten by fewer than
/// K of the token's experts is beaten by fewer than K of its slice) and every expert that
/// beats one of them is a candidate too, so rank = the rank among all E experts: the same
/// winners in the same order as one selection over E (never kNoCandidate: K real experts
/// beat it).
__device__ __forceinline__ void router_merge(uint64_t* c, uint32_t n, uint32_t K) { router_rank(c, n, K, c); }

/// Shared scratch of router_select_single.
struct SingleScratch {
  uint32_t wmax[kRouterMaxWarps];  // each warp's largest key
  uint32_t n;                          // experts at or above the threshold
  alignas(16) uint64_t sel[32];        // their candidates (the first 32)
  float sel_s[32];                     // and their scores (router_decode_token)
};

/// tau of router_select_single from the warps' largest keys s.wmax (after the barrier that
/// published them): the K-th largest of the Wh maxima, counted with multiplicity (lane j
/// counts the maxima >= its own, the largest with a count >= K is tau), in every lane.
__device__ __forceinline__ uint32_t router_single_tau(const SingleScratch& s, uint32_t Wh, uint32_t K) {
  const uint32_t lane = threadIdx.x % 32u;
  const uint32_t mj = lane < Wh ? s.wmax[lane] : 0u;
  uint32_t ge = 0;
  MEGAMOE_UNROLL
  for (uint32_t i = 0; i < static_cast<uint32_t>(kRouterMaxWarps); ++i) {
    if (i < Wh) ge += s.wmax[i] >= mj ? 1u : 0u;
  }
  return warp_extreme<true>(lane < Wh && ge >= K ? mj : 0u);
}

/// The top K of a block's only token without K rounds (K <= the warps that hold experts):
/// each warp's largest key (one redux), a barrier; tau = the K-th largest of those W
/// maxima, counted with multiplicity (every warp computes it: lane j counts the maxima >=
/// its own, the largest with a count >= K is tau). At least K experts have a key >= tau
/// (the K warps' maxima), so the token's top K are among the experts at or above it; they
/// are compacted into shared memory (a shared atomic counter), and after a second barrier
/// warp 0 ranks them, one a lane, against each other by broadcast reads: the same winners
/// in the same order as K rounds of argmax over E (candidates are distinct: the id is part
/// of them). Returns false (block-uniform) when more than 32 experts reach tau (many equal
/// keys: all-equal logits), and then nothing is written to @p out. @p key: the token's E
/// keys in shared memory; @p Wh: the warps holding experts (>= K); @p out: K candidates,
/// written by warp 0.
__device__ __forceinline__ bool router_select_single(const uint32_t* key, uint32_t E, uint32_t K, uint32_t Wh,
                                                     SingleScratch& s, uint64_t* out) {
  const uint32_t lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  uint32_t m = 0;
  for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) m = max(m, key[e]);
  m = warp_extreme<true>(m);
  if (lane == 0u) s.wmax[warp] = m;
  if (threadIdx.x == 0u) s.n = 0u;
  __syncthreads();
  const uint32_t tau = router_single_tau(s, Wh, K);
  for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
    const uint32_t k = key[e];
    if (k >= tau) {
      const uint32_t slot = atomicAdd(&s.n, 1u);
      if (slot < 32u) s.sel[slot] = router_candidate(k, e);
    }
  }
  __syncthreads();
  const uint32_t n = s.n;
  if (n > 32u) return false;
  if (warp == 0u) router_rank(s.sel, n, K, out);
  return true;
}

/// Hash layer token t by one warp: lane k scores tid2eid[input_ids[t], k].
__device__ __forceinline__ void router_hash(const RouterParams& r, int64_t t, bool rec) {
  const uint32_t lane = threadIdx.x % 32u;
  const int64_t row = (r.flags & kRouteInputIdsI64) ? static_cast<const int64_t*>(r.input_ids)[t * r.iid_s0]
                                                    : static_cast<const int32_t*>(r.input_ids)[t * r.iid_s0];
  // Warp-uniform. A padded token is never routed (the contract: ids -1, weights +0.0, not recorded),
  // whatever its table row says.
  const bool keep = !router_padded(r, t) && row >= 0 && row < r.V;
  int64_t id = -1;
  float s = 0.0f;
  if (keep && lane < r.K) {
    id = r.tid2eid[row * r.tab_s0 + lane * r.tab_s1];
    if (id >= 0 && id < r.E) s = core::router_score(router_logit(r, t, id));
    else id = -1;
  }
  // The sum in k order, every lane the same: an invalid entry adds nothing.
  const uint32_t valid = __ballot_sync(0xFFFFFFFFu, id >= 0);
  float v[core::kMaxRouterTopk];
  MEGAMOE_UNROLL
  for (int k = 0; k < core::kMaxRouterTopk; ++k) v[k] = __shfl_sync(0xFFFFFFFFu, s, k);
  float sum = 0.0f;
  MEGAMOE_UNROLL
  for (int k = 0; k < core::kMaxRouterTopk; ++k) {
    if (k < r.K && ((valid >> k) & 1u)) sum = core::add_rn(sum, v[k]);
  }
  if (lane < r.K) {
    router_store(r, t, lane, keep, id, core::router_weight(s, core::weight_denominator(sum), r.alpha), rec);
  }
}

/// The one-token decode block applies (block-uniform): one token a block, no hash layer,
/// at most two experts a thread and K at most the warps holding experts (router_select_single's
/// condition). Every field it reads shares the parameters' first line.
__device__ __forceinline__ bool router_decode_applies(const RouterParams& r) {
  const uint32_t E = static_cast<uint32_t>(r.E), warps = blockDim.x / 32u, cols = (E + 31u) / 32u;
  return r.tpb == 1u && (r.flags & kRouteHash) == 0u && E <= 2u * blockDim.x &&
         static_cast<uint32_t>(r.K) <= (warps < cols ? warps : cols);
}

/// Token t of a one-token block (router_decode_applies), the decode case written for itself:
/// expert tid and tid + blockDim.x of a thread (their loads issued first), their scores side
/// by side (core::router_scores, two chains where the warp's first lane has a second
/// expert), the keys kept in registers: each warp's largest before the one barrier after the
/// scores, then tau and the compaction of the experts at or above it from registers
/// (router_select_single's rule and winners) with their scores beside them, a second
/// barrier, and warp 0 ranks them and finishes without another shared-memory round trip:
/// lane q holds candidate q, its rank and its score; the K winners' scores reach every lane
/// by a ballot and a shuffle each, summed in rank order (router_finish's order), and the
/// lane of rank k stores entry k. More than 32 experts at or above tau (many equal keys):
/// warp 0 selects by K rounds over the keys in shared memory (router_slice_topk) and
/// router_finish. The same bytes as router_block_body's path for the same token.
template <bool kInlined>
__device__ __forceinline__ void router_decode_token(const RouterParams& r, int64_t t, uint32_t* key, float* score,
                                                    SingleScratch& s, uint64_t* cand) {
  const uint32_t tid = threadIdx.x, lane = tid % 32u, warp = tid / 32u;
  const uint32_t E = static_cast<uint32_t>(r.E), K = static_cast<uint32_t>(r.K);
  const bool biased = (r.flags & kRouteBias) != 0;
  const uint32_t e[2] = {tid, tid + blockDim.x};
  const bool v[2] = {e[0] < E, e[1] < E};
  // Whether the warp's first lane has a second expert (warp-uniform).
  const bool two = blockDim.x + (tid & ~31u) < E;
  // The loads without a branch a lane: a lane past E loads expert 0's (a valid address),
  // unused.
  uint32_t xb[2], bb[2] = {0u, 0u};
  MEGAMOE_UNROLL
  for (int c = 0; c < 2; ++c) {
    const uint32_t ec = v[c] ? e[c] : 0u;
    xb[c] = c == 0 || two ? router_logit_bits(r, t, ec) : 0u;
    if (biased && (c == 0 || two)) bb[c] = router_bias_bits(r, ec);
  }
  const uint32_t pad_byte = router_pad_byte(r, t);
  const int32_t rec_word = (r.flags & kRouteEplb) != 0 && warp == 0u ? *r.record : 0;
  float x[2], b[2];
  MEGAMOE_UNROLL
  for (int c = 0; c < 2; ++c) {
    x[c] = v[c] ? real_of_bits(xb[c], (r.flags & kRouteLogitsBF16) != 0) : 0.0f;
    b[c] = v[c] ? real_of_bits(bb[c], (r.flags & kRouteBiasBF16) != 0) : 0.0f;
  }
  uint32_t nf = 0;
  MEGAMOE_UNROLL
  for (int c = 0; c < 2; ++c) nf += v[c] && core::non_finite(x[c]) ? 1u : 0u;
  float sc[2] = {0.0f, 0.0f};
  if (two) {
    core::router_scores<2, kInlined, kInlined>(x, sc);
  } else {
    const float x1[1] = {x[0]};
    float s1[1];
    core::router_scores<1, kInlined, kInlined>(x1, s1);
    sc[0] = s1[0];
  }
  // The counter's shuffles and atomic after the scores, off the chain to them.
  if (r.nonfinite != nullptr) flush_nonfinite(r.nonfinite, nf);
  const bool padded = pad_byte != 0u;  // block-uniform
  uint32_t k[2], m = 0;
  MEGAMOE_UNROLL
  for (int c = 0; c < 2; ++c) {
    k[c] = biased ? core::biased_key(sc[c], b[c]) : core::selection_key(sc[c]);
    if (v[c]) {
      m = max(m, k[c]);
      if (!padded) {  // (the keys and scores in shared memory: the fallback's)
        key[e[c]] = k[c];
        score[e[c]] = sc[c];
      }
    }
  }
  m = warp_extreme<true>(m);
  if (lane == 0u) s.wmax[warp] = m;
  if (tid == 0u) s.n = 0u;
  __syncthreads();
  const bool rec = rec_word != 0;
  if (padded) {
    if (warp == 0u && lane < K) router_store(r, t, lane, false, -1, 0.0f, rec);
    return;
  }
  const uint32_t warps = blockDim.x / 32u, cols = (E + 31u) / 32u;
  const uint32_t tau = router_single_tau(s, warps < cols ? warps : cols, K);
  MEGAMOE_UNROLL
  for (int c = 0; c < 2; ++c) {
    if (v[c] && k[c] >= tau) {
      const uint32_t slot = atomicAdd(&s.n, 1u);
      if (slot < 32u) {
        s.sel[slot] = router_candidate(k[c], e[c]);
        s.sel_s[slot] = sc[c];
      }
    }
  }
  __syncthreads();
  if (warp != 0u) return;
  const uint32_t n = s.n;
  if (n > 32u) {  // warp-uniform
    router_slice_topk(key, E, K, 0u, 1u, cand);
    __syncwarp();
    router_finish(r, t, cand, score, rec);
    return;
  }
  const uint64_t mine = lane < n ? s.sel[lane] : kNoCandidate;
  const float ms = lane < n ? s.sel_s[lane] : 0.0f;
  const uint32_t rank = router_rank_of(s.sel, n, mine);
  const bool win = lane < n && rank < K;  // K winners, ranks 0..K-1 (distinct candidates)
  // K <= the block's warps <= kRouterMaxWarps: winner q's score from the lane of rank q (a
  // ballot past K is empty and its shuffle unused), added in rank order.
  static_assert(kRouterMaxWarps == 8, "eight ranks");
  float wq[kRouterMaxWarps];
  MEGAMOE_UNROLL
  for (uint32_t q = 0; q < static_cast<uint32_t>(kRouterMaxWarps); ++q) {
    wq[q] = __shfl_sync(0xFFFFFFFFu, ms, __ffs(__ballot_sync(0xFFFFFFFFu, win && rank == q)) - 1);
  }
  float sum = 0.0f;
  MEGAMOE_UNROLL
  for (uint32_t q = 0; q < static_cast<uint32_t>(kRouterMaxWarps); ++q) {
    if (q < K) sum = core::add_rn(sum, wq[q]);
  }
  if (win) {
    router_store(r, t, rank, true, candidate_id(mine),
                 core::router_weight(ms, core::weight_denominator(sum), r.alpha), rec);
  }
}

/// Rows T..M-1 of the staged top-k (the full buffer's tail), spread over all router blocks.
__device__ __forceinline__ void router_fill_tail(const RouterParams& r, uint32_t rb) {
  if ((r.flags & kRouteStaged) == 0u) return;
  const int64_t n = (r.M - r.T) * r.K;
  for (int64_t i = static_cast<int64_t>(rb) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(r.blocks) * blockDim.x) {
    const int64_t t = r.T + i / r.K, k = i % r.K;
    mark_empty(r, t, k);
  }
}

/// N of a thread's entries of the block's ntok x E scores: entries i, i + blockDim.x, ...
/// (entry w * E + e: token t0 + w, expert e; those from @p n on are stand-ins, neither
/// counted nor stored). Every load is issued before the scores, which run side by side
/// (core::router_scores); the key and the score go to shared memory unless the token is
/// padded; hash layers only count. kInlined: as for router_block_body.
template <int N, bool kInlined>
__device__ __forceinline__ void router_score_entries(const RouterParams& r, int64_t t0, uint32_t i, uint32_t n,
                                                     uint32_t& nf, uint32_t* key, float* score) {
  const uint32_t E = static_cast<uint32_t>(r.E);
  const bool biased = (r.flags & kRouteBias) != 0;
  uint32_t idx[N], pad[N], xb[N], bb[N];
  float x[N], b[N];
  // Every load of the N entries first; what reads them (the widening, the counter, the
  // padding test) after all are issued. A stand-in loads token t0's expert 0 (a valid
  // address), unused.
  MEGAMOE_UNROLL
  for (int c = 0; c < N; ++c) {
    idx[c] = i + static_cast<uint32_t>(c) * blockDim.x;
    const bool valid = idx[c] < n;
    // One token a block (decode): no division on the way to the first load.
    const uint32_t w = valid && E < n ? idx[c] / E : 0u, e = valid ? idx[c] - w * E : 0u;
    xb[c] = router_logit_bits(r, t0 + w, e);
    bb[c] = biased ? router_bias_bits(r, e) : 0u;
    pad[c] = valid ? router_pad_byte(r, t0 + w) : 1u;  // a stand-in is never stored
  }
  MEGAMOE_UNROLL
  for (int c = 0; c < N; ++c) {
    const bool valid = idx[c] < n;
    x[c] = valid ? real_of_bits(xb[c], (r.flags & kRouteLogitsBF16) != 0) : 0.0f;
    b[c] = valid ? real_of_bits(bb[c], (r.flags & kRouteBiasBF16) != 0) : 0.0f;
  }
  if (r.nonfinite != nullptr) {
    MEGAMOE_UNROLL
    for (int c = 0; c < N; ++c) nf += (idx[c] < n && core::non_finite(x[c])) ? 1u : 0u;
  }
  if (r.flags & kRouteHash) return;
  float s[N];
  core::router_scores<N, kInlined, kInlined>(x, s);
  MEGAMOE_UNROLL
  for (int c = 0; c < N; ++c) {
    if (pad[c] == 0u) {
      score[idx[c]] = s[c];
      key[idx[c]] = biased ? core::biased_key(s[c], b[c]) : core::selection_key(s[c]);
    }
  }
}

/// The thread's next entries from @p i: as many as the warp's first lane has @p rows left
/// (warp-uniform), at most N side by side. Returns how many it took.
template <int N, bool kInlined>
__device__ __forceinline__ uint32_t router_score_rows(const RouterParams& r, int64_t t0, uint32_t i, uint32_t n,
                                                      uint32_t rows, uint32_t& nf, uint32_t* key, float* score) {
  if constexpr (N > 1) {
    if (rows < static_cast<uint32_t>(N)) return router_score_rows<N - 1, kInlined>(r, t0, i, n, rows, nf, key, score);
  }
  router_score_entries<N, kInlined>(r, t0, i, n, nf, key, score);
  return N;
}


/// The kernel's RouterParams into shared memory, one word a thread, then a barrier. Called
/// in the __global__ function itself, where @p src is known to be the kernel's parameter
/// (ld.param with a register offset: constant-bank loads); the noinline router_block would
/// see it only through a generic address, each load of which is a slow round trip (about
/// 430 cycles for a copy through it and its barrier on sm_90, measured), and every later
/// field read would be one, reloaded after each store the compiler cannot prove does not
/// alias it.
__device__ __forceinline__ void router_params_to_shared(const RouterParams& src, RouterParams& dst) {
  static_assert(sizeof(RouterParams) % 4 == 0, "copied as words");
  for (uint32_t i = threadIdx.x; i < sizeof(RouterParams) / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(&dst)[i] = reinterpret_cast<const uint32_t*>(&src)[i];
  }
  __syncthreads();
}

/// Router block @p rb (0-based among the router blocks). Every thread of the block calls
/// it (barriers, warp shuffles). @p kChains: the most scores a thread runs side by side,
/// what the caller's registers hold. @p r: the kernel's own parameter (route_kernel, which
/// inlines this: every field a constant-bank operand) or a copy in shared memory
/// (router_block). @p kInlined: the body is inlined into its kernel (route_kernel, the
/// fused decode variant), whose register budget takes the exact score fallback as a call
/// and the branch-free square root and reciprocal (core::router_scores' kCold and
/// kBranchFree); false in router_block.
template <int kChains, bool kInlined>
__device__ __forceinline__ void router_block_body(const RouterParams& r, uint32_t rb) {
  static_assert(kChains >= 1 && kChains <= 4, "1 to 4 scores side by side");
  __shared__ uint32_t sh_key[kRouterSmemEntries];
  __shared__ float sh_s[kRouterSmemEntries];
  __shared__ uint64_t sh_cand[kRouterMaxWarps * core::kMaxRouterTopk];
  __shared__ SingleScratch sh_single;
  if constexpr (kInlined) {
    if (router_decode_applies(r)) {  // block-uniform
      if (static_cast<int64_t>(rb) < r.T) router_decode_token<kInlined>(r, rb, sh_key, sh_s, sh_single, sh_cand);
      router_fill_tail(r, rb);
      return;
    }
  }
  const uint32_t warp = threadIdx.x / 32u, lane = threadIdx.x % 32u;
  const int64_t t0 = static_cast<int64_t>(rb) * r.tpb;
  const uint32_t ntok = static_cast<uint32_t>(t0 < r.T ? (r.T - t0 < r.tpb ? r.T - t0 : r.tpb) : 0);
  const uint32_t E = static_cast<uint32_t>(r.E), K = static_cast<uint32_t>(r.K);
  const bool hash = (r.flags & kRouteHash) != 0;
  // One token and K <= the warps holding experts (decode): router_select_single, padding
  // known to every warp. Block-uniform, and cheap: on this path nothing but the loads'
  // addresses comes before the first logit load (the selection's warp split, with its
  // integer divisions, is computed only where it is used).
  const uint32_t cols = (E + 31u) / 32u, holding = blockDim.x / 32u < cols ? blockDim.x / 32u : cols;
  const bool single = !hash && ntok == 1u && K <= holding;
  // Selection otherwise: G warps per token, warp = token * G + slice (a full block's G
  // comes from the host). Padding is loaded before the scores either way.
  const auto group_of_block = [&]() -> uint32_t {
    return hash || ntok == 0 ? 1u : ntok == r.tpb ? r.group : router_group(blockDim.x / 32u, ntok, E, K);
  };
  // The padding byte of the token this warp selects for and the EPLB record flag (read by
  // the lanes that store) are loaded now and tested after the scores: their latency hides
  // behind the logit loads instead of holding them back.
  uint32_t G = 1u, pad_byte = 0u;
  if (single) {
    pad_byte = router_pad_byte(r, t0);
  } else {
    G = group_of_block();
    if (!hash && warp / G < ntok) pad_byte = router_pad_byte(r, t0 + warp / G);
  }
  const int32_t rec_word = (r.flags & kRouteEplb) != 0 && lane < K ? *r.record : 0;
  // 1. Scores of the block's tokens (padded ones only counted), entry w * E + e of the
  // block's ntok x E spread over the threads (i, i + blockDim.x, ...): up to kChains of a
  // thread's entries at a time, as many as the warp's first lane still has (warp-uniform),
  // so that no chain is a stand-in except in the one warp that straddles n.
  uint32_t nf = 0;
  if (!hash || r.nonfinite != nullptr) {
    const uint32_t n = ntok * E;  // <= kRouterSmemEntries
    // Block sizes are powers of two in practice: a shift instead of a division a step.
    const bool pow2 = (blockDim.x & (blockDim.x - 1u)) == 0u;
    const uint32_t shift = static_cast<uint32_t>(__ffs(static_cast<int>(blockDim.x)) - 1);
    for (uint32_t i = threadIdx.x; i < n;) {
      const uint32_t left = n - (i - lane) + blockDim.x - 1u;
      const uint32_t rows = pow2 ? left >> shift : left / blockDim.x;
      i += router_score_rows<kChains, kInlined>(r, t0, i, n, rows, nf, sh_key, sh_s) * blockDim.x;
    }
  }
  if (r.nonfinite != nullptr) flush_nonfinite(r.nonfinite, nf);
  __syncthreads();
  const bool padded = pad_byte != 0u, rec = rec_word != 0;
  // 2. Selection: each warp the top K of its slice of its token, then (G > 1) the token's
  // first warp merges the slices; 3. that warp's lanes k < K: weights and stores.
  if (hash) {
    if (warp < ntok) router_hash(r, t0 + warp, rec);
  } else if (single && padded) {
    if (warp == 0u && lane < K) router_store(r, t0, lane, false, -1, 0.0f, rec);
  } else if (single && router_select_single(sh_key, E, K, holding, sh_single, sh_cand)) {
    if (warp == 0u) router_finish(r, t0, sh_cand, sh_s, rec);
  } else if (ntok > 0) {  // (also a single token whose threshold let more than 32 experts through)
    if (single) G = group_of_block();
    const uint32_t tok = warp / G, slice = warp % G;
    const bool selects = tok < ntok;
    uint64_t* cand = sh_cand + warp * K;  // the token's G * K candidates from its first warp on
    if (selects && !padded) {
      const uint32_t J = cols > slice ? (cols - slice + G - 1u) / G : 0u;  // warp-uniform
      if (J <= kRouterRegColumns) router_slice_topk_regs(sh_key + tok * E, E, K, slice, G, J, cand);
      else router_slice_topk(sh_key + tok * E, E, K, slice, G, cand);
    }
    if (G > 1u) __syncthreads();  // block-uniform
    else __syncwarp();
    if (selects && slice == 0u) {
      if (padded) {
        if (lane < K) router_store(r, t0 + tok, lane, false, -1, 0.0f, rec);
      } else {
        if (G > 1u) router_merge(cand, G * K, K);
        router_finish(r, t0 + tok, cand, sh_s + tok * E, rec);
      }
    }
  }
  router_fill_tail(r, rb);
}

/// router_block_body not inlined, for the fused kernel: it has one instantiation per
/// quantizing variant, and this way the router code is compiled once per unit and
/// kChains; @p r is the kernel's parameters in shared memory (router_params_to_shared).
template <int kChains>
__device__ __noinline__ void router_block(const RouterParams& r, uint32_t rb) {
  router_block_body<kChains, false>(r, rb);
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
