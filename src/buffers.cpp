// buffers.cpp: DeepGEMM's MegaMoE symmetric buffers (include/megamoe/buffers.h), computed
// from the formulas recorded in docs/BUFFERS.md. DeepGEMM sizes the buffer in 32-bit ints
// (its API takes int, its layout structs hold uint32); a size that would leave those ranges
// wraps or is undefined there, so it is refused here by name instead of being computed
// exactly to a number DeepGEMM never reaches. Everything else is int64 checked arithmetic.
#include "megamoe/buffers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "check.h"
#include "core/checked.h"
#include "megamoe/error.h"

namespace megamoe {
namespace deepgemm {
namespace {

using core::Checked;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kUint32Max = std::numeric_limits<uint32_t>::max();

// The block sizes DeepGEMM's kernels may pick, their least common multiple (the token
// alignment) and the smallest one; the ring variant's set is the shorter one.
constexpr int64_t kBlockMs[] = {8, 16, 32, 64, 96, 128, 192, 240};
constexpr int64_t kRingBlockMs[] = {8, 16, 32, 64, 96, 128, 192};
constexpr int64_t kLcmBlockM = 1920, kMaxBlockM = 240, kRingLcmBlockM = 384, kRingMaxBlockM = 192;
constexpr int64_t kMinBlockM = 8;
constexpr int64_t kSm90TokenAlignment = 128;
// The SM90 pool's scale rows are sized for its largest padding, block M = 64.
constexpr int64_t kSm90SfBlockM = 64;

// Limits of the fixed signal block of the workspace (MegaMoESignals) and its size: the
// struct's fields with their alignments, for DeepGEMM's 72 ranks at most.
constexpr int64_t kMaxRanks = 72, kMaxExperts = 2048, kMaxExpertsPerRank = 512;
constexpr int64_t kMaxRingBlocks = int64_t{1} << 20, kMaxSharedL2Blocks = int64_t{1} << 15;
constexpr int64_t align_c(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
constexpr int64_t signals_bytes() {
  int64_t o = 4 * 4 + 4 + 2 * 4 + 4 * 4;                                  // grid sync, NVLink barrier, task counters
  o = align_c(o, 128) + kMaxRanks * 8;                                    // combine_ready_grid_idx, alignas(128)
  o = align_c(o, 128) + kMaxRanks * 8;                                    // peer_grid_idx, alignas(128)
  o = align_c(o, 128) + (2 * kMaxExperts + kMaxExpertsPerRank) * 8;       // expert send/recv counts
  o += 2 * kMaxRingBlocks * 4;                                            // l1_full_count, l1_empty_count
  o = align_c(o, 8) + kMaxRingBlocks * 8;                                 // l2_full_mask
  o += kMaxRingBlocks * 4 + kMaxSharedL2Blocks * 4 + kMaxRingBlocks * 4;  // l2_empty, shared_l2_full, l2_full
  return align_c(o, 128);                                                 // the struct is alignas(128)
}
constexpr int64_t kSignalsBytes = signals_bytes();

std::string num(int64_t v) { return std::to_string(v); }

// Every count DeepGEMM's API takes as int.
void check_int(int64_t v, const char* name, int64_t lo) {
  MEGAMOE_CHECK(
      v >= lo && v <= kInt32Max, name,
      std::string(lo == 0 ? "an int in [0, " : "an int in [1, ") + num(kInt32Max) + "] (DeepGEMM takes it as int)", v);
}

// A value DeepGEMM computes in a 32-bit int (max kInt32Max) or uint32 (kUint32Max): the
// argument it comes from, the expression and the value.
int64_t fit(int64_t v, int64_t max, const char* arg, const char* expr) {
  MEGAMOE_CHECK(
      v <= max, arg,
      std::string(expr) + " to fit DeepGEMM's " + (max == kInt32Max ? "int" : "uint32") + " (at most " + num(max) + ")",
      v);
  return v;
}
int64_t i32(int64_t v, const char* arg, const char* expr) { return fit(v, kInt32Max, arg, expr); }
int64_t u32(int64_t v, const char* arg, const char* expr) { return fit(v, kUint32Max, arg, expr); }

// DeepGEMM's ceil_div and align on int: (a + b - 1) / b, whose sum must fit too. The
// operands here are at most 2^31 each, so the int64 sums and products are exact.
int64_t cdiv32(int64_t a, int64_t b, const char* arg, const char* expr) { return i32(a + b - 1, arg, expr) / b; }
int64_t align32(int64_t a, int64_t b, const char* arg, const char* expr) {
  return i32(cdiv32(a, b, arg, expr) * b, arg, expr);
}

// get_num_max_live_pool_blocks of DeepGEMM's scheduler: the L1/L2 pool blocks live at once
// for M blocks on num_sms SMs (2-CTA clusters, 128-wide N blocks: 256 columns a cluster).
int64_t live_pool_blocks(int64_t M, int64_t sms, int64_t H, int64_t IH) {
  const char* a = "intermediate_hidden";
  const int64_t C = sms / 2;
  const int64_t l1n = i32(IH * 2, a, "intermediate_hidden * 2") / 256;
  const int64_t l2n = H / 256;
  const int64_t l1c = i32(M * l1n, a, "the L1 cluster tasks (pool blocks * 2 * intermediate_hidden / 256)");
  const int64_t l1w = cdiv32(l1c, C, a, "the L1 cluster tasks");
  const int64_t first_m = cdiv32(C, l2n, "num_sms", "num_sms / 2");
  const int64_t warm_first =
      cdiv32(i32(first_m * l1n, a, "the first L2 wave's L1 tasks"), C, a, "the first L2 wave's L1 tasks");
  const int64_t diff = l1n > l2n ? l1n - l2n : 0;
  const int64_t pending = i32(l1n + i32((M - 1) * diff, a, "the pending L1 tasks"), a, "the pending L1 tasks");
  const int64_t warm_interleave = cdiv32(pending, C, a, "the pending L1 tasks") + 1;
  const int64_t warm = std::min(std::max(warm_first, warm_interleave), l1w);
  const int64_t warm_clusters = std::min(i32(warm * C, a, "the warmup clusters"), l1c);
  const int64_t live = cdiv32(warm_clusters, l1n, a, "the warmup clusters");
  const int64_t growth =
      l2n > l1n ? cdiv32(i32(M * (l2n - l1n), "hidden", "the frontier growth (pool blocks * (H - 2 IH) / 256)"), l2n,
                         "hidden", "the frontier growth")
                : 0;
  const int64_t margin = cdiv32(C, std::min(l1n, l2n), "num_sms", "num_sms / 2");
  return std::min(M, i32(live + growth + margin, a, "the live pool blocks"));
}

// get_num_sf_ring_tokens: the scale rows of a ring of n tokens in blocks of bm, each block's
// rows padded to 128 (the kernels' 128-row scale tiles).
int64_t sf_ring_tokens(int64_t n, int64_t bm) {
  return i32(n / bm * align_c(bm, 128), "num_ring_tokens", "the scale ring rows");
}

// Appends DeepGEMM's buffers in order, each at the previous one's end.
class Builder {
 public:
  explicit Builder(BufferLayout& l) : l_(l) {}

  // A region of @p bytes (DeepGEMM's record bytes times its records) with its view; listed
  // when DeepGEMM slices a view of it or it has bytes.
  void add(const char* name, Checked bytes, DType dt, std::initializer_list<int64_t> shape,
           std::initializer_list<int64_t> strides, Role role, bool sliced) {
    if (!bytes.ok()) overflow(name);
    Region r;
    r.name = name;
    r.offset = end_.value();
    r.nbytes = bytes.value();
    r.dtype = dt;
    r.ndim = static_cast<int>(shape.size());
    Checked elems = 1;
    int i = 0;
    for (int64_t s : shape) {
      r.shape[i++] = s;
      elems = elems * s;
    }
    i = 0;
    for (int64_t s : strides) r.strides[i++] = s;
    r.role = role;
    r.sliced = sliced;
    // The view covers the region exactly; the divisibility rules checked before make it so.
    if (!(elems * dtype_size(dt)).ok() || (elems * dtype_size(dt)).value() != r.nbytes) {
      throw Error(ErrorCode::kInternal, std::string("megamoe: deepgemm buffer: ") + name + ": view of " +
                                            num((elems * dtype_size(dt)).value()) + " bytes over a region of " +
                                            num(r.nbytes));
    }
    end_ = end_ + bytes;
    if (!end_.ok()) overflow(name);
    if (sliced || r.nbytes > 0) l_.regions.push_back(r);
  }
  int64_t end() const { return end_.value(); }

 private:
  [[noreturn]] void overflow(const char* name) {
    throw Error(ErrorCode::kInvalidArgument, std::string("megamoe: deepgemm buffer: ") + name +
                                                 ": the buffer's size up to this region does not fit in int64");
  }
  BufferLayout& l_;
  Checked end_ = 0;
};

void check_common(const BufferArgs& a) {
  check_int(a.num_ranks, "num_ranks", 1);
  check_int(a.num_experts, "num_experts", 0);
  check_int(a.num_max_tokens_per_rank, "num_max_tokens_per_rank", 0);
  check_int(a.num_topk, "num_topk", 0);
  check_int(a.hidden, "hidden", 1);
  check_int(a.intermediate_hidden, "intermediate_hidden", 1);
  MEGAMOE_CHECK(a.num_experts % a.num_ranks == 0, "num_experts",
                "a multiple of num_ranks = " + num(a.num_ranks) + " (DeepGEMM: num_experts % num_ranks == 0)",
                a.num_experts);
}

// The aligned token count, as DeepGEMM's Python aligns it before passing it on as int.
int64_t aligned_tokens(const BufferArgs& a, int64_t alignment) {
  return i32(align_c(a.num_max_tokens_per_rank, alignment), "num_max_tokens_per_rank",
             "num_max_tokens_per_rank aligned up to the token alignment");
}

// The Workspace constructor's limits (the fixed signal block's capacities) that depend on
// the arguments alone.
void check_workspace_limits(const BufferArgs& a, int64_t T) {
  MEGAMOE_CHECK(a.num_ranks <= kMaxRanks, "num_ranks", "at most 72 (DeepGEMM: num_ranks <= kNumMaxRanks)", a.num_ranks);
  MEGAMOE_CHECK(a.num_experts <= kMaxExperts, "num_experts", "at most 2048 (DeepGEMM: num_experts <= kNumMaxExperts)",
                a.num_experts);
  MEGAMOE_CHECK(a.num_experts / a.num_ranks <= kMaxExpertsPerRank, "num_experts",
                "at most 512 experts per rank (DeepGEMM: num_experts_per_rank <= kNumMaxExpertsPerRank)",
                a.num_experts / a.num_ranks);
  MEGAMOE_CHECK(align_c(T, kMinBlockM) / kMinBlockM <= kMaxSharedL2Blocks, "num_max_tokens_per_rank",
                "at most 2^15 blocks of 8 aligned tokens (DeepGEMM: ceil(num_max_tokens_per_rank / 8) <= "
                "kNumMaxSharedL2Blocks)",
                T);
}
void check_ring_limit(int64_t ring) {
  MEGAMOE_CHECK(ring <= kMaxRingBlocks * kMinBlockM, "num_ring_tokens",
                "at most 2^23 (DeepGEMM: num_ring_tokens <= kNumMaxRingBlocks * 8)", ring);
}

// The workspace of the signal-block layout: signals, the source token-topk table (E * T
// uint32) and the combine metadata (12 bytes a pool token), aligned to 16.
Checked workspace_bytes(const BufferArgs& a, int64_t T, int64_t P) {
  const int64_t table = u32(a.num_experts * T, "num_experts", "num_experts * num_max_tokens_per_rank");
  return core::round_up(Checked(kSignalsBytes) + Checked(table) * 4 + Checked(P) * 12, 16);
}

// get_num_max_pool_tokens: every routed token once per distinct local expert plus each
// expert's padding to the largest block, aligned to the block sizes' lcm; computed in int
// (max kInt32Max) or, by the ring layout's workspace, in uint32 (kUint32Max).
int64_t pool_tokens(const BufferArgs& a, int64_t T, int64_t max_bm, int64_t lcm, int64_t max) {
  const int64_t er = a.num_experts / a.num_ranks;
  const char* arg = "num_max_tokens_per_rank";
  const int64_t recv = fit(a.num_ranks * T, max, arg, "num_ranks * num_max_tokens_per_rank");
  const int64_t routed = fit(recv * std::min(a.num_topk, er), max, arg, "the routed tokens");
  const int64_t padded = fit(routed + er * (max_bm - 1), max, arg, "the pool tokens");
  return fit(fit(padded + lcm - 1, max, arg, "the pool tokens") / lcm * lcm, max, arg, "the pool tokens");
}

Checked records(int64_t tokens, int64_t record) { return Checked(tokens) * record; }

BufferLayout sm90(const BufferArgs& a) {
  check_common(a);
  MEGAMOE_CHECK(a.num_shared_experts == 0, "num_shared_experts", "0 (SM90 FP8 MegaMoE has no shared experts)",
                a.num_shared_experts);
  MEGAMOE_CHECK(a.activation == Activation::kSwiglu, "activation",
                "swiglu (DeepGEMM: SM90 FP8 MegaMoE currently supports the swiglu activation only)",
                to_string(a.activation));
  const int64_t T = aligned_tokens(a, kSm90TokenAlignment);
  MEGAMOE_CHECK(T > 0, "num_max_tokens_per_rank", "> 0 (DeepGEMM: num_max_tokens_per_rank > 0)", T);
  MEGAMOE_CHECK(a.hidden % 256 == 0, "hidden",
                "a positive multiple of 256 (DeepGEMM: SM90 FP8 MegaMoE requires hidden to be a positive multiple "
                "of 256 for combine vectorization)",
                a.hidden);
  MEGAMOE_CHECK(a.intermediate_hidden % 128 == 0, "intermediate_hidden",
                "a positive multiple of 128 (DeepGEMM: SM90 FP8 MegaMoE requires intermediate_hidden to be a "
                "positive multiple of 128)",
                a.intermediate_hidden);
  check_workspace_limits(a, T);
  const int64_t P = pool_tokens(a, T, kMaxBlockM, kLcmBlockM, kInt32Max);
  check_ring_limit(P);  // the workspace's ring is the pool
  const int64_t K = a.num_topk, H = a.hidden, IH = a.intermediate_hidden;
  const int64_t idx_record = u32(K * 8, "num_topk", "num_topk * 8"), w_record = K * 4;
  const int64_t nsf = sf_ring_tokens(P, kSm90SfBlockM);

  BufferLayout l;
  l.args = a;
  l.token_alignment = kSm90TokenAlignment;
  l.num_max_tokens = T;
  l.num_max_pool_tokens = P;
  l.num_ring_tokens = P;
  l.num_sf_ring_tokens = nsf;
  const Checked ws = workspace_bytes(a, T, P);
  Builder b(l);
  b.add("workspace", ws, DType::kUInt8, {ws.ok() ? ws.value() : 0}, {1}, Role::kScratch, false);
  b.add("x", records(T, H), DType::kFloat8E4M3, {T, H}, {H, 1}, Role::kInput, true);
  b.add("x_sf", records(T, H / 32), DType::kFloat32, {T, H / 128}, {H / 128, 1}, Role::kInput, true);
  b.add("topk_idx", records(T, idx_record), DType::kInt64, {T, K}, {K, 1}, Role::kInput, true);
  b.add("topk_weights", records(T, w_record), DType::kFloat32, {T, K}, {K, 1}, Role::kInput, true);
  b.add("l1_acts", records(P, H), DType::kFloat8E4M3, {P, H}, {H, 1}, Role::kScratch, true);
  b.add("l1_acts_sf", records(nsf, H / 32), DType::kFloat32, {nsf, H / 128}, {1, nsf}, Role::kScratch, true);
  b.add("l1_topk_weights", records(P, 4), DType::kFloat32, {P}, {1}, Role::kScratch, false);
  b.add("l2_acts", records(P, IH), DType::kFloat8E4M3, {P, IH}, {IH, 1}, Role::kScratch, true);
  b.add("l2_acts_sf", records(nsf, IH / 16), DType::kFloat32, {nsf, IH / 64}, {1, nsf}, Role::kScratch, true);
  b.add("combine", records(K, T) * (2 * H), DType::kBFloat16, {K * T, H}, {H, 1}, Role::kScratch, false);
  l.workspace_bytes = ws.value();
  l.nbytes = b.end();
  return l;
}

BufferLayout sm100(const BufferArgs& a) {
  check_common(a);
  check_int(a.num_shared_experts, "num_shared_experts", 0);
  MEGAMOE_CHECK(a.mma_type == MmaType::kFp8xFp4 || a.mma_type == MmaType::kFp8xFp8 ||
                    a.mma_type == MmaType::kBf16xBf16 || a.mma_type == MmaType::kFp4xFp4,
                "mma_type", "fp8xfp4, fp8xfp8, bf16xbf16 or fp4xfp4", static_cast<int>(a.mma_type));
  MEGAMOE_CHECK(
      a.activation == Activation::kSwiglu || (a.activation == Activation::kSitu && a.mma_type == MmaType::kFp8xFp4),
      "activation", "swiglu, or situ with mma_type fp8xfp4 (DeepGEMM: only FP8xFP4 MegaMoE supports situ)",
      std::string(to_string(a.activation)) + " with mma_type " + to_string(a.mma_type));
  MEGAMOE_CHECK(a.num_sms >= 2 && a.num_sms % 2 == 0 && a.num_sms <= kInt32Max, "num_sms",
                "an even SM count >= 2 (DeepGEMM: 2-CTA clusters, kNumSMs % 2 == 0)", a.num_sms);
  const int64_t T = aligned_tokens(a, kLcmBlockM);
  check_workspace_limits(a, T);
  const int64_t R = a.num_ranks, K = a.num_topk, H = a.hidden, IH = a.intermediate_hidden;
  const int64_t S = a.num_shared_experts, er = a.num_experts / R;
  const int64_t SIH = i32(IH * S, "num_shared_experts", "intermediate_hidden * num_shared_experts");
  MEGAMOE_CHECK((IH * 2) % 256 == 0, "intermediate_hidden",
                "a multiple of 128 (DeepGEMM: (intermediate_hidden * 2) % 256 == 0)", IH);
  MEGAMOE_CHECK(H % 256 == 0, "hidden", "a multiple of 256 (DeepGEMM: hidden % 256 == 0)", H);

  // The ring: the most tokens the L1/L2 schedule keeps live for any block size.
  const int64_t routed =
      i32(i32(T * R, "num_max_tokens_per_rank", "num_max_tokens_per_rank * num_ranks") * std::min(K, er),
          "num_max_tokens_per_rank", "the routed tokens");
  int64_t ring = 0;
  for (int64_t bm : kBlockMs) {
    const int64_t blocks = i32(cdiv32(routed, bm, "num_max_tokens_per_rank", "the routed tokens") + er,
                               "num_max_tokens_per_rank", "the pool blocks");
    ring = std::max(ring,
                    i32(live_pool_blocks(blocks, a.num_sms, H, IH) * bm, "num_max_tokens_per_rank", "the ring tokens"));
  }
  ring = align32(ring, kLcmBlockM, "num_max_tokens_per_rank", "the ring tokens");
  check_ring_limit(ring);

  const int bits = a.mma_type == MmaType::kBf16xBf16 ? 16 : a.mma_type == MmaType::kFp4xFp4 ? 4 : 8;
  const bool with_sf = a.mma_type != MmaType::kBf16xBf16;
  const bool fp4 = a.mma_type == MmaType::kFp4xFp4;
  const int64_t g = fp4 ? 16 : 32;  // scale group along K
  // NVFP4's shared experts run in bf16 without scales; the others as the routed ones.
  const int shared_bits = fp4 ? 16 : bits;
  const bool shared_sf = with_sf && shared_bits < 16;
  int64_t nsf = 0;
  if (with_sf) {
    for (int64_t bm : kBlockMs) nsf = std::max(nsf, sf_ring_tokens(ring, bm));
    const int64_t sf_align = fp4 ? 512 : 128;
    const std::string rule = fp4 ? "a multiple of 512 (DeepGEMM, NVFP4: hidden % 512 == 0)"
                                 : "a multiple of 128 (DeepGEMM, scaled MMA: hidden % 128 == 0)";
    MEGAMOE_CHECK(H % sf_align == 0, "hidden", rule, H);
    MEGAMOE_CHECK(IH % sf_align == 0, "intermediate_hidden",
                  fp4 ? "a multiple of 512 (DeepGEMM, NVFP4: intermediate_hidden % 512 == 0)"
                      : "a multiple of 128 (DeepGEMM, scaled MMA: intermediate_hidden % 128 == 0)",
                  IH);
    // With IH % 128 == 0 (checked above for every type), S * IH is one too, and the ring (a
    // multiple of 1920) gives scale rows that are multiples of 4: DeepGEMM's other two
    // asserts here (shared_intermediate_hidden % 128 == 0, num_sf_ring_tokens % 4 == 0)
    // follow. So do its 16-byte token records (H % 256, IH % 128).
  }
  const int64_t nsh = S > 0 && shared_sf ? align_c(T, kMinBlockM) / kMinBlockM * 128 : 0;
  const int64_t P = pool_tokens(a, T, kMaxBlockM, kLcmBlockM, kUint32Max);
  // Record sizes as DeepGEMM forms them in uint32.
  const int64_t x_record = u32(H * bits, "hidden", "hidden * element bits") / 8;
  const int64_t l2_record = u32(IH * bits, "intermediate_hidden", "intermediate_hidden * element bits") / 8;
  const int64_t sl2_record =
      u32(SIH * shared_bits, "num_shared_experts", "num_shared_experts * intermediate_hidden * element bits") / 8;
  const int64_t idx_record = u32(K * 8, "num_topk", "num_topk * 8"), w_record = K * 4;
  const int64_t slots = K + (S > 0 ? 1 : 0);

  BufferLayout l;
  l.args = a;
  l.token_alignment = kLcmBlockM;
  l.num_max_tokens = T;
  l.num_max_pool_tokens = P;
  l.num_ring_tokens = ring;
  l.num_sf_ring_tokens = nsf;
  l.num_shared_sf_tokens = nsh;
  const Checked ws = workspace_bytes(a, T, P);
  const DType tok = fp4 ? DType::kUInt8 : with_sf ? DType::kFloat8E4M3 : DType::kBFloat16;
  const int64_t hc = fp4 ? H / 2 : H, ihc = fp4 ? IH / 2 : IH;  // token view columns
  const int64_t hs = H / (4 * g), ihs = IH / (4 * g);           // scale words a row
  const DType shared_tok = shared_sf ? DType::kFloat8E4M3 : DType::kBFloat16;
  Builder b(l);
  b.add("workspace", ws, DType::kUInt8, {ws.ok() ? ws.value() : 0}, {1}, Role::kScratch, false);
  // NVFP4 applies the top-k weights after L2: a per-pool-token copy that outlives the ring.
  b.add("routed_topk_weights", records(P, bits == 4 ? 4 : 0), DType::kFloat32, {bits == 4 ? P : 0}, {1}, Role::kScratch,
        false);
  b.add("x", records(T, x_record), tok, {T, hc}, {hc, 1}, Role::kInput, true);
  if (with_sf) b.add("x_sf", records(T, H / g), DType::kInt32, {T, hs}, {hs, 1}, Role::kInput, true);
  b.add("topk_idx", records(T, idx_record), DType::kInt64, {T, K}, {K, 1}, Role::kInput, true);
  b.add("topk_weights", records(T, w_record), DType::kFloat32, {T, K}, {K, 1}, Role::kInput, true);
  if (S > 0) {
    // The shared experts' L1 input is x itself; their scales are a row-permuted copy.
    if (shared_sf) {
      b.add("shared_l1_acts_sf", records(nsh, H / g), DType::kInt32, {nsh, H / 128}, {1, nsh}, Role::kInput, true);
    }
    b.add("shared_l2_acts", records(T, sl2_record), shared_tok, {T, SIH}, {SIH, 1}, Role::kScratch, true);
    if (shared_sf) {
      b.add("shared_l2_acts_sf", records(nsh, SIH / g), DType::kInt32, {nsh, SIH / 128}, {1, nsh}, Role::kScratch,
            true);
    }
  }
  b.add("l1_acts", records(ring, x_record), tok, {ring, hc}, {hc, 1}, Role::kScratch, true);
  if (with_sf) b.add("l1_acts_sf", records(nsf, H / g), DType::kInt32, {nsf, hs}, {1, nsf}, Role::kScratch, true);
  b.add("l1_topk_weights", records(ring, bits == 4 ? 0 : 4), DType::kFloat32, {bits == 4 ? 0 : ring}, {1},
        Role::kScratch, false);
  b.add("l2_acts", records(ring, l2_record), tok, {ring, ihc}, {ihc, 1}, Role::kScratch, true);
  if (with_sf) b.add("l2_acts_sf", records(nsf, IH / g), DType::kInt32, {nsf, ihs}, {1, nsf}, Role::kScratch, true);
  b.add("combine", records(slots, T) * (2 * H), DType::kBFloat16, {slots * T, H}, {H, 1}, Role::kScratch, false);
  l.workspace_bytes = ws.value();
  l.nbytes = b.end();
  return l;
}

// get_num_wave_pool_tokens of the ring variant: the tokens a wave of `experts` local experts
// receives at most.
int64_t wave_pool_tokens(const BufferArgs& a, int64_t T, int64_t experts) {
  const char* arg = "num_max_tokens_per_rank";
  const int64_t all = i32(T * a.num_ranks, arg, "num_max_tokens_per_rank * num_ranks");
  if (experts == 1) return all;
  const int64_t padded =
      i32(i32(all * a.num_topk, arg, "the routed tokens") + experts * (kRingLcmBlockM - 1), arg, "the routed tokens");
  return std::min(i32(all * experts, arg, "the tokens of every local expert"),
                  align32(padded, kRingLcmBlockM, arg, "the routed tokens"));
}

BufferLayout sm100_ring(const BufferArgs& a) {
  check_common(a);
  MEGAMOE_CHECK(a.num_shared_experts == 0, "num_shared_experts",
                "0 (DeepGEMM's ring layout has no shared experts; variant sm100 has)", a.num_shared_experts);
  MEGAMOE_CHECK(a.activation == Activation::kSwiglu, "activation", "swiglu (DeepGEMM: activation == \"swiglu\")",
                to_string(a.activation));
  const int64_t T = aligned_tokens(a, kRingLcmBlockM);
  const int64_t R = a.num_ranks, K = a.num_topk, H = a.hidden, IH = a.intermediate_hidden;
  const int64_t er = a.num_experts / R;
  const int64_t lo = wave_pool_tokens(a, T, 1), hi = wave_pool_tokens(a, T, er);
  int64_t ring = a.num_ring_tokens;
  if (ring == 0) {
    // DeepGEMM's Python: a prefill budget from 6144 tokens, else its EP72 decode budget
    // (4224 tokens, 6 experts a rank, top-6, 72 ranks), clamped to the limits.
    ring = T >= 6144
               ? align_c(768 * 1024, kRingLcmBlockM)
               : std::min<int64_t>(4224 * 72 * 6, align_c(4224 * 72 * 6 + 6 * (kRingLcmBlockM - 1), kRingLcmBlockM));
    ring = std::min(std::max(ring, lo), hi);
  }
  check_int(ring, "num_ring_tokens", 0);
  MEGAMOE_CHECK(ring % kRingLcmBlockM == 0, "num_ring_tokens",
                "a multiple of 384 (DeepGEMM: num_ring_tokens % kLCMCandidateBlockM == 0)", ring);
  MEGAMOE_CHECK(lo <= ring && ring <= hi, "num_ring_tokens",
                "within [" + num(lo) + ", " + num(hi) + "] (DeepGEMM: get_ring_limit_for_mega_moe)", ring);
  MEGAMOE_CHECK(a.mma_type == MmaType::kFp8xFp4 || a.mma_type == MmaType::kBf16xBf16, "mma_type",
                "fp8xfp4 or bf16xbf16 (DeepGEMM's ring layout)", to_string(a.mma_type));
  const bool with_sf = a.mma_type == MmaType::kFp8xFp4;
  const int64_t eb = with_sf ? 1 : 2;

  // The workspace: barrier signals, per-expert counts, four counters per 8-token ring block,
  // the source token-topk table and the combine metadata, aligned to 16.
  const int64_t P = pool_tokens(a, T, kRingMaxBlockM, kRingLcmBlockM, kUint32Max);
  const int64_t recv = u32(R * T, "num_max_tokens_per_rank", "num_ranks * num_max_tokens_per_rank");
  const int64_t table =
      u32(er * R * recv, "num_max_tokens_per_rank", "num_experts * num_ranks * num_max_tokens_per_rank");
  const Checked ws = core::round_up(Checked(32) + Checked(a.num_experts) * 16 + Checked(er) * 8 +
                                        Checked(ring / kMinBlockM) * 16 + Checked(table) * 4 + Checked(P) * 12,
                                    16);

  // Token records are TMA rows (16-byte multiples), the scale records too in this layout.
  const int64_t x_record = i32(H * eb, "hidden", "hidden * element bytes");
  const int64_t l2_record = i32(IH * eb, "intermediate_hidden", "intermediate_hidden * element bytes");
  MEGAMOE_CHECK(x_record % 16 == 0, "hidden", "a token row of a multiple of 16 bytes (DeepGEMM: TMA-aligned Data)",
                std::to_string(x_record) + " bytes");
  MEGAMOE_CHECK((H * 2) % 16 == 0, "hidden",
                "a bf16 combine row of a multiple of 16 bytes (DeepGEMM: TMA-aligned Data)",
                std::to_string(H * 2) + " bytes");
  MEGAMOE_CHECK(l2_record % 16 == 0, "intermediate_hidden",
                "a token row of a multiple of 16 bytes (DeepGEMM: TMA-aligned Data)",
                std::to_string(l2_record) + " bytes");
  const int64_t x_sf_record = with_sf ? H / 32 : 0, l2_sf_record = with_sf ? IH / 32 : 0;
  MEGAMOE_CHECK(x_sf_record % 16 == 0, "hidden",
                "a scale row of a multiple of 16 bytes, hidden / 32 (DeepGEMM: TMA-aligned Data)",
                std::to_string(x_sf_record) + " bytes");
  MEGAMOE_CHECK(l2_sf_record % 16 == 0, "intermediate_hidden",
                "a scale row of a multiple of 16 bytes, intermediate_hidden / 32 (DeepGEMM: TMA-aligned Data)",
                std::to_string(l2_sf_record) + " bytes");
  const int64_t idx_record = u32(K * 8, "num_topk", "num_topk * 8"), w_record = K * 4;
  int64_t nsf = 0;
  for (int64_t bm : kRingBlockMs) nsf = std::max(nsf, sf_ring_tokens(ring, bm));
  if (with_sf) {
    MEGAMOE_CHECK(H % 128 == 0, "hidden", "a multiple of 128 (DeepGEMM: hidden % 128 == 0)", H);
    MEGAMOE_CHECK(IH % 128 == 0, "intermediate_hidden", "a multiple of 128 (DeepGEMM: intermediate_hidden % 128 == 0)",
                  IH);
    // num_sf_ring_tokens % 4 == 0 follows from the ring being a multiple of 384.
  }

  BufferLayout l;
  l.args = a;
  l.token_alignment = kRingLcmBlockM;
  l.num_max_tokens = T;
  l.num_max_pool_tokens = P;
  l.num_ring_tokens = ring;
  l.num_sf_ring_tokens = with_sf ? nsf : 0;
  const DType tok = with_sf ? DType::kFloat8E4M3 : DType::kBFloat16;
  Builder b(l);
  b.add("workspace", ws, DType::kUInt8, {ws.ok() ? ws.value() : 0}, {1}, Role::kScratch, false);
  b.add("x", records(T, x_record), tok, {T, H}, {H, 1}, Role::kInput, true);
  if (with_sf) b.add("x_sf", records(T, x_sf_record), DType::kInt32, {T, H / 128}, {H / 128, 1}, Role::kInput, true);
  b.add("topk_idx", records(T, idx_record), DType::kInt64, {T, K}, {K, 1}, Role::kInput, true);
  b.add("topk_weights", records(T, w_record), DType::kFloat32, {T, K}, {K, 1}, Role::kInput, true);
  b.add("l1_acts", records(ring, x_record), tok, {ring, H}, {H, 1}, Role::kScratch, true);
  if (with_sf) {
    b.add("l1_acts_sf", records(nsf, x_sf_record), DType::kInt32, {nsf, H / 128}, {1, nsf}, Role::kScratch, true);
  }
  b.add("l1_topk_weights", records(ring, 4), DType::kFloat32, {ring}, {1}, Role::kScratch, false);
  b.add("l2_acts", records(ring, l2_record), tok, {ring, IH}, {IH, 1}, Role::kScratch, true);
  if (with_sf) {
    b.add("l2_acts_sf", records(nsf, l2_sf_record), DType::kInt32, {nsf, IH / 128}, {1, nsf}, Role::kScratch, true);
  }
  b.add("combine", records(K, T) * (2 * H), DType::kBFloat16, {K * T, H}, {H, 1}, Role::kScratch, false);
  l.workspace_bytes = ws.value();
  l.nbytes = b.end();
  return l;
}

}  // namespace

const Region* BufferLayout::find(const std::string& name) const noexcept {
  for (const Region& r : regions) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

BufferLayout buffer_layout(const BufferArgs& args) {
  return detail::guarded("buffer_layout", [&] {
    switch (args.variant) {
      case Variant::kSm90Fp8: return sm90(args);
      case Variant::kSm100: return sm100(args);
      case Variant::kSm100Ring: return sm100_ring(args);
    }
    throw Error(ErrorCode::kInvalidArgument,
                "megamoe: variant: expected sm90_fp8, sm100 or sm100_ring, got " + num(static_cast<int>(args.variant)));
  });
}

namespace {
int64_t block_m_of(int64_t num_ranks, int64_t num_experts, int64_t num_max_tokens_per_rank, int64_t num_tokens,
                   int64_t num_topk, MmaType mma_type) {
  check_int(num_ranks, "num_ranks", 1);
  check_int(num_experts, "num_experts", 1);
  check_int(num_max_tokens_per_rank, "num_max_tokens_per_rank", 0);
  check_int(num_tokens, "num_tokens", 0);
  check_int(num_topk, "num_topk", 0);
  MEGAMOE_CHECK(mma_type == MmaType::kFp8xFp4 || mma_type == MmaType::kFp8xFp8 || mma_type == MmaType::kBf16xBf16 ||
                    mma_type == MmaType::kFp4xFp4,
                "mma_type", "fp8xfp4, fp8xfp8, bf16xbf16 or fp4xfp4", static_cast<int>(mma_type));
  // DeepGEMM's heuristic in fp32, step by step: the expected tokens an expert receives
  // and a one-sigma margin; one block up to 192 rows, then blocks of up to 240.
  const float expected = static_cast<float>(num_tokens) * static_cast<float>(num_ranks) * static_cast<float>(num_topk) /
                         static_cast<float>(num_experts);
  const float covered = expected + std::sqrt(expected);
  int64_t bm = expected <= 10.0f ? 16 : 32;
  if (expected > 24.0f) {
    const float blocks_f = std::ceil(covered / 240.0f);
    MEGAMOE_CHECK(blocks_f <= 8947848.0f, "num_tokens",
                  "num_tokens * num_ranks * num_topk / num_experts small enough for DeepGEMM's int block count "
                  "(ceil(covered / 240) * 240 <= 2^31-1)",
                  num_tokens);
    int64_t blocks = static_cast<int64_t>(blocks_f);
    if (blocks == 1 && covered > 192.0f && num_experts / num_ranks < 14) blocks = 2;
    for (int64_t c : {64, 128, 192, 240}) {
      bm = c;
      if (static_cast<float>(blocks * c) >= covered) break;
    }
  }
  return bm;
}
}  // namespace

int64_t block_m(int64_t num_ranks, int64_t num_experts, int64_t num_max_tokens_per_rank, int64_t num_tokens,
                int64_t num_topk, MmaType mma_type) {
  return detail::guarded("block_m", [&] {
    return block_m_of(num_ranks, num_experts, num_max_tokens_per_rank, num_tokens, num_topk, mma_type);
  });
}

const char* to_string(Variant v) noexcept {
  switch (v) {
    case Variant::kSm90Fp8: return "sm90_fp8";
    case Variant::kSm100: return "sm100";
    case Variant::kSm100Ring: return "sm100_ring";
  }
  return "unknown";
}
const char* to_string(MmaType m) noexcept {
  switch (m) {
    case MmaType::kFp8xFp4: return "fp8xfp4";
    case MmaType::kFp8xFp8: return "fp8xfp8";
    case MmaType::kBf16xBf16: return "bf16xbf16";
    case MmaType::kFp4xFp4: return "fp4xfp4";
  }
  return "unknown";
}
const char* to_string(Activation a) noexcept {
  switch (a) {
    case Activation::kSwiglu: return "swiglu";
    case Activation::kSitu: return "situ";
  }
  return "unknown";
}
const char* to_string(Role r) noexcept {
  switch (r) {
    case Role::kInput: return "input";
    case Role::kScratch: return "scratch";
  }
  return "unknown";
}

}  // namespace deepgemm
}  // namespace megamoe
