// stage_cpu.cpp: CPU backend. Generic over dtypes, strides and formats; the group math
// comes from formats/recipe.h, the same header the CUDA kernels use. Rows whose input and
// x_q are contiguous along H go through the vectorized quantizer (simd.h: the same bytes
// as the scalar rules); everything else runs the scalar loop below. Large problems are
// split into row chunks over the persistent pool (pool.h).
#include "cpu/stage_cpu.h"
#include "cpu/fp_env.h"

#include <algorithm>
#include <cfenv>
#include <cstring>
#include <vector>

#include "core/layout.h"
#include "formats/bf16/codec.h"
#include "formats/recipe.h"
#include "formats/visit.h"
#include "cpu/pool.h"
#include "cpu/simd.h"
#include "megamoe/cpu.h"

namespace megamoe {
namespace cpu {
namespace {

template <typename T>
void store(const TensorRef& t, int64_t i, int64_t j, T v, bool rank1 = false) {
  const int64_t off = rank1 ? i * t.strides[0] : i * t.strides[0] + j * t.strides[1];
  std::memcpy(static_cast<char*>(t.data) + off * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

/// Elements [h0, h0 + n) of row t of a bf16/fp16/fp32 tensor, widened exactly to fp32.
template <typename Bits, float (*Widen)(Bits)>
void widen_span(const TensorRef& a, int64_t t, int64_t h0, int64_t n, float* out) {
  // Byte loads (memcpy): the caller's data need not be aligned to the element size.
  const char* base = static_cast<const char*>(a.data) +
                     (t * a.strides[0] + h0 * a.strides[1]) * static_cast<int64_t>(sizeof(Bits));
  const int64_t step = a.strides[1] * static_cast<int64_t>(sizeof(Bits));
  for (int64_t h = 0; h < n; ++h) {
    Bits v;
    std::memcpy(&v, base + h * step, sizeof v);
    out[h] = Widen(v);
  }
}
float identity(float f) { return f; }

void load_span(const TensorRef& a, int64_t t, int64_t h0, int64_t n, float* out) {
  switch (a.dtype) {
    case DType::kBFloat16: return widen_span<uint16_t, core::bf16_to_float>(a, t, h0, n, out);
    case DType::kFloat16: return widen_span<uint16_t, core::half_to_float>(a, t, h0, n, out);
    default: return widen_span<float, identity>(a, t, h0, n, out);
  }
}

/// Quantize rows [t0, t1) with the vectorized quantizer when the rows of the input and of
/// x_q are contiguous along H and the instruction set takes the group size; false (nothing
/// written): the caller runs the scalar loop.
bool simd_rows(const StageArgs& a, const detail::Problem& p, int64_t t0, int64_t t1, int64_t* nonfinite) {
  const TensorRef& x = a.hidden_states;
  if (x.strides[1] != 1 || a.x_q.strides[1] != 1) return false;
  simd::Rows r;
  r.x = x.data;
  r.x_row = x.strides[0];
  r.in = x.dtype == DType::kBFloat16 ? simd::In::kBf16
         : x.dtype == DType::kFloat16 ? simd::In::kFp16
                                      : simd::In::kFp32;
  r.xq = static_cast<uint8_t*>(a.x_q.data);
  r.xq_row = a.x_q.strides[0];
  r.sf = a.x_sf.data;
  r.sf_s0 = a.x_sf.strides[0];
  r.sf_s1 = a.x_sf.strides[1];
  if (p.has_shared) {
    r.shared_sf = a.shared_x_sf->data;
    r.sh_s0 = a.shared_x_sf->strides[0];
    r.sh_s1 = a.shared_x_sf->strides[1];
    r.shared_bm = p.shared_bm;
  }
  if (p.fmt == core::Format::kNvfp4PerToken) {
    r.x_scales = a.x_scales->data;
    r.xs_s0 = a.x_scales->strides[0];
  }
  if (p.fmt == core::Format::kNvfp4Static) std::memcpy(&r.gs, a.global_scale->data, sizeof r.gs);
  r.H = p.H;
  r.G = p.G;
  r.fmt = p.fmt;
  r.floor = p.floor;
  r.count_nonfinite = p.has_nonfinite;
  return simd::quantize_rows(r, t0, t1, nonfinite);
}

template <core::Format F>
int64_t stage_rows_in(const StageArgs& a, const detail::Problem& p, int64_t t0, int64_t t1) {
  constexpr bool kPacked = core::packed_scales(F);
  constexpr bool kFp4 = core::values_per_byte(F) == 2;
  const int64_t G = p.G, groups = p.H / G;
  uint8_t* const xq = static_cast<uint8_t*>(a.x_q.data);
  const int64_t xs0 = a.x_q.strides[0], xs1 = a.x_q.strides[1];
  float s2 = 0.0f;  // second-level scale: static gs, or the row's per-token scale
  if constexpr (F == core::Format::kNvfp4Static) std::memcpy(&s2, a.global_scale->data, sizeof s2);
  int64_t nonfinite = 0;
  if (simd_rows(a, p, t0, t1, &nonfinite)) return nonfinite;
  float x[128];
  for (int64_t t = t0; t < t1; ++t) {
    core::TokenRow row{};  // NVFP4 per-token: the row's constants, once a row
    if constexpr (F == core::Format::kNvfp4PerToken) {
      float row_amax = 0.0f;
      for (int64_t h0 = 0; h0 < p.H; h0 += G) {
        load_span(a.hidden_states, t, h0, G, x);
        for (int64_t i = 0; i < G; ++i) row_amax = core::fmax_nan_ignoring(row_amax, core::abs_bits(x[i]));
      }
      s2 = core::per_token_scale(row_amax, p.floor);
      store<float>(*a.x_scales, t, 0, s2, /*rank1=*/true);
      row = core::nvfp4_token_row(s2);  // (group_params would redo them a group)
    }
    uint32_t word = 0;
    for (int64_t g = 0; g < groups; ++g) {
      load_span(a.hidden_states, t, g * G, G, x);
      float amax = 0.0f;
      for (int64_t i = 0; i < G; ++i) amax = core::fmax_nan_ignoring(amax, core::abs_bits(x[i]));
      if (p.has_nonfinite) {
        for (int64_t i = 0; i < G; ++i) nonfinite += core::non_finite(x[i]) ? 1 : 0;
      }
      const core::GroupParams gp = F == core::Format::kNvfp4PerToken ? core::nvfp4_token_group(amax, row)
                                                                      : core::group_params<F>(amax, p.floor, s2);
      if constexpr (kFp4) {
        for (int64_t i = 0; i < G; i += 2) {
          const uint32_t b = core::encode<F>(x[i], gp) | (core::encode<F>(x[i + 1], gp) << 4);
          xq[t * xs0 + ((g * G + i) / 2) * xs1] = static_cast<uint8_t>(b);
        }
      } else {
        for (int64_t i = 0; i < G; ++i) xq[t * xs0 + (g * G + i) * xs1] = static_cast<uint8_t>(core::encode<F>(x[i], gp));
      }
      if constexpr (kPacked) {
        word |= gp.sf << core::ue8m0_shift(g);
        if (g % 4 == 3) {
          store<uint32_t>(a.x_sf, t, g / 4, word);
          if (p.has_shared) store<uint32_t>(*a.shared_x_sf, core::shared_sf_row(t, p.shared_bm), g / 4, word);
          word = 0;
        }
      } else {
        store<uint32_t>(a.x_sf, t, g, gp.sf);
      }
    }
  }
  return nonfinite;
}

/// The bf16 row (no scales): rows [t0, t1) of x_q as the input in bf16, any strides. bf16
/// rows contiguous on both sides are one memcpy; everything else goes element by element
/// through formats/bf16/codec.h (byte loads and stores: any alignment).
int64_t copy_rows(const StageArgs& a, const detail::Problem& p, int64_t t0, int64_t t1) {
  const TensorRef& x = a.hidden_states;
  const int64_t in_size = dtype_size(x.dtype);
  const char* const xb = static_cast<const char*>(x.data);
  char* const qb = static_cast<char*>(a.x_q.data);
  const bool rows = x.dtype == DType::kBFloat16 && x.strides[1] == 1 && a.x_q.strides[1] == 1;
  int64_t nonfinite = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const char* in = xb + t * x.strides[0] * in_size;
    char* out = qb + t * a.x_q.strides[0] * 2;
    if (rows) {
      std::memcpy(out, in, static_cast<size_t>(p.H) * 2);
      if (p.has_nonfinite) {
        for (int64_t h = 0; h < p.H; ++h) {
          uint16_t b;
          std::memcpy(&b, in + h * 2, 2);
          nonfinite += core::bf16_non_finite(b) ? 1 : 0;
        }
      }
      continue;
    }
    for (int64_t h = 0; h < p.H; ++h) {
      const char* e = in + h * x.strides[1] * in_size;
      uint16_t b;
      bool nf;
      if (x.dtype == DType::kFloat32) {
        float v;
        std::memcpy(&v, e, 4);
        nf = core::non_finite(v);
        b = core::bf16_from_float(v);
      } else {
        uint16_t v;
        std::memcpy(&v, e, 2);
        const bool bf = x.dtype == DType::kBFloat16;
        nf = bf ? core::bf16_non_finite(v) : (v & 0x7C00u) == 0x7C00u;
        b = bf ? v : core::bf16_from_half(v);
      }
      nonfinite += nf ? 1 : 0;
      std::memcpy(out + h * a.x_q.strides[1] * 2, &b, 2);
    }
  }
  return p.has_nonfinite ? nonfinite : 0;
}

int64_t stage_rows(const StageArgs& a, const detail::Problem& p, int64_t t0, int64_t t1) {
  return core::visit_format(p.fmt, [&](auto f) -> int64_t {
    constexpr core::Format F = decltype(f)::value;
    if constexpr (core::passthrough(F)) {
      return copy_rows(a, p, t0, t1);
    } else {
      return stage_rows_in<F>(a, p, t0, t1);
    }
  });
}

/// Below this many elements (T * (H + K)) a call stays on the calling thread: a few
/// hundred microseconds of scalar work, about a hundred vectorized, where waking workers
/// would cost a noticeable part of it.
constexpr int64_t kSerialWork = int64_t{1} << 18;
/// Smallest chunk of work (elements) handed to a thread.
constexpr int64_t kChunkWork = int64_t{1} << 16;

/// f(t0, t1) over row chunks [t0, t1) of [0, p.T), on the pool when the work is large, the
/// chunks' results folded by combine in chunk order (init when T == 0).
template <class F, class C>
int64_t reduce_rows(const detail::Problem& p, int64_t init, F&& f, C&& combine) {
  // Work in elements per token; min(T * per_row, kSerialWork) without overflow.
  const int64_t per_row = std::max<int64_t>(1, p.H + p.K);
  const int64_t work = p.T >= kSerialWork / per_row ? kSerialWork : p.T * per_row;
  const int threads = cpu_threads();
  if (threads <= 1 || p.T < 2 || work < kSerialWork) return p.T > 0 ? combine(init, f(int64_t{0}, p.T)) : init;
  // Chunks of at least kChunkWork elements, about four per thread, so that a core slowed
  // by other load takes fewer of them.
  const int64_t min_rows = std::max<int64_t>(1, kChunkWork / per_row);
  const int64_t rows = std::max(min_rows, (p.T + 4 * threads - 1) / (4 * threads));
  const int64_t chunks = (p.T + rows - 1) / rows;
  std::vector<int64_t> out(static_cast<size_t>(chunks), init);
  parallel_for(chunks, threads, [&](int64_t c) {
    const int64_t t0 = c * rows, t1 = std::min(p.T, t0 + rows);
    out[static_cast<size_t>(c)] = f(t0, t1);
  });
  int64_t r = init;
  for (const int64_t v : out) r = combine(r, v);
  return r;
}

/// NaN-ignoring max |x| of rows [t0, t1) of the hidden states, as the bits of a
/// non-negative float (whose order is the integers': +Inf above every finite value).
int64_t rows_amax_bits(const TensorRef& x, int64_t H, int64_t t0, int64_t t1) {
  float m = 0.0f;
  float buf[128];  // H is a multiple of 128
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t h0 = 0; h0 < H; h0 += 128) {
      load_span(x, t, h0, 128, buf);
      for (int i = 0; i < 128; ++i) m = core::fmax_nan_ignoring(m, core::abs_bits(buf[i]));
    }
  }
  uint32_t b;
  std::memcpy(&b, &m, sizeof b);
  return b;
}

/// NVFP4 online's global scale of the call, written to global_scale (the whole tensor's
/// amax first: every group's scale depends on it).
void write_online_scale(const StageArgs& a, const detail::Problem& p) {
  // H == 0: no element (amax 0), and T may be any count up to 2^63 - 1.
  const int64_t bits = p.H == 0 ? 0 : reduce_rows(
      p, 0, [&](int64_t t0, int64_t t1) { return rows_amax_bits(a.hidden_states, p.H, t0, t1); },
      [](int64_t x, int64_t y) { return std::max(x, y); });
  const uint32_t b = static_cast<uint32_t>(bits);
  float amax;
  std::memcpy(&amax, &b, sizeof amax);
  const float gs = core::online_global_scale(amax, p.floor);
  std::memcpy(a.global_scale->data, &gs, sizeof gs);
}

}  // namespace

void prepare_inputs(const StageArgs& a, const detail::Problem& p_in) {
  const DefaultFpEnv fp_env;
  // NVFP4 online: gs from the whole tensor (T > 0; H == 0 gives the floor's), then the call
  // is NVFP4 static's reading gs back from global_scale.
  if (core::online_scaled(p_in.fmt) && p_in.T > 0) write_online_scale(a, p_in);
  detail::Problem p = p_in;
  p.fmt = core::staged_format(p_in.fmt);
  // H == 0: no activation, scale or shared element to write, and the empty tensors allow
  // any T up to 2^63 - 1 (repack_topk likewise returns at once when K == 0). Per-token
  // scales are still written (from the amax floor): x_scales, [T] and non-empty, bounds T.
  if (p.H == 0 && !p.has_x_scales) {
    repack_topk(topk_io(a), p);
    return;
  }
  const int64_t count = reduce_rows(
      p, 0, [&](int64_t t0, int64_t t1) { return stage_rows(a, p, t0, t1); },
      [](int64_t x, int64_t y) { return x + y; });
  if (p.has_nonfinite) {
    int64_t v;
    std::memcpy(&v, a.nonfinite_count->data, sizeof v);
    // Wraps like the device's atomics (two's complement), never signed overflow.
    v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(count));
    std::memcpy(a.nonfinite_count->data, &v, sizeof v);
  }
  repack_topk(topk_io(a), p);
}

}  // namespace cpu
}  // namespace megamoe
