// mhc_cpu.cpp: mhc_pre_and_stage on the host. Each token's sums (of squares, and the mix
// dot products against fn's rows) in the contract's fixed order, its coefficients
// (core/mhc.h, the kernel's math), the weighted sum of its streams and the RMSNorm of that
// row (core/rmsnorm.h) are written to the outputs and to y, or to a scratch copy when the
// caller asks for no y; then those rows are staged by prepare_inputs' own path, so the
// staged bytes are those of prepare_inputs(y) by construction.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/checked.h"
#include "core/mhc.h"
#include "core/rmsnorm.h"
#include "cpu/fp_env.h"
#include "cpu/pool.h"
#include "cpu/stage_cpu.h"
#include "megamoe/cpu.h"
#include "megamoe/mhc.h"

namespace megamoe {
namespace cpu {
namespace {

/// Element (i, j) of a validated 2-D tensor (or element i of a 1-D one, j = 0).
template <typename V>
V load(const TensorRef& t, int64_t i, int64_t j) {
  V v;
  const int64_t off = i * t.strides[0] + (t.ndim > 1 ? j * t.strides[1] : 0);
  std::memcpy(&v, static_cast<const char*>(t.data) + off * static_cast<int64_t>(sizeof(V)), sizeof(V));
  return v;
}

template <typename V>
void store(const TensorRef& t, int64_t i, int64_t j, V v) {
  std::memcpy(static_cast<char*>(t.data) + (i * t.strides[0] + j * t.strides[1]) * static_cast<int64_t>(sizeof(V)), &v,
              sizeof(V));
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

/// Sum over n chunks of kNormChunk values (n * kNormChunk values at a and b, b null for the
/// sum of squares) by the contract's tree; c: scratch of the tree's width.
float tree_sum(const float* a, const float* b, int64_t n, std::vector<float>& c) {
  std::fill(c.begin(), c.end(), 0.0f);
  for (int64_t k = 0; k < n; ++k) {
    const float* ak = a + k * core::kNormChunk;
    c[sz(k)] = b != nullptr ? core::chunk_dot(ak, b + k * core::kNormChunk) : core::norm_chunk_sumsq(ak);
  }
  return core::fold_halves(c.data(), static_cast<int64_t>(c.size()));
}

/// Tokens [t0, t1): their rows x (fp32, [rows][K]), the mix dot products against one fn
/// row at a time (each row of fn read once for the block), then per token the
/// coefficients, the weighted sum z, its norm and y.
void mhc_rows(const MhcPreArgs& m, const detail::MhcProblem& p, const TensorRef& y, int64_t t0, int64_t t1) {
  const int64_t rows = t1 - t0, K = p.K, H = p.H, hc = p.hc;
  const int64_t kchunks = K / core::kNormChunk, hchunks = H / core::kNormChunk;
  std::vector<float> x(sz(rows * K)), f(sz(K)), d(sz(rows * p.M)), S(sz(rows));
  std::vector<float> ck(sz(core::norm_tree_width(std::max<int64_t>(kchunks, 1))));
  std::vector<float> ch(sz(core::norm_tree_width(std::max<int64_t>(hchunks, 1))));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < K; ++k) x[sz(r * K + k)] = core::bf16_to_float(load<uint16_t>(m.residual, t0 + r, k));
    S[sz(r)] = tree_sum(&x[sz(r * K)], nullptr, kchunks, ck);
  }
  for (int mi = 0; mi < p.M; ++mi) {
    for (int64_t k = 0; k < K; ++k) f[sz(k)] = load<float>(m.fn, mi, k);
    for (int64_t r = 0; r < rows; ++r) d[sz(r * p.M + mi)] = tree_sum(&x[sz(r * K)], f.data(), kchunks, ck);
  }
  float scale[3], base[core::kMhcMaxMixes];
  for (int g = 0; g < 3; ++g) scale[g] = load<float>(m.hc_scale, g, 0);
  for (int mi = 0; mi < p.M; ++mi) base[mi] = load<float>(m.hc_base, mi, 0);
  std::vector<float> w(sz(H)), z(sz(H));
  for (int64_t h = 0; h < H; ++h) {
    w[sz(h)] = p.weight_f32 ? load<float>(m.norm_weight, h, 0) : core::bf16_to_float(load<uint16_t>(m.norm_weight, h, 0));
  }
  const core::MhcParams prm{m.rms_eps, m.hc_pre_eps, m.hc_sinkhorn_eps, m.hc_post_mult_value, m.sinkhorn_repeat};
  core::MhcCoeffs co;
  float q[core::kMhcMaxStreams], col[core::kMhcMaxStreams];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = t0 + r;
    core::mhc_coefficients(S[sz(r)], &d[sz(r * p.M)], K, p.hc, scale, base, prm, co);
    for (int64_t j = 0; j < hc; ++j) {
      store(m.post_mix, t, j, core::canonical_nan(co.post[j]));
      if (m.pre_mix) store(*m.pre_mix, t, j, core::canonical_nan(co.pre[j]));
      q[j] = m.pre_mix_in ? load<float>(*m.pre_mix_in, t, j) : co.pre[j];
    }
    for (int64_t i = 0; i < hc * hc; ++i) store(m.comb_mix, t, i, core::canonical_nan(co.comb[i]));
    const float* xr = &x[sz(r * K)];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t j = 0; j < hc; ++j) col[j] = xr[sz(j * H + h)];
      const uint16_t zb = core::bf16_from_float(core::mhc_mix(q, col, p.hc));
      if (m.layer_input) store(*m.layer_input, t, h, zb);
      z[sz(h)] = core::bf16_to_float(zb);
    }
    const float s = core::norm_scale(tree_sum(z.data(), nullptr, hchunks, ch), H, m.norm_eps);
    for (int64_t h = 0; h < H; ++h) store(y, t, h, core::norm_element(z[sz(h)], s, w[sz(h)]));
  }
}

/// Tokens a chunk of the pool's work holds: about 2^20 mixed-row elements (4 MiB of rows a
/// thread), at least one; fn is read once a chunk.
int64_t tokens_per_chunk(int64_t K) { return std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(K, 1)); }

}  // namespace

void mhc_pre_and_stage(const MhcPreArgs& m, const StageArgs& s, const detail::MhcProblem& p) {
  const DefaultFpEnv fp_env;  // the sums, products and quotients, whatever the caller's rounding / FTZ / traps
  TensorRef y;
  std::vector<uint16_t> scratch;
  if (m.y) {
    y = *m.y;
  } else {
    const core::Checked count = core::Checked(p.T) * p.H;  // fits: the residual has hc times as many elements
    if (!count.ok()) throw Error(ErrorCode::kInternal, "megamoe: mhc_pre_and_stage: row count overflows");
    scratch.resize(sz(count.value()));
    y = TensorRef(scratch.data(), DType::kBFloat16, {p.T, p.H}, m.residual.device);
  }
  if (p.T > 0) {
    const int64_t per = tokens_per_chunk(p.K);
    const int64_t chunks = (p.T - 1) / per + 1;
    const int threads = chunks > 1 ? cpu_threads() : 1;
    parallel_for(chunks, threads, [&](int64_t c) { mhc_rows(m, p, y, c * per, std::min(p.T, c * per + per)); });
  }
  prepare_inputs(detail::staged_args(y, s), p.stage);
}

}  // namespace cpu
}  // namespace megamoe
