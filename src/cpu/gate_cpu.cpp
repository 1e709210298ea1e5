// gate_cpu.cpp: the gate's logits on the host, in the contract's fixed order (core/gate.h,
// the kernels' math). The work is cut into tiles of kLanes experts by up to kTileTokens
// tokens, spread over the CPU backend's worker pool; a tile widens its y rows and its
// weight rows to fp32 once (exact), the weight rows interleaved so that the kLanes chains
// of one chunk run side by side (one vector of fused multiply-adds where the CPU has FMA),
// then folds each logit's chunk sums by the contract's tree. Each logit is its own chain:
// the tiling changes which thread computes it, never its bits. The arithmetic runs in the
// default IEEE environment whatever the caller's thread has set, as the router does.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "contract/validate.h"
#include "core/gate.h"
#include "core/numerics.h"
#include "cpu/fp_env.h"
#include "cpu/pool.h"
#include "megamoe/cpu.h"
#include "megamoe/gate.h"

namespace megamoe {
namespace cpu {
namespace {

constexpr int kLanes = 16;             ///< experts a tile computes side by side
constexpr int64_t kTileTokens = 32;    ///< tokens of a tile (their y rows widened once)

/// Element (i, j) of a rank-2 bf16 or fp32 tensor, widened exactly.
float load_real(const TensorRef& t, int64_t i, int64_t j) {
  const char* at = static_cast<const char*>(t.data) + (i * t.strides[0] + j * t.strides[1]) * dtype_size(t.dtype);
  if (t.dtype == DType::kFloat32) {
    float v;
    std::memcpy(&v, at, 4);
    return v;
  }
  uint16_t v;
  std::memcpy(&v, at, 2);
  return core::bits_float(static_cast<uint32_t>(v) << 16);
}

void store_real(const TensorRef& t, int64_t i, int64_t j, float v) {
  std::memcpy(static_cast<char*>(t.data) + (i * t.strides[0] + j * t.strides[1]) * 4, &v, 4);
}

/// One tile's buffers: y rows [tokens][Hp], weight rows interleaved [Hp][kLanes], the
/// chunk sums of kLanes logits [N][kLanes] (Hp = the row padded with zeros to whole chunks).
struct TileBufs {
  std::vector<float> y, w, c;
};

/// The chunk sums of one token row against the tile's kLanes weight rows: chunk j of lane l
/// into c[j * kLanes + l] (the chains of the contract, kLanes at a time; the padding zeros
/// of the last chunk change no bit, core/gate.h).
inline void chunk_sums(const float* y, const float* w, float* c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    float acc[kLanes] = {};
    const float* yj = y + j * core::kGateChunk;
    const float* wj = w + j * core::kGateChunk * kLanes;
    for (int i = 0; i < core::kGateChunk; ++i) {
      for (int l = 0; l < kLanes; ++l) acc[l] = core::gate_step(yj[i], wj[i * kLanes + l], acc[l]);
    }
    std::memcpy(c + j * kLanes, acc, sizeof acc);
  }
}

// On x86-64 a copy compiled for FMA (the chains' fused multiply-adds one vector
// instruction, not a libm call each), chosen at run time; both give the same bits (a fused
// multiply-add is correctly rounded either way).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"), flatten)) void chunk_sums_fma(const float* y, const float* w, float* c, int64_t n) {
  chunk_sums(y, w, c, n);
}

bool have_fma() {
  static const bool fma = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma") != 0 && __builtin_cpu_supports("avx2") != 0;
  }();
  return fma;
}

void sums(const float* y, const float* w, float* c, int64_t n) {
  if (have_fma()) chunk_sums_fma(y, w, c, n);
  else chunk_sums(y, w, c, n);
}
#else
void sums(const float* y, const float* w, float* c, int64_t n) { chunk_sums(y, w, c, n); }
#endif

/// Logits of tokens [t0, t1) and experts [e0, e0 + kLanes) clipped to E.
void tile(const GateArgs& g, const detail::GateProblem& p, const TensorRef& out, int64_t t0, int64_t t1, int64_t e0,
          TileBufs& b) {
  const int64_t n = core::gate_chunks(p.H);
  const int64_t Hp = n * core::kGateChunk;
  const int64_t N = core::gate_tree_width(n);
  const int64_t lanes = std::min<int64_t>(kLanes, p.E - e0);
  b.y.assign(static_cast<size_t>((t1 - t0) * Hp), 0.0f);
  b.w.assign(static_cast<size_t>(Hp * kLanes), 0.0f);
  b.c.resize(static_cast<size_t>(N * kLanes));
  for (int64_t t = t0; t < t1; ++t) {
    float* row = b.y.data() + (t - t0) * Hp;
    for (int64_t h = 0; h < p.H; ++h) row[h] = load_real(g.y, t, h);
  }
  for (int64_t l = 0; l < lanes; ++l) {
    for (int64_t h = 0; h < p.H; ++h) b.w[static_cast<size_t>(h * kLanes + l)] = load_real(g.weight, e0 + l, h);
  }
  for (int64_t t = t0; t < t1; ++t) {
    sums(b.y.data() + (t - t0) * Hp, b.w.data(), b.c.data(), n);
    std::fill(b.c.begin() + n * kLanes, b.c.end(), 0.0f);  // the tree's +0 leaves
    core::gate_fold<kLanes>(b.c.data(), N);
    for (int64_t l = 0; l < lanes; ++l) store_real(out, t, e0 + l, core::gate_output(b.c[static_cast<size_t>(l)]));
  }
}

/// Below this many multiply-adds a call stays on the calling thread.
constexpr int64_t kSerialWork = int64_t{1} << 20;

}  // namespace

void gate_logits(const GateArgs& g, const detail::GateProblem& p, const TensorRef& logits) {
  const DefaultFpEnv fp_env;
  const int64_t expert_tiles = (p.E + kLanes - 1) / kLanes;
  const int64_t token_tiles = (p.T + kTileTokens - 1) / kTileTokens;
  const int64_t tiles = expert_tiles * token_tiles;
  // T * E * H multiply-adds at most 2^9 * T * H: y's element count times 512 (saturated:
  // only the comparison below reads it).
  const int64_t work = p.T * p.E > kSerialWork / std::max<int64_t>(p.H, 1) ? kSerialWork : p.T * p.E * p.H;
  const int threads = work >= kSerialWork && tiles > 1 ? cpu_threads() : 1;
  auto run = [&](int64_t i) {
    TileBufs b;
    const int64_t tt = i / expert_tiles, et = i % expert_tiles;
    tile(g, p, logits, tt * kTileTokens, std::min(p.T, (tt + 1) * kTileTokens), et * kLanes, b);
  };
  if (threads <= 1) {
    for (int64_t i = 0; i < tiles; ++i) run(i);
  } else {
    parallel_for(tiles, threads, run);
  }
}

}  // namespace cpu
}  // namespace megamoe
