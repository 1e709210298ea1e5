// stage_cpu.cpp: CPU backend. Generic over dtypes and strides; the numerics come from
// core/numerics.h, the same header the CUDA kernels use.
#include "cpu/stage_cpu.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "core/layout.h"
#include "core/numerics.h"

namespace megamoe {
namespace cpu {
namespace {

template <typename T>
T load(const TensorRef& t, int64_t i, int64_t j) {
  T v;
  const int64_t off = i * t.strides[0] + j * t.strides[1];
  std::memcpy(&v, static_cast<const char*>(t.data) + off * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return v;
}

template <typename T>
void store(const TensorRef& t, int64_t i, int64_t j, T v) {
  const int64_t off = i * t.strides[0] + j * t.strides[1];
  std::memcpy(static_cast<char*>(t.data) + off * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

/// Element (i, j) of a bf16/fp16/fp32 tensor as fp32 (exact).
float load_float(const TensorRef& t, int64_t i, int64_t j) {
  switch (t.dtype) {
    case DType::kBFloat16: return core::bf16_to_float(load<uint16_t>(t, i, j));
    case DType::kFloat16: return core::half_to_float(load<uint16_t>(t, i, j));
    default: return load<float>(t, i, j);
  }
}

/// Row t of a bf16/fp16/fp32 tensor widened exactly to fp32 (contiguous rows read directly).
template <typename Bits, float (*Widen)(Bits)>
void widen_row(const TensorRef& a, int64_t t, int64_t n, float* out) {
  const Bits* base = static_cast<const Bits*>(a.data) + t * a.strides[0];
  if (a.strides[1] == 1) {
    for (int64_t h = 0; h < n; ++h) out[h] = Widen(base[h]);
  } else {
    for (int64_t h = 0; h < n; ++h) out[h] = Widen(base[h * a.strides[1]]);
  }
}
float identity(float f) { return f; }

void load_row(const TensorRef& a, int64_t t, int64_t n, float* out) {
  switch (a.dtype) {
    case DType::kBFloat16: return widen_row<uint16_t, core::bf16_to_float>(a, t, n, out);
    case DType::kFloat16: return widen_row<uint16_t, core::half_to_float>(a, t, n, out);
    default: return widen_row<float, identity>(a, t, n, out);
  }
}

void stage_rows(const StageArgs& a, const detail::Problem& p, int64_t t0, int64_t t1) {
  std::vector<float> row(static_cast<size_t>(p.H));
  std::vector<uint8_t> q(static_cast<size_t>(p.H));
  std::vector<uint32_t> words(static_cast<size_t>(p.sf_cols));
  const int64_t groups = p.H / p.G;
  uint8_t* const xq = static_cast<uint8_t*>(a.x_q.data);
  for (int64_t t = t0; t < t1; ++t) {
    load_row(a.hidden_states, t, p.H, row.data());
    std::fill(words.begin(), words.end(), 0u);
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = row.data() + g * p.G;
      float amax = 0.0f;
      for (int64_t i = 0; i < p.G; ++i) amax = core::fmax_nan_ignoring(amax, core::abs_bits(x[i]));
      const core::GroupScale gs = core::group_scale(amax, p.ue8m0);
      uint8_t* qg = q.data() + g * p.G;
      for (int64_t i = 0; i < p.G; ++i) qg[i] = core::quantize(x[i], gs.inv);
      if (p.ue8m0) {
        words[core::ue8m0_word(g)] |= gs.ue8m0 << core::ue8m0_shift(g);
      } else {
        store<float>(a.x_sf, t, g, gs.scale);
      }
    }
    if (a.x_q.strides[1] == 1) {
      std::memcpy(xq + t * a.x_q.strides[0], q.data(), static_cast<size_t>(p.H));
    } else {
      for (int64_t h = 0; h < p.H; ++h) xq[t * a.x_q.strides[0] + h * a.x_q.strides[1]] = q[h];
    }
    if (p.ue8m0) {
      for (int64_t w = 0; w < p.sf_cols; ++w) store<uint32_t>(a.x_sf, t, w, words[w]);
      if (p.has_shared) {
        const int64_t r = core::shared_sf_row(t, p.shared_bm);
        for (int64_t w = 0; w < p.sf_cols; ++w) store<uint32_t>(*a.shared_x_sf, r, w, words[w]);
      }
    }
    bool pad = false;
    if (p.has_padding) {
      const TensorRef& m = *a.is_padding;
      pad = static_cast<const uint8_t*>(m.data)[t * m.strides[0]] != 0;
    }
    for (int64_t k = 0; k < p.K; ++k) {
      int64_t id = -1;
      float w = 0.0f;
      if (!pad) {
        id = a.topk_ids.dtype == DType::kInt32 ? load<int32_t>(a.topk_ids, t, k)
                                               : load<int64_t>(a.topk_ids, t, k);
        w = load_float(a.topk_weights, t, k);
      }
      store<int64_t>(a.topk_idx_out, t, k, id);
      store<float>(a.topk_weights_out, t, k, w);
    }
  }
}

}  // namespace

void prepare_inputs(const StageArgs& a, const detail::Problem& p) {
  // T * (H + K) as a float: the element counts fit in int64 but their sum need not.
  const double work = static_cast<double>(p.T) * (static_cast<double>(p.H) + static_cast<double>(p.K));
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  unsigned n = cores;
  if (work < static_cast<double>(int64_t{1} << 18)) n = 1;
  n = static_cast<unsigned>(std::min<int64_t>(n, p.T));
  if (n <= 1) {
    stage_rows(a, p, 0, p.T);
    return;
  }
  // A worker's exception (std::bad_alloc of its row buffers) must reach the caller, not
  // std::terminate: each worker keeps its own and the first one is rethrown after the join.
  const int64_t per = (p.T + n - 1) / n;
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> pool;
  auto run = [&](unsigned i) {
    const int64_t t0 = std::min<int64_t>(p.T, i * per), t1 = std::min<int64_t>(p.T, t0 + per);
    try {
      if (t0 < t1) stage_rows(a, p, t0, t1);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  try {
    for (unsigned i = 1; i < n; ++i) pool.emplace_back(run, i);
  } catch (...) {
    for (auto& th : pool) th.join();
    throw;
  }
  run(0);
  for (auto& th : pool) th.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace cpu
}  // namespace megamoe
