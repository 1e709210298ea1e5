// router_cpu.cpp: the fused router on the host, token by token, with the numeric rules of
// core/router.h (the ones the CUDA kernel uses). route_and_stage on the CPU runs this, then
// cpu::prepare_inputs with the router's outputs as the top-k inputs (api.cpp), so the
// staged bytes are those of route() followed by prepare_inputs() by construction.
// Tokens are split into chunks over the CPU backend's worker pool for large calls (each
// token's outputs are its own; the EPLB load and the counter take atomic or summed adds,
// whose order does not matter for integers). The arithmetic runs in the default IEEE
// environment whatever the caller's thread has set (flush-to-zero, another rounding mode),
// as the staging does: the bytes must be the GPU's.
#include <algorithm>
#include <array>
#include <atomic>
#include <cfenv>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/numerics.h"
#include "core/router.h"
#include "cpu/fp_env.h"
#include "cpu/pool.h"
#include "megamoe/cpu.h"
#include "megamoe/router.h"
#include "contract/validate.h"

namespace megamoe {
namespace cpu {
namespace {

/// Element (i, j) of a rank-2 tensor, or element i of a rank-1 / 0-D one (j = 0).
template <typename T>
T load(const TensorRef& t, int64_t i, int64_t j = 0) {
  const int64_t off = (t.ndim > 0 ? i * t.strides[0] : 0) + (t.ndim > 1 ? j * t.strides[1] : 0);
  T v;
  std::memcpy(&v, static_cast<const char*>(t.data) + off * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <typename T>
void store(const TensorRef& t, int64_t i, int64_t j, T v) {
  const int64_t off = (t.ndim > 0 ? i * t.strides[0] : 0) + (t.ndim > 1 ? j * t.strides[1] : 0);
  std::memcpy(static_cast<char*>(t.data) + off * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

/// fp32 or bf16 element, widened exactly.
float load_real(const TensorRef& t, int64_t i, int64_t j = 0) {
  return t.dtype == DType::kBFloat16 ? core::bf16_to_float(load<uint16_t>(t, i, j)) : load<float>(t, i, j);
}

/// int32 or int64 element.
int64_t load_int(const TensorRef& t, int64_t i, int64_t j = 0) {
  return t.dtype == DType::kInt32 ? load<int32_t>(t, i, j) : load<int64_t>(t, i, j);
}

/// Add @p n to element i of an int32 or int64 rank-1 / one-element tensor, atomically
/// (chunks on several threads record into the same load). Counters wrap in two's
/// complement, as the device's atomicAdd does.
void add_to(const TensorRef& t, int64_t i, int64_t n) {
  char* at = static_cast<char*>(t.data) + (t.ndim > 0 ? i * t.strides[0] : 0) * dtype_size(t.dtype);
  const size_t size = static_cast<size_t>(dtype_size(t.dtype));
  if (reinterpret_cast<uintptr_t>(at) % size == 0) {
    if (t.dtype == DType::kInt32) {
      __atomic_fetch_add(reinterpret_cast<uint32_t*>(at), static_cast<uint32_t>(n), __ATOMIC_RELAXED);
    } else {
      __atomic_fetch_add(reinterpret_cast<uint64_t*>(at), static_cast<uint64_t>(n), __ATOMIC_RELAXED);
    }
    return;
  }
  // A misaligned element (tensors need no alignment) cannot be an atomic's operand (a
  // fault on Arm, undefined in C++): a read-modify-write under one lock, which every such
  // update of this process takes.
  static std::mutex misaligned;
  const std::lock_guard<std::mutex> lock(misaligned);
  if (t.dtype == DType::kInt32) {
    uint32_t v;
    std::memcpy(&v, at, 4);
    v += static_cast<uint32_t>(n);
    std::memcpy(at, &v, 4);
  } else {
    uint64_t v;
    std::memcpy(&v, at, 8);
    v += static_cast<uint64_t>(n);
    std::memcpy(at, &v, 8);
  }
}

/// The scores of @p n logits. The fast path (core::router_score) and the exact chain
/// (core::router_score_exact) give the same bits for every fp32 logit (docs/ROUTER.md), so
/// which one runs is a matter of speed alone: the fast path's fused multiply-adds are one
/// instruction where the code is compiled for FMA and a libm call where it is not (on this
/// project's 2-core Xeon: 85 ns a score against the exact chain's 50 for the
/// baseline x86-64 ISA, 28 against 45 with FMA). On x86-64 a copy of the loop is compiled
/// for FMA (flatten: the whole chain inlined into it) and chosen at run time.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("fma"), flatten)) void scores_fma(const float* x, float* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) s[i] = core::router_score(x[i]);
}

void scores_exact(const float* x, float* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) s[i] = core::router_score_exact(x[i]);
}

bool have_fma() {
  static const bool fma = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma") != 0;
  }();
  return fma;
}

void scores(const float* x, float* s, int64_t n) {
  if (have_fma()) scores_fma(x, s, n);
  else scores_exact(x, s, n);
}
#else
void scores(const float* x, float* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) s[i] = core::router_score(x[i]);
}
#endif

float score(float x) {
  float s;
  scores(&x, &s, 1);
  return s;
}

/// One token's choice: ids (logical; -1 for an invalid hash entry) and unbiased scores.
struct Choice {
  std::array<int64_t, core::kMaxRouterTopk> id;
  std::array<float, core::kMaxRouterTopk> s;
};

/// Selection: K passes, each taking the largest key not yet taken (the lowest id on equal
/// keys: only a strictly larger key replaces the current best).
void select(const RouterArgs& r, const detail::RouterProblem& p, int64_t t, Choice& c) {
  std::array<float, core::kMaxRouterExperts> x, s;
  std::array<uint32_t, core::kMaxRouterExperts> key;
  std::array<bool, core::kMaxRouterExperts> taken{};
  for (int64_t e = 0; e < p.E; ++e) x[e] = load_real(r.router_logits, t, e);
  scores(x.data(), s.data(), p.E);
  for (int64_t e = 0; e < p.E; ++e) {
    key[e] = p.has_bias ? core::biased_key(s[e], load_real(*r.e_score_correction_bias, e)) : core::selection_key(s[e]);
  }
  for (int64_t k = 0; k < p.K; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < p.E; ++e) {
      if (!taken[e] && (best < 0 || key[e] > key[best])) best = e;
    }
    taken[best] = true;  // K <= E: a candidate is always left
    c.id[k] = best;
    c.s[k] = s[best];
  }
}

/// Hash layers: the table row of the token's id; false when input_ids[t] is outside [0, V).
bool lookup(const RouterArgs& r, const detail::RouterProblem& p, int64_t t, Choice& c) {
  const int64_t row = load_int(*r.input_ids, t);
  if (row < 0 || row >= p.V) return false;
  for (int64_t k = 0; k < p.K; ++k) {
    const int64_t l = load<int32_t>(*r.tid2eid, row, k);
    const bool ok = l >= 0 && l < p.E;
    c.id[k] = ok ? l : -1;
    c.s[k] = ok ? score(load_real(r.router_logits, t, l)) : 0.0f;
  }
  return true;
}

/// Tokens [t0, t1): their outputs and load; returns their non-finite logits.
int64_t route_rows(const RouterArgs& r, const detail::RouterProblem& p, const TensorRef* pad, bool record, int64_t t0,
                   int64_t t1) {
  int64_t nonfinite = 0;
  Choice c;
  for (int64_t t = t0; t < t1; ++t) {
    if (p.has_nonfinite) {
      for (int64_t e = 0; e < p.E; ++e) nonfinite += core::non_finite(load_real(r.router_logits, t, e)) ? 1 : 0;
    }
    bool keep = pad == nullptr || load<uint8_t>(*pad, t) == 0;
    if (keep) {
      if (p.hash) {
        keep = lookup(r, p, t, c);
      } else {
        select(r, p, t, c);
      }
    }
    // Weights: the kept scores summed in k order (invalid hash entries add nothing).
    float sum = 0.0f;
    for (int64_t k = 0; keep && k < p.K; ++k) {
      if (c.id[k] >= 0) sum = core::add_rn(sum, c.s[k]);
    }
    const float d = core::weight_denominator(sum);
    for (int64_t k = 0; k < p.K; ++k) {
      int64_t id = -1;
      float w = 0.0f;
      if (keep && c.id[k] >= 0) {
        id = c.id[k];
        w = core::router_weight(c.s[k], d, p.alpha);
        if (p.eplb) {
          const int64_t slot = core::replica_slot(t * p.K + k, load<int32_t>(*r.logical_replica_count, id), p.R);
          id = load<int32_t>(*r.logical_to_physical_map, id, slot);
          if (record && id >= 0 && id < p.P) add_to(*r.expert_load_view, id, 1);
        }
      }
      if (r.topk_ids.dtype == DType::kInt32) {
        store<int32_t>(r.topk_ids, t, k, static_cast<int32_t>(id));
      } else {
        store<int64_t>(r.topk_ids, t, k, id);
      }
      store<float>(r.topk_weights, t, k, w);
    }
  }
  return nonfinite;
}

/// Below this many scores (T * E) a call stays on the calling thread (about a
/// millisecond); chunks have at least this many.
constexpr int64_t kSerialScores = int64_t{1} << 14;

}  // namespace

void route(const RouterArgs& r, const detail::RouterProblem& p, const TensorRef* pad) {
  const DefaultFpEnv fp_env;
  const bool record = p.eplb && load<int32_t>(*r.record_enabled, 0) != 0;
  const int threads = cpu_threads();
  int64_t nonfinite = 0;
  const int64_t rows = std::max<int64_t>(1, kSerialScores / p.E);  // tokens per chunk, at least
  if (threads <= 1 || p.T <= rows) {
    nonfinite = route_rows(r, p, pad, record, 0, p.T);
  } else {
    // About four chunks per thread, so that a core slowed by other load takes fewer.
    const int64_t per = std::max(rows, (p.T + 4 * threads - 1) / (4 * threads));
    std::atomic<int64_t> count{0};
    parallel_for((p.T + per - 1) / per, threads, [&](int64_t c) {
      const int64_t t0 = c * per;
      count.fetch_add(route_rows(r, p, pad, record, t0, std::min(p.T, t0 + per)), std::memory_order_relaxed);
    });
    nonfinite = count.load();
  }
  if (p.has_nonfinite) add_to(*r.nonfinite_count, 0, nonfinite);
}

}  // namespace cpu
}  // namespace megamoe
