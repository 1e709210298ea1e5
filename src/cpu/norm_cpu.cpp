// norm_cpu.cpp: rmsnorm_and_stage on the host. Each row's residual add, sum of squares in
// the contract's fixed order, scale and normalized values (core/rmsnorm.h, the kernels'
// math) are written to y, or to a scratch copy when the caller asks for no y; then those
// rows are staged by prepare_inputs' own path, so the staged bytes are those of
// prepare_inputs(y) by construction.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/checked.h"
#include "core/rmsnorm.h"
#include "cpu/fp_env.h"
#include "cpu/pool.h"
#include "cpu/stage_cpu.h"
#include "megamoe/cpu.h"
#include "megamoe/error.h"
#include "megamoe/norm.h"

namespace megamoe {
namespace cpu {
namespace {

uint16_t load16(const TensorRef& t, int64_t i, int64_t j) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char*>(t.data) + (i * t.strides[0] + j * t.strides[1]) * 2, 2);
  return v;
}

void store16(const TensorRef& t, int64_t i, int64_t j, uint16_t v) {
  std::memcpy(static_cast<char*>(t.data) + (i * t.strides[0] + j * t.strides[1]) * 2, &v, 2);
}

float weight_at(const TensorRef& w, int64_t j, bool f32) {
  const char* at = static_cast<const char*>(w.data) + j * w.strides[0] * (f32 ? 4 : 2);
  if (f32) {
    float v;
    std::memcpy(&v, at, 4);
    return v;
  }
  uint16_t v;
  std::memcpy(&v, at, 2);
  return core::bf16_to_float(v);
}

/// Rows [t0, t1): z (and residual_out), the row's scale, y. Every element of a row is read
/// before any of it is written, so y may be x and residual_out residual (the same views).
void norm_rows(const RmsNormArgs& n, const detail::NormProblem& p, const TensorRef& y, int64_t t0, int64_t t1) {
  const int64_t H = p.H;
  const int64_t chunks = H / core::kNormChunk;
  std::vector<float> z(static_cast<size_t>(H));
  std::vector<float> c(static_cast<size_t>(core::norm_tree_width(std::max<int64_t>(chunks, 1))));
  std::vector<float> w(static_cast<size_t>(H));
  for (int64_t j = 0; j < H; ++j) w[static_cast<size_t>(j)] = weight_at(n.weight, j, p.weight_f32);
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t j = 0; j < H; ++j) {
      uint16_t b = load16(n.x, t, j);
      if (p.has_residual) {
        b = core::norm_add(b, load16(*n.residual, t, j));
        if (n.residual_out) store16(*n.residual_out, t, j, b);
      }
      z[static_cast<size_t>(j)] = core::bf16_to_float(b);
    }
    std::fill(c.begin(), c.end(), 0.0f);
    for (int64_t k = 0; k < chunks; ++k) c[static_cast<size_t>(k)] = core::norm_chunk_sumsq(&z[static_cast<size_t>(k * core::kNormChunk)]);
    const float s = core::norm_scale(core::fold_halves(c.data(), static_cast<int64_t>(c.size())), H, p.eps);
    for (int64_t j = 0; j < H; ++j) {
      store16(y, t, j, core::norm_element(z[static_cast<size_t>(j)], s, w[static_cast<size_t>(j)]));
    }
  }
}

/// Rows a chunk of the pool's work holds (about 2^16 elements, at least one row).
int64_t rows_per_chunk(int64_t H) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(H, 1)); }

}  // namespace

void rmsnorm_and_stage(const RmsNormArgs& n, const StageArgs& s, const detail::NormProblem& p) {
  const DefaultFpEnv fp_env;  // the norm's sums and products, whatever the caller's rounding / FTZ / traps
  TensorRef y;
  std::vector<uint16_t> scratch;
  if (n.y) {
    y = *n.y;
  } else {
    const core::Checked count = core::Checked(p.T) * p.H;  // fits: x has that many elements
    if (!count.ok()) throw Error(ErrorCode::kInternal, "megamoe: rmsnorm_and_stage: row count overflows");
    scratch.resize(static_cast<size_t>(count.value()));
    y = TensorRef(scratch.data(), DType::kBFloat16, {p.T, p.H}, n.x.device);
  }
  if (p.T > 0 && p.H > 0) {
    const int64_t rows = rows_per_chunk(p.H);
    const int64_t chunks = (p.T + rows - 1) / rows;
    const int threads = chunks > 1 ? cpu_threads() : 1;
    parallel_for(chunks, threads, [&](int64_t c) { norm_rows(n, p, y, c * rows, std::min(p.T, c * rows + rows)); });
  }
  prepare_inputs(detail::staged_args(y, s), p.stage);
}

}  // namespace cpu
}  // namespace megamoe
