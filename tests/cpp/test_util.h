// test_util.h: strided host buffers with poison, dtype conversions for input generation,
// a bitwise comparison that names the first mismatch, and a harness that stages one
// problem through megamoe::prepare_inputs and checks every output byte against the
// independent reference (tests/reference/megamoe_reference.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "megamoe/megamoe.h"
#include "megamoe_reference.h"

namespace mt {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::TensorRef;

// ---------------------------------------------------------------------------------------
// Scalar conversions (used only to generate inputs; the reference widens the stored bits).

inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// fp32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN of the same sign.
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = f2u(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// fp32 -> IEEE binary16 bits, round to nearest even, overflow to Inf.
inline uint16_t float_to_half(float f) {
  const uint32_t u = f2u(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65536 -> Inf
  if (a < 0x33000000u) return sign;                                     // < 2^-25 -> 0
  const int e = static_cast<int>(a >> 23) - 127;
  uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  // Number of fraction bits dropped: 13 for normals, more for subnormals (e < -14).
  const int shift = e >= -14 ? 13 : 13 + (-14 - e);
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  // q includes the implicit bit for normals: compose exponent + mantissa by addition so a
  // mantissa carry bumps the exponent (and 65504+ rounds up to Inf).
  const uint32_t h = e >= -14 ? ((static_cast<uint32_t>(e + 14) << 10) + q) : q;
  return static_cast<uint16_t>(sign | std::min<uint32_t>(h, 0x7C00u));
}

/// Element bits of a float-valued dtype -> fp32 (exact), through the reference.
inline float widen(DType dt, const uint8_t* p) {
  uint16_t h;
  switch (dt) {
    case DType::kBFloat16:
      std::memcpy(&h, p, 2);
      return megamoe_ref::bf16_to_float(h);
    case DType::kFloat16:
      std::memcpy(&h, p, 2);
      return megamoe_ref::half_to_float(h);
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

/// fp32 -> element bytes of a float-valued dtype.
inline void narrow(DType dt, float v, uint8_t* p) {
  if (dt == DType::kBFloat16) {
    const uint16_t h = float_to_bf16(v);
    std::memcpy(p, &h, 2);
  } else if (dt == DType::kFloat16) {
    const uint16_t h = float_to_half(v);
    std::memcpy(p, &h, 2);
  } else {
    std::memcpy(p, &v, 4);
  }
}

// ---------------------------------------------------------------------------------------
// Strided buffers.

/// How a tensor's elements are laid out in its buffer.
enum class Layout {
  kContig,      ///< row-major dense
  kPadded,      ///< row-major, row stride = cols + 3 (gap columns)
  kTransposed,  ///< column-major, column stride = rows + 1
  kNegRows,     ///< rows in reverse order (negative row stride), padded rows
  kNegCols,     ///< columns in reverse order (negative column stride)
  kStride2,     ///< every other element, odd row stride
  kMnMajor4,    ///< column-major with column stride align(rows, 4) (DeepGEMM MN-major sf)
};

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContig: return "contig";
    case Layout::kPadded: return "padded";
    case Layout::kTransposed: return "transposed";
    case Layout::kNegRows: return "neg_rows";
    case Layout::kNegCols: return "neg_cols";
    case Layout::kStride2: return "stride2";
    case Layout::kMnMajor4: return "mn_major4";
  }
  return "?";
}

constexpr int64_t kMargin = 32;  ///< bytes of gap before and after every buffer's elements

/// One tensor view over its own heap buffer; everything outside the elements is "gap".
struct Buf {
  std::vector<uint8_t> mem;
  DType dtype = DType::kFloat32;
  int ndim = 2;
  int64_t shape[2] = {0, 0};
  int64_t strides[2] = {0, 0};
  int64_t base = 0;  ///< byte offset of element (0, 0) in mem
  int64_t es = 4;    ///< element size in bytes

  int64_t rows() const { return ndim == 0 ? 1 : shape[0]; }  // a 0-D tensor has one element
  int64_t cols() const { return ndim == 2 ? shape[1] : 1; }
  int64_t offset(int64_t i, int64_t j = 0) const {
    if (ndim == 0) return base;
    return base + (i * strides[0] + (ndim == 2 ? j * strides[1] : 0)) * es;
  }
  uint8_t* ptr(int64_t i, int64_t j = 0) { return mem.data() + offset(i, j); }
  const uint8_t* ptr(int64_t i, int64_t j = 0) const { return mem.data() + offset(i, j); }
  template <typename T>
  T get(int64_t i, int64_t j = 0) const {
    T v;
    std::memcpy(&v, ptr(i, j), sizeof(T));
    return v;
  }
  template <typename T>
  void set(int64_t i, int64_t j, T v) {
    std::memcpy(ptr(i, j), &v, sizeof(T));
  }
  /// The TensorRef the library sees.
  TensorRef ref() {
    TensorRef r;
    r.data = mem.data() + base;
    r.dtype = dtype;
    r.ndim = ndim;
    for (int d = 0; d < 2; ++d) {
      r.shape[d] = d < ndim ? shape[d] : 0;
      r.strides[d] = d < ndim ? strides[d] : 0;
    }
    return r;
  }
  /// "(i, j)" of the element that covers byte b of mem, or "" for a gap byte.
  std::string element_at(int64_t b) const {
    for (int64_t i = 0; i < rows(); ++i) {
      for (int64_t j = 0; j < cols(); ++j) {
        const int64_t o = offset(i, j);
        if (b >= o && b < o + es) {
          std::ostringstream os;
          os << "(";
          if (ndim >= 1) os << i;
          if (ndim == 2) os << ", " << j;
          os << ") byte " << (b - o);
          return os.str();
        }
      }
    }
    return "";
  }
};

/// A buffer for a [rows, cols] (or 1-D [rows] when cols < 0) view of @p dt in layout @p l,
/// the first element shifted by one element from 16-byte alignment when @p misalign;
/// every byte filled with @p fill.
inline Buf make_buf(DType dt, int64_t rows, int64_t cols, Layout l, bool misalign, uint8_t fill) {
  Buf b;
  b.dtype = dt;
  b.es = megamoe::dtype_size(dt);
  b.ndim = cols < 0 ? 1 : 2;
  b.shape[0] = rows;
  b.shape[1] = cols < 0 ? 0 : cols;
  const int64_t R = rows, C = b.ndim == 2 ? cols : 1;
  int64_t s0 = C, s1 = 1;
  switch (l) {
    case Layout::kContig: break;
    case Layout::kPadded: s0 = C + 3; break;
    case Layout::kTransposed: s0 = 1; s1 = R + 1; break;
    case Layout::kNegRows: s0 = -(C + 2); break;
    case Layout::kNegCols: s1 = -1; break;
    case Layout::kStride2: s0 = 2 * C + 1; s1 = 2; break;
    case Layout::kMnMajor4: s0 = 1; s1 = (R + 3) / 4 * 4; break;
  }
  if (b.ndim == 1) {  // 1-D: contiguous, strided or reversed
    s0 = l == Layout::kContig ? 1 : l == Layout::kNegRows || l == Layout::kNegCols ? -2 : 3;
  }
  b.strides[0] = s0;
  b.strides[1] = b.ndim == 2 ? s1 : 0;
  int64_t lo = 0, hi = 0;
  if (R > 0 && C > 0) {
    for (int d = 0; d < b.ndim; ++d) {
      const int64_t ext = ((d == 0 ? R : C) - 1) * b.strides[d];
      (ext < 0 ? lo : hi) += ext;
    }
  }
  b.base = kMargin + (misalign ? b.es : 0) - lo * b.es;
  b.mem.assign(static_cast<size_t>(b.base + (hi + 1) * b.es + kMargin), fill);
  return b;
}

/// A 0-D tensor (@p zero_dim) or a 1-D [1] tensor of @p dt holding @p value, its bytes
/// around it filled with @p fill (the shape of global_scale and nonfinite_count).
template <typename V>
inline Buf make_scalar(DType dt, bool zero_dim, bool misalign, uint8_t fill, V value) {
  Buf b = make_buf(dt, 1, -1, Layout::kContig, misalign, fill);
  if (zero_dim) {
    b.ndim = 0;
    b.shape[0] = 0;
    b.strides[0] = 0;
  }
  static_assert(std::is_trivially_copyable<V>::value, "raw element bytes");
  std::memcpy(b.ptr(0), &value, sizeof(V) < static_cast<size_t>(b.es) ? sizeof(V) : static_cast<size_t>(b.es));
  return b;
}

/// Byte-by-byte equality of a buffer with its expected image, naming the first mismatch
/// (element coordinates or "gap"), both byte values and the mismatch count.
inline ::testing::AssertionResult assert_bitwise_equal(const char* name, const Buf& actual,
                                                       const std::vector<uint8_t>& expected) {
  if (actual.mem.size() != expected.size()) {
    return ::testing::AssertionFailure() << name << ": buffer size " << actual.mem.size()
                                         << " vs expected " << expected.size();
  }
  size_t first = expected.size(), count = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (actual.mem[i] != expected[i]) {
      if (count++ == 0) first = i;
    }
  }
  if (count == 0) return ::testing::AssertionSuccess();
  const std::string where = actual.element_at(static_cast<int64_t>(first));
  std::ostringstream os;
  os << name << ": " << count << " byte(s) differ; first at buffer byte " << first << " ("
     << (where.empty() ? std::string("gap outside the tensor's elements") : "element " + where)
     << "): got 0x" << std::hex << static_cast<int>(actual.mem[first]) << ", expected 0x"
     << static_cast<int>(expected[first]);
  return ::testing::AssertionFailure() << os.str();
}

// ---------------------------------------------------------------------------------------
// Staging harness.

/// Dense inputs of one problem, each in its own dtype (row-major bytes).
struct Problem {
  int64_t T = 0, H = 0, K = 0;
  QuantScheme q = QuantScheme::mxfp8();  ///< the scheme the library is given
  DType hidden_dt = DType::kBFloat16;
  std::vector<uint8_t> hidden;  ///< T*H elements of hidden_dt
  DType ids_dt = DType::kInt64;
  std::vector<uint8_t> ids;  ///< T*K elements of ids_dt
  DType w_dt = DType::kFloat32;
  std::vector<uint8_t> w;  ///< T*K elements of w_dt
  std::optional<DType> pad_dt;  ///< kBool or kUInt8 when is_padding is passed
  std::vector<uint8_t> pad;     ///< T bytes
  int64_t bm = 0;               ///< shared_block_m; 0 = no shared_x_sf
  /// dtype of x_q: fp8 or uint8 for fp8 formats; uint8 or int8 for fp4 ones.
  DType x_fp8_dt = DType::kFloat8E4M3;
  /// The MXFP4 drop-in (SPEC: the default scheme with an int8/uint8 x_q of width H/2 means
  /// MXFP4 with ttz ties): q stays mxfp8() and x_q gets H/2 columns.
  bool fp4_dropin = false;
  float global_scale = 1.0f;              ///< the value passed as global_scale (NVFP4 static)
  std::optional<int64_t> nonfinite_init;  ///< pass nonfinite_count, holding this value

  /// The format the library must produce (the drop-in rule applied).
  megamoe_ref::Format format() const {
    using megamoe_ref::Format;
    using megamoe_ref::Fp4Ties;
    if (fp4_dropin) return Format::mxfp4(Fp4Ties::kTowardZero, q.amax_floor);
    if (q.elem == megamoe::QuantElem::kFloat4E2M1) {
      if (q.scale2 == megamoe::Scale2::kStatic) return Format::nvfp4_static(global_scale);
      if (q.scale2 == megamoe::Scale2::kPerToken) return Format::nvfp4_per_token(q.amax_floor);
      if (q.scale2 == megamoe::Scale2::kOnline) return Format::nvfp4_online(q.amax_floor);
      const bool rne = q.rounding == megamoe::Rounding::kNearestEven;
      return Format::mxfp4(rne ? Fp4Ties::kNearestEven : Fp4Ties::kTowardZero, q.amax_floor);
    }
    if (q.elem == megamoe::QuantElem::kFloat8E5M2) return Format::mxfp8_e5m2(q.amax_floor);
    return Format::fp8(q.ue8m0(), q.group_k, q.amax_floor);
  }
  int64_t groups() const { return H / format().G; }
  int64_t sf_cols() const { return format().sf_cols(H); }
  int64_t q_cols() const { return format().q_cols(H); }
  bool static_gs() const { return !fp4_dropin && q.scale2 == megamoe::Scale2::kStatic; }
  bool per_token() const { return !fp4_dropin && q.scale2 == megamoe::Scale2::kPerToken; }
  /// NVFP4 online: global_scale is an output.
  bool online_gs() const { return !fp4_dropin && q.scale2 == megamoe::Scale2::kOnline; }
};

/// Dense problem with contiguous zero-filled inputs (callers fill what they need); x_q is
/// fp8 for fp8 schemes and uint8 for fp4 ones.
inline Problem make_problem(int64_t T, int64_t H, int64_t K, QuantScheme q,
                            DType hidden_dt = DType::kFloat32) {
  Problem p;
  p.T = T;
  p.H = H;
  p.K = K;
  p.q = q;
  p.hidden_dt = hidden_dt;
  p.hidden.assign(static_cast<size_t>(T * H * megamoe::dtype_size(hidden_dt)), 0);
  p.ids.assign(static_cast<size_t>(T * K * 8), 0);
  p.w.assign(static_cast<size_t>(T * K * 4), 0);
  if (q.elem == megamoe::QuantElem::kFloat4E2M1) p.x_fp8_dt = DType::kUInt8;
  if (q.elem == megamoe::QuantElem::kFloat8E5M2) p.x_fp8_dt = DType::kFloat8E5M2;
  return p;
}

/// Set hidden element (t, h) of @p p from an fp32 value (converted to hidden_dt).
inline void set_hidden(Problem& p, int64_t t, int64_t h, float v) {
  narrow(p.hidden_dt, v, p.hidden.data() + (t * p.H + h) * megamoe::dtype_size(p.hidden_dt));
}
/// Set hidden element (t, h) from raw element bits (bf16/fp16: low 16 bits).
inline void set_hidden_bits(Problem& p, int64_t t, int64_t h, uint32_t bits) {
  const int64_t es = megamoe::dtype_size(p.hidden_dt);
  std::memcpy(p.hidden.data() + (t * p.H + h) * es, &bits, static_cast<size_t>(es));
}

/// Layout of every tensor of one call.
struct Layouts {
  Layout hidden = Layout::kContig, ids = Layout::kContig, w = Layout::kContig,
         pad = Layout::kContig, x_q = Layout::kContig, x_sf = Layout::kContig,
         idx = Layout::kContig, wout = Layout::kContig, shared = Layout::kContig,
         x_scales = Layout::kContig;  ///< 1-D: contig, kNegRows (reversed) or strided
  bool misalign_in = false;   ///< shift every input's first element by one element
  bool misalign_out = false;  ///< same for every output
  bool scalars_0d = false;    ///< global_scale and nonfinite_count as 0-D tensors (else [1])
  int64_t shared_extra_rows = 0;

  std::string describe() const {
    std::ostringstream os;
    os << "hidden=" << layout_name(hidden) << " ids=" << layout_name(ids)
       << " w=" << layout_name(w) << " pad=" << layout_name(pad)
       << " x_q=" << layout_name(x_q) << " x_sf=" << layout_name(x_sf)
       << " idx=" << layout_name(idx) << " wout=" << layout_name(wout)
       << " shared=" << layout_name(shared) << " x_scales=" << layout_name(x_scales)
       << " misalign_in=" << misalign_in << " misalign_out=" << misalign_out
       << " scalars_0d=" << scalars_0d << " shared_extra_rows=" << shared_extra_rows;
    return os.str();
  }
};

constexpr uint8_t kGapFill = 0x7F;  ///< input gap bytes: huge values / NaN if ever read
constexpr uint8_t kPoison = 0xFF;   ///< output poison: fp8 -NaN, UE8M0 byte 255, NaN fp32
constexpr uint8_t kPoisonIdx = 0xA5;  ///< topk_idx_out poison (0xFF.. would be id -1)
/// Second poisons, every bit flipped from the first ones': a byte some format legally writes
/// can equal one poison (0xFF is two -6 nibbles in FP4), never both, so a call that skips
/// a write fails under one of them (stage_and_compare runs the library under both).
constexpr uint8_t kPoison2 = 0x00;
constexpr uint8_t kPoisonIdx2 = 0x5A;

/// Strided copies of a problem's inputs and poisoned outputs.
struct Call {
  Buf hidden, ids, w, x_q, x_sf, idx, wout;
  std::optional<Buf> pad, shared;
  std::optional<Buf> gs;        ///< global_scale input (NVFP4 static)
  std::optional<Buf> x_scales;  ///< per-token scale output (NVFP4 per-token)
  std::optional<Buf> gs_out;    ///< global_scale output (NVFP4 online)
  std::optional<Buf> nfc;       ///< nonfinite_count (in/out)
  megamoe::StageArgs args;

  std::vector<std::pair<const char*, const Buf*>> inputs() const {
    std::vector<std::pair<const char*, const Buf*>> v = {
        {"hidden_states", &hidden}, {"topk_ids", &ids}, {"topk_weights", &w}};
    if (pad) v.emplace_back("is_padding", &*pad);
    if (gs) v.emplace_back("global_scale", &*gs);
    return v;
  }
  /// Everything a call may write (nonfinite_count included: a rejected call must leave it).
  std::vector<std::pair<const char*, const Buf*>> outputs() const {
    std::vector<std::pair<const char*, const Buf*>> v = {{"x_q", &x_q},
                                                         {"x_sf", &x_sf},
                                                         {"topk_idx_out", &idx},
                                                         {"topk_weights_out", &wout}};
    if (shared) v.emplace_back("shared_x_sf", &*shared);
    if (x_scales) v.emplace_back("x_scales", &*x_scales);
    if (gs_out) v.emplace_back("global_scale", &*gs_out);
    if (nfc) v.emplace_back("nonfinite_count", &*nfc);
    return v;
  }
};

/// Copy dense row-major elements into a strided buffer.
inline void scatter(Buf& b, const std::vector<uint8_t>& dense) {
  for (int64_t i = 0; i < b.rows(); ++i) {
    for (int64_t j = 0; j < b.cols(); ++j) {
      std::memcpy(b.ptr(i, j), dense.data() + (i * b.cols() + j) * b.es, static_cast<size_t>(b.es));
    }
  }
}

/// Build the strided inputs and poisoned outputs of @p p in layouts @p l (outputs filled
/// with @p poison, topk_idx_out with @p poison_idx).
inline Call make_call(const Problem& p, const Layouts& l, uint8_t poison = kPoison,
                      uint8_t poison_idx = kPoisonIdx) {
  Call c;
  const bool mi = l.misalign_in, mo = l.misalign_out;
  const megamoe_ref::Format f = p.format();
  c.hidden = make_buf(p.hidden_dt, p.T, p.H, l.hidden, mi, kGapFill);
  scatter(c.hidden, p.hidden);
  c.ids = make_buf(p.ids_dt, p.T, p.K, l.ids, mi, kGapFill);
  scatter(c.ids, p.ids);
  c.w = make_buf(p.w_dt, p.T, p.K, l.w, mi, kGapFill);
  scatter(c.w, p.w);
  if (p.pad_dt) {
    c.pad = make_buf(*p.pad_dt, p.T, -1, l.pad, mi, kGapFill);
    scatter(*c.pad, p.pad);
  }
  if (p.static_gs()) c.gs = make_scalar(DType::kFloat32, l.scalars_0d, mi, kGapFill, p.global_scale);
  c.x_q = make_buf(p.x_fp8_dt, p.T, p.q_cols(), l.x_q, mo, poison);
  c.x_sf = make_buf(f.packed_scales() ? DType::kInt32 : DType::kFloat32, p.T, p.sf_cols(), l.x_sf,
                    mo, poison);
  c.idx = make_buf(DType::kInt64, p.T, p.K, l.idx, mo, poison_idx);
  c.wout = make_buf(DType::kFloat32, p.T, p.K, l.wout, mo, poison);
  if (p.bm > 0) {
    const int64_t abm = (p.bm + 127) / 128 * 128;
    const int64_t rows = (p.T + p.bm - 1) / p.bm * abm + l.shared_extra_rows;
    c.shared = make_buf(DType::kInt32, rows, p.sf_cols(), l.shared, mo, poison);
  }
  if (p.per_token()) c.x_scales = make_buf(DType::kFloat32, p.T, -1, l.x_scales, mo, poison);
  if (p.online_gs()) c.gs_out = make_scalar(DType::kFloat32, l.scalars_0d, mo, poison, uint32_t{0x01010101u} * poison);
  if (p.nonfinite_init) {
    c.nfc = make_scalar(DType::kInt64, l.scalars_0d, mo, poison, *p.nonfinite_init);
  }
  megamoe::StageArgs& a = c.args;
  a.hidden_states = c.hidden.ref();
  a.topk_ids = c.ids.ref();
  a.topk_weights = c.w.ref();
  if (c.pad) a.is_padding = c.pad->ref();
  a.x_q = c.x_q.ref();
  a.x_sf = c.x_sf.ref();
  a.topk_idx_out = c.idx.ref();
  a.topk_weights_out = c.wout.ref();
  if (c.shared) {
    a.shared_x_sf = c.shared->ref();
    a.shared_block_m = p.bm;
  }
  if (c.gs) a.global_scale = c.gs->ref();
  if (c.gs_out) a.global_scale = c.gs_out->ref();
  if (c.x_scales) a.x_scales = c.x_scales->ref();
  if (c.nfc) a.nonfinite_count = c.nfc->ref();
  a.hidden_quant = p.q;
  return c;
}

/// The reference result of @p p (inputs widened exactly from their dtypes).
inline megamoe_ref::Result reference(const Problem& p) {
  std::vector<float> hidden(static_cast<size_t>(p.T * p.H));
  const int64_t hes = megamoe::dtype_size(p.hidden_dt);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = widen(p.hidden_dt, p.hidden.data() + i * hes);
  std::vector<int64_t> ids(static_cast<size_t>(p.T * p.K));
  std::vector<float> w(ids.size());
  const int64_t wes = megamoe::dtype_size(p.w_dt);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (p.ids_dt == DType::kInt32) {
      int32_t v;
      std::memcpy(&v, p.ids.data() + i * 4, 4);
      ids[i] = v;
    } else {
      std::memcpy(&ids[i], p.ids.data() + i * 8, 8);
    }
    w[i] = widen(p.w_dt, p.w.data() + i * wes);
  }
  return megamoe_ref::stage(hidden.data(), p.T, p.H, ids.data(), w.data(), p.K,
                            p.pad_dt ? p.pad.data() : nullptr, p.format());
}

/// Expected images of every output buffer of @p c: poison outside the elements (and on
/// unmapped shared rows), the reference inside.
struct Expected {
  std::vector<uint8_t> x_q, x_sf, idx, wout, shared, x_scales, gs, nfc;
};

inline Expected expected_images(const Problem& p, const Call& c, const megamoe_ref::Result& r) {
  Expected e;
  auto put = [](std::vector<uint8_t>& img, const Buf& b, int64_t i, int64_t j, const void* v) {
    std::memcpy(img.data() + b.offset(i, j), v, static_cast<size_t>(b.es));
  };
  e.x_q = c.x_q.mem;
  e.x_sf = c.x_sf.mem;
  e.idx = c.idx.mem;
  e.wout = c.wout.mem;
  const bool packed = p.format().packed_scales();
  const int64_t sc = p.sf_cols(), qc = p.q_cols();
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t h = 0; h < qc; ++h) put(e.x_q, c.x_q, t, h, &r.x_q[t * qc + h]);
    for (int64_t s = 0; s < sc; ++s) {
      const void* v = packed ? static_cast<const void*>(&r.sf_words[t * sc + s])
                             : static_cast<const void*>(&r.sf_f32[t * sc + s]);
      put(e.x_sf, c.x_sf, t, s, v);
    }
    for (int64_t k = 0; k < p.K; ++k) {
      put(e.idx, c.idx, t, k, &r.idx[t * p.K + k]);
      put(e.wout, c.wout, t, k, &r.w[t * p.K + k]);
    }
  }
  if (c.shared) {
    e.shared = c.shared->mem;
    for (int64_t t = 0; t < p.T; ++t) {
      const int64_t row = megamoe_ref::shared_row(t, p.bm);
      for (int64_t s = 0; s < sc; ++s) put(e.shared, *c.shared, row, s, &r.sf_words[t * sc + s]);
    }
  }
  if (c.x_scales) {
    e.x_scales = c.x_scales->mem;
    for (int64_t t = 0; t < p.T; ++t) put(e.x_scales, *c.x_scales, t, 0, &r.x_scales[t]);
  }
  if (c.gs_out) {  // written by every call with tokens
    e.gs = c.gs_out->mem;
    if (p.T > 0) put(e.gs, *c.gs_out, 0, 0, &r.global_scale);
  }
  if (c.nfc) {  // SPEC: the count is added to what the counter held
    e.nfc = c.nfc->mem;
    const int64_t total = *p.nonfinite_init + r.nonfinite;
    put(e.nfc, *c.nfc, 0, 0, &total);
  }
  return e;
}

/// Every output of @p c against its expected image, the first difference reported.
inline ::testing::AssertionResult outputs_match(const Call& c, const Expected& e) {
  const std::vector<std::pair<const char*, const std::vector<uint8_t>*>> want = {
      {"x_q", &e.x_q}, {"x_sf", &e.x_sf}, {"topk_idx_out", &e.idx},
      {"topk_weights_out", &e.wout}, {"shared_x_sf", &e.shared}, {"x_scales", &e.x_scales},
      {"global_scale", &e.gs}, {"nonfinite_count", &e.nfc}};
  for (const auto& out : c.outputs()) {
    for (const auto& wnt : want) {
      if (std::string(out.first) != wnt.first) continue;
      auto res = assert_bitwise_equal(out.first, *out.second, *wnt.second);
      if (!res) return res;
    }
  }
  return ::testing::AssertionSuccess();
}

/// Stage @p p through the library in layouts @p l and compare every byte of every output
/// buffer (gaps and unmapped shared rows included) with the reference; inputs must be
/// left unchanged. The reference result goes to @p ref_out when given (also on a mismatch).
inline ::testing::AssertionResult stage_and_compare(const Problem& p, const Layouts& l,
                                                    megamoe_ref::Result* ref_out = nullptr) {
  const megamoe_ref::Result r = reference(p);
  // Handed back before any comparison, so that callers asserting on it never read an
  // empty result after a mismatch.
  if (ref_out != nullptr) *ref_out = r;
  // Under both poisons (kPoison2): an output byte left unwritten shows under at least one.
  for (const auto& poison : {std::make_pair(kPoison, kPoisonIdx), std::make_pair(kPoison2, kPoisonIdx2)}) {
    Call c = make_call(p, l, poison.first, poison.second);
    std::vector<std::vector<uint8_t>> inputs_before;
    for (const auto& in : c.inputs()) inputs_before.push_back(in.second->mem);
    const Expected e = expected_images(p, c, r);
    try {
      megamoe::prepare_inputs(c.args);
    } catch (const std::exception& ex) {
      return ::testing::AssertionFailure() << "prepare_inputs threw: " << ex.what();
    }
    const auto ins = c.inputs();
    for (size_t i = 0; i < ins.size(); ++i) {
      auto res = assert_bitwise_equal(ins[i].first, *ins[i].second, inputs_before[i]);
      if (!res) return res << " (an input was modified)";
    }
    auto res = outputs_match(c, e);
    if (!res) return res << " (outputs poisoned with 0x" << std::hex << static_cast<int>(poison.first) << ")";
  }
  return ::testing::AssertionSuccess();
}

/// Layouts that change everything but the values: strided, transposed, reversed,
/// misaligned, 0-D scalars.
inline Layouts odd_layouts() {
  Layouts l;
  l.hidden = Layout::kNegCols;
  l.ids = Layout::kTransposed;
  l.w = Layout::kStride2;
  l.pad = Layout::kStride2;
  l.x_q = Layout::kNegRows;
  l.x_sf = Layout::kMnMajor4;
  l.idx = Layout::kTransposed;
  l.wout = Layout::kNegCols;
  l.shared = Layout::kTransposed;
  l.x_scales = Layout::kNegRows;
  l.misalign_in = true;
  l.misalign_out = true;
  l.scalars_0d = true;
  l.shared_extra_rows = 3;
  return l;
}

/// Stage @p p (dense, then odd layouts), assert both match the reference, return it.
inline megamoe_ref::Result staged(const Problem& p) {
  megamoe_ref::Result r;
  EXPECT_TRUE(stage_and_compare(p, Layouts{}, &r)) << "dense layouts";
  EXPECT_TRUE(stage_and_compare(p, odd_layouts())) << "odd layouts";
  return r;
}

/// Name of a scheme for test names: "ue8m0_g32", "fp32_g128", "mxfp4", "mxfp4_rne",
/// "nvfp4_static", "nvfp4_per_token", "nvfp4_online"; "_floor1e10" (etc.) for a non-default floor.
inline std::string scheme_tag(const QuantScheme& q) {
  std::string tag;
  if (q.elem == megamoe::QuantElem::kBFloat16) {
    tag = "bf16";
  } else if (q.elem == megamoe::QuantElem::kFloat8E5M2) {
    tag = "mxfp8_e5m2";
  } else if (q.elem != megamoe::QuantElem::kFloat4E2M1) {
    tag = std::string(q.ue8m0() ? "ue8m0" : "fp32") + "_g" + std::to_string(q.group_k);
  } else if (q.scale2 == megamoe::Scale2::kNone) {
    tag = q.rounding == megamoe::Rounding::kNearestEven ? "mxfp4_rne" : "mxfp4";
  } else {
    tag = q.scale2 == megamoe::Scale2::kStatic   ? "nvfp4_static"
          : q.scale2 == megamoe::Scale2::kOnline ? "nvfp4_online"
                                                 : "nvfp4_per_token";
  }
  if (q.amax_floor == 0.0f) {
    tag += "_floor0";
  } else if (q.amax_floor != 1e-4f) {
    tag += "_floor1e" + std::to_string(static_cast<int>(std::lround(std::log10(q.amax_floor))));
  }
  for (char& ch : tag) {
    if (ch == '-') ch = 'm';  // test names allow [A-Za-z0-9_] only
  }
  return tag;
}

/// A UE8M0 or fp32 scheme with group size G.
inline QuantScheme scheme(bool ue8m0, int64_t G) {
  QuantScheme q = QuantScheme::mxfp8();
  q.scale = ue8m0 ? megamoe::ScaleType::kUE8M0 : megamoe::ScaleType::kFloat32;
  q.group_k = G;
  return q;
}

}  // namespace mt
