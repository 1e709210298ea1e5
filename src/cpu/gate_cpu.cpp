// gate_cpu.cpp: the gate's logits on the host, in the contract's fixed order (core/gate.h,
// the kernels' math). The weight is widened to fp32 once a call (exact), interleaved in
// tiles of kLanes experts so that the kLanes chains of one chunk run side by side for kRows
// tokens at once (vectors of fused multiply-adds where the CPU has AVX2 and FMA); blocks of
// up to kTileTokens tokens are widened in turn and the expert tiles over them spread over
// the CPU backend's worker pool; each logit's chunk sums are then folded by the contract's
// tree. Each logit is its own chain: the tiling changes which thread computes it, never its
// bits. The arithmetic runs in the default IEEE environment whatever the caller's thread has
// set, as the router does.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "contract/validate.h"
#include "core/gate.h"
#include "core/numerics.h"
#include "cpu/fp_env.h"
#include "cpu/gate_cpu.h"
#include "cpu/pool.h"
#include "megamoe/cpu.h"
#include "megamoe/gate.h"

namespace megamoe {
namespace cpu {
namespace {

constexpr int kLanes = 16;             ///< experts a tile computes side by side
constexpr int64_t kTileTokens = 64;    ///< tokens of a block (their y rows widened once)

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

/// Row @p i of a rank-2 bf16 or fp32 tensor, H elements widened exactly, to out[h * step]
/// (rows with unit column stride, the usual layout, without a multiply per element).
void widen_row(const TensorRef& t, int64_t i, int64_t H, float* out, int64_t step) {
  if (t.strides[1] != 1) {
    for (int64_t h = 0; h < H; ++h) out[h * step] = load_real(t, i, h);
    return;
  }
  const char* row = static_cast<const char*>(t.data) + i * t.strides[0] * dtype_size(t.dtype);
  for (int64_t h = 0; h < H; ++h) {
    if (t.dtype == DType::kFloat32) {
      std::memcpy(&out[h * step], row + h * 4, 4);
    } else {
      uint16_t v;
      std::memcpy(&v, row + h * 2, 2);
      out[h * step] = core::bits_float(static_cast<uint32_t>(v) << 16);
    }
  }
}

void store_real(const TensorRef& t, int64_t i, int64_t j, float v) {
  std::memcpy(static_cast<char*>(t.data) + (i * t.strides[0] + j * t.strides[1]) * 4, &v, 4);
}

constexpr int kRows = 4;  ///< token rows whose chains run side by side (independent chains hide the latency)

/// The chunk sums of @p rows (<= kRows) token rows against the tile's kLanes weight rows:
/// chunk j of lane l of row r into c[r][j * kLanes + l] (the chains of the contract; the
/// padding zeros of the last chunk change no bit, core/gate.h).
void chunk_sums_portable(const float* const* y, int rows, const float* w, float* const* c, int64_t n) {
  for (int r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      float acc[kLanes] = {};
      const float* yj = y[r] + j * core::kGateChunk;
      const float* wj = w + j * core::kGateChunk * kLanes;
      for (int i = 0; i < core::kGateChunk; ++i) {
        for (int l = 0; l < kLanes; ++l) acc[l] = core::gate_step(yj[i], wj[i * kLanes + l], acc[l]);
      }
      std::memcpy(c[r] + j * kLanes, acc, sizeof acc);
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MEGAMOE_GATE_AVX2 1
// The same chains as vectors where the CPU has AVX2 and FMA: vfmadd rounds each lane once,
// as core::gate_step does (a fused multiply-add is correctly rounded however it is
// computed), kRows x 2 vectors of 8 lanes in flight. Chosen at run time; the tests run both.
static_assert(kLanes == 16, "two AVX vectors of lanes");
__attribute__((target("avx2,fma"))) void chunk_sums_avx2(const float* const* y, int rows, const float* w,
                                                          float* const* c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    __m256 acc[kRows][2];
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const float* wj = w + j * core::kGateChunk * kLanes;
    for (int i = 0; i < core::kGateChunk; ++i) {
      const __m256 w0 = _mm256_loadu_ps(wj + i * kLanes), w1 = _mm256_loadu_ps(wj + i * kLanes + 8);
      for (int r = 0; r < kRows; ++r) {  // rows past @p rows repeat a valid row, unstored
        const __m256 yv = _mm256_broadcast_ss(y[r] + j * core::kGateChunk + i);
        acc[r][0] = _mm256_fmadd_ps(yv, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(yv, w1, acc[r][1]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      _mm256_storeu_ps(c[r] + j * kLanes, acc[r][0]);
      _mm256_storeu_ps(c[r] + j * kLanes + 8, acc[r][1]);
    }
  }
}

bool have_avx2_fma() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma") != 0 && __builtin_cpu_supports("avx2") != 0;
  }();
  return ok;
}
#endif

std::atomic<bool> portable_only{false};

void chunk_sums(const float* const* y, int rows, const float* w, float* const* c, int64_t n) {
#if MEGAMOE_GATE_AVX2
  if (have_avx2_fma() && !portable_only.load(std::memory_order_relaxed)) {
    chunk_sums_avx2(y, rows, w, c, n);
    return;
  }
#endif
  chunk_sums_portable(y, rows, w, c, n);
}

/// The widened rows of a call: the weight in tiles of kLanes experts, each [Hp][kLanes]
/// interleaved (lane l = expert tile * kLanes + l; missing experts zero); y for a block of
/// tokens, [rows][Hp]. Hp = the row padded with zeros to whole chunks.
struct Widened {
  int64_t n = 0, Hp = 0, N = 0;
  std::vector<float> w, y;
};

/// Logits of the block's tokens [t0, t0 + rows) and the experts of tile @p et.
void tile(const detail::GateProblem& p, const Widened& v, const TensorRef& out, int64_t t0, int64_t rows, int64_t et) {
  const int64_t e0 = et * kLanes;
  const int64_t lanes = std::min<int64_t>(kLanes, p.E - e0);
  const float* w = v.w.data() + et * v.Hp * kLanes;
  std::vector<float> sums(static_cast<size_t>(kRows * v.N * kLanes));
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int group = static_cast<int>(std::min<int64_t>(kRows, rows - r0));
    const float* y[kRows];
    float* c[kRows];
    for (int r = 0; r < kRows; ++r) {
      y[r] = v.y.data() + (r0 + std::min(r, group - 1)) * v.Hp;
      c[r] = sums.data() + r * v.N * kLanes;
      std::fill(c[r] + v.n * kLanes, c[r] + v.N * kLanes, 0.0f);  // the tree's +0 leaves
    }
    chunk_sums(y, group, w, c, v.n);
    for (int r = 0; r < group; ++r) {
      core::gate_fold<kLanes>(c[r], v.N);
      for (int64_t l = 0; l < lanes; ++l) store_real(out, t0 + r0 + r, e0 + l, core::gate_output(c[r][l]));
    }
  }
}

/// Below this many multiply-adds a call stays on the calling thread.
constexpr int64_t kSerialWork = int64_t{1} << 20;

}  // namespace

void gate_portable_only(bool on) { portable_only.store(on, std::memory_order_relaxed); }

void gate_logits(const GateArgs& g, const detail::GateProblem& p, const TensorRef& logits) {
  const DefaultFpEnv fp_env;
  Widened v;
  v.n = core::gate_chunks(p.H);
  v.Hp = v.n * core::kGateChunk;
  v.N = core::gate_tree_width(v.n);
  const int64_t tiles = (p.E + kLanes - 1) / kLanes;
  // T * E * H multiply-adds (saturated: only the comparison reads it).
  const int64_t work = p.T * p.E > kSerialWork / p.H ? kSerialWork : p.T * p.E * p.H;
  const int threads = work >= kSerialWork ? cpu_threads() : 1;
  const auto each = [&](int64_t count, auto&& f) {
    if (threads <= 1 || count <= 1) {
      for (int64_t i = 0; i < count; ++i) f(i);
    } else {
      parallel_for(count, threads, f);
    }
  };
  // The weight once (its bytes are at most y's times 2^10: E <= 512, fp32 at most twice bf16).
  v.w.assign(static_cast<size_t>(tiles * v.Hp * kLanes), 0.0f);
  each(tiles, [&](int64_t et) {
    float* w = v.w.data() + et * v.Hp * kLanes;
    for (int64_t l = 0; l < std::min<int64_t>(kLanes, p.E - et * kLanes); ++l) {
      widen_row(g.weight, et * kLanes + l, p.H, w + l, kLanes);
    }
  });
  // Blocks of tokens: their y rows widened, then every expert tile over them.
  for (int64_t t0 = 0; t0 < p.T; t0 += kTileTokens) {
    const int64_t rows = std::min(kTileTokens, p.T - t0);
    v.y.assign(static_cast<size_t>(rows * v.Hp), 0.0f);
    for (int64_t t = 0; t < rows; ++t) widen_row(g.y, t0 + t, p.H, v.y.data() + t * v.Hp, 1);
    each(tiles, [&](int64_t et) { tile(p, v, logits, t0, rows, et); });
  }
}

}  // namespace cpu
}  // namespace megamoe
