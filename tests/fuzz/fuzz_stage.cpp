// fuzz_stage.cpp: libFuzzer target over megamoe::validate / prepare_inputs, stage_routing,
// validate_router / route / route_and_stage (CPU).
//
// Each input decodes (format: tests/fuzz/make_corpus.py, which also writes the seeds) into
// sizes T, H, K, a quantization scheme, shared_block_m and, for each of the twelve tensors
// of a call, a dtype, rank, shape, strides, device and a placement. Every tensor that can
// be backed lives in one pool, each buffer between red zones that hold a known pattern and
// are ASan-poisoned during the library's calls (a stray read is caught as well as a stray
// write). From SPEC.md alone, with exact 128-bit arithmetic, the harness decides whether
// the call
//   - must be rejected (a definite contract violation),
//   - must be accepted (T == 0, or every rule holds with plain, non-overlapping buffers), or
//   - may go either way (what the contract leaves open: output spans that interleave with
//     another tensor without sharing an element, output strides that alias nothing but
//     fail the usual sorted-stride test, zero strides on size-1 output dims, H == 0,
//     cpu:N devices, scheme fields beyond the fp8 contract).
// Then it calls validate() and prepare_inputs() and checks:
//   - only megamoe::Error escapes, with a CPU-build error code; both calls agree;
//   - a rejected call leaves every pool byte unchanged (validate() always does);
//   - an accepted call leaves inputs, gaps and red zones unchanged and writes every output
//     element as SPEC.md says, through the independent reference (tests/reference) for
//     every scheme it models (fp8 with any amax floor, MXFP4 with either tie rule and the
//     drop-in, NVFP4 per-token, NVFP4 static with a finite positive global scale): x_q,
//     x_sf, x_scales, top-k, nonfinite_count, and each mapped shared_x_sf row a copy of the
//     token's x_sf row; unmapped shared rows untouched. For a scheme it does not model, the
//     same except that x_q / x_sf / x_scales may hold anything inside their own elements
//     (the shared rows must then copy what the library wrote to x_sf).
// With the extension block (make_corpus.py) the input may instead call stage_routing,
// route or route_and_stage, in full-buffer mode (outputs of M >= T rows: top-k rows T..M-1
// -1 / +0.0, x_q / x_sf / x_scales rows T..M-1 untouched) and with a routed scaling factor;
// router outputs (ids, weights, EPLB load, the logit counter) are checked against
// tests/reference/router_reference.h, and route_and_stage against route() followed by
// prepare_inputs() on every pool byte.
// Any violation prints what was decoded and why, then __builtin_trap().
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#if defined(__has_include)
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>
#endif
#endif
#ifndef ASAN_POISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

#include "megamoe/megamoe.h"
// The reference's arithmetic is the oracle, not code under test: no coverage for it either.
#pragma clang attribute push(__attribute__((no_sanitize("coverage"))), apply_to = function)
#include "megamoe_reference.h"
#include "router_reference.h"
#pragma clang attribute pop

namespace {

using megamoe::Device;
using megamoe::DType;
using megamoe::QuantElem;
using megamoe::ScaleType;
using megamoe::TensorRef;
using i128 = __int128;

// ---------------------------------------------------------------------------------------
// Limits: what the harness backs with memory and runs. Larger problems are only validated
// (or, when they break a rule, must still be rejected by both calls).

constexpr i128 kMaxSpan = i128{8} << 20;        // bytes of one tensor's span
constexpr i128 kMaxPool = i128{48} << 20;       // bytes of the whole pool
constexpr i128 kMaxNumel = i128{1} << 20;       // elements of one tensor (reference cost)
constexpr int64_t kMaxRunT = int64_t{1} << 16;  // tokens of a call that is run
constexpr i128 kMaxRouterScores = i128{1} << 16;  // T * E of a router call that is run
constexpr int64_t kRed = 64;                    // red-zone bytes around each buffer
constexpr int64_t kPhantom = 64;                // bytes given to a tensor too big to back
// No user address on 64-bit Linux (5-level paging included) reaches 2^57, and none is
// below 0: a span leaving [0, 2^57) cannot be memory the caller owns.
constexpr i128 kAddressLimit = i128{1} << 57;

// The harness' bulk loops (fills, element walks, image compares) carry no coverage
// instrumentation: their branches are data, not decisions, and instrumented they took half
// of each execution. The verdict logic keeps its coverage, so it still guides the fuzzer.
// noinline: inlined into an instrumented caller, a loop would be instrumented after all.
#define MEGAMOE_FUZZ_BULK __attribute__((no_sanitize("coverage"), noinline))

constexpr int kStageSlots = 12;  // the descriptors every input has
constexpr int kSlots = 22;       // and the router's, in the extension block
// clang-format off
enum Slot {
  kHidden, kWeights, kIds, kPad, kGlobal,                    // staging inputs
  kXq, kXsf, kIdxOut, kWOut, kShared, kXScales, kNonfinite,  // staging outputs (nonfinite_count: in/out)
  kLogits, kBias, kTid2eid, kInputIds, kL2p, kReplicas,      // router inputs
  kLoad, kRecord, kRNonfinite, kRPad,                        // (load, router counter: in/out)
};
constexpr const char* kSlotName[kSlots] = {
    "hidden_states", "topk_weights", "topk_ids", "is_padding", "global_scale",
    "x_q", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "x_scales", "nonfinite_count",
    "router_logits", "e_score_correction_bias", "tid2eid", "input_ids", "logical_to_physical_map",
    "logical_replica_count", "expert_load_view", "record_enabled", "nonfinite_count (router)",
    "is_padding (router)"};
// clang-format on

/// The entry point an input calls (extension block; inputs without one call prepare_inputs).
enum Entry : uint8_t { kEntryStage, kEntryRouting, kEntryRoute, kEntryFused };
constexpr const char* kEntryName[4] = {"prepare_inputs", "stage_routing", "route", "route_and_stage"};

// Which slots are outputs depends on the entry: the router writes topk_ids / topk_weights,
// which prepare_inputs and stage_routing read.
bool g_output[kSlots];
bool is_output(int s) { return g_output[s]; }

// ---------------------------------------------------------------------------------------
// Input decoding (little-endian; bytes past the end read as zero).

struct Reader {
  const uint8_t* p;
  size_t n, i = 0;
  uint8_t u8() { return i < n ? p[i++] : (i++, uint8_t{0}); }
  uint32_t u32() {
    uint32_t v = 0;
    for (int b = 0; b < 4; ++b) v |= static_cast<uint32_t>(u8()) << (8 * b);
    return v;
  }
  int64_t i64() {
    uint64_t v = 0;
    for (int b = 0; b < 8; ++b) v |= static_cast<uint64_t>(u8()) << (8 * b);
    return static_cast<int64_t>(v);  // modular: every bit pattern is a value
  }
};

/// One tensor's descriptor (49 bytes); make_corpus.py documents every code.
struct Desc {
  uint8_t dtype, rank, shape, layout, pad, place, misalign, device, fill;
  int64_t a, b, s0, s1, off;
};

struct Input {
  uint8_t mode;
  int64_t T, H, K;
  uint8_t elem, scale, qflags, scale2, rounding;
  uint32_t floor_bits;
  int64_t group_k, group_m, bm;
  // Extension block (mode bit 7): the entry, full-buffer mode, scaling, the router.
  uint8_t entry = kEntryStage, xflags = 0;
  int64_t M = 0;  // max_tokens: rows of every output in full-buffer mode
  uint32_t alpha_bits = 0, ralpha_bits = 0;
  int64_t E = 0, top_k = 0, V = 0, R = 0, P = 0;
  Desc d[kSlots];
  const uint8_t* payload;
  size_t payload_n;
};

// Header bit flags.
constexpr uint8_t kModeRawSizes = 1, kModePadding = 2, kModeShared = 4, kModeBlockM = 8, kModeGlobal = 16,
                  kModeXScales = 32, kModeNonfinite = 64, kModeExtension = 128;
// Extension flags.
constexpr uint8_t kXFullBuffer = 1, kXAlpha = 2, kXBias = 4, kXHash = 8, kXEplb = 16, kXRNonfinite = 32,
                  kXRPad = 64, kXPartial = 128;
constexpr size_t kHeaderBytes = 1 + 3 * 8 + 5 + 4 + 3 * 8;
constexpr size_t kDescBytes = 9 + 5 * 8;
constexpr size_t kExtBytes = 2 + 8 + 2 * 4 + 5 * 8;

Input decode(const uint8_t* data, size_t size) {
  Reader r{data, size};
  Input in{};
  in.mode = r.u8();
  in.T = r.i64();
  in.H = r.i64();
  in.K = r.i64();
  in.elem = r.u8();
  in.scale = r.u8();
  in.qflags = r.u8();
  in.scale2 = r.u8();
  in.rounding = r.u8();
  in.floor_bits = r.u32();
  in.group_k = r.i64();
  in.group_m = r.i64();
  in.bm = r.i64();
  auto read_desc = [&](Desc& d) {
    d.dtype = r.u8();
    d.rank = r.u8();
    d.shape = r.u8();
    d.layout = r.u8();
    d.pad = r.u8();
    d.place = r.u8();
    d.misalign = r.u8();
    d.device = r.u8();
    d.fill = r.u8();
    d.a = r.i64();
    d.b = r.i64();
    d.s0 = r.i64();
    d.s1 = r.i64();
    d.off = r.i64();
  };
  for (int k = 0; k < kStageSlots; ++k) read_desc(in.d[k]);
  static_assert(kHeaderBytes + kStageSlots * kDescBytes == 646, "keep make_corpus.py in step");
  if (in.mode & kModeExtension) {
    in.entry = r.u8() % 4;
    in.xflags = r.u8();
    in.M = r.i64();
    in.alpha_bits = r.u32();
    in.ralpha_bits = r.u32();
    in.E = r.i64();
    in.top_k = r.i64();
    in.V = r.i64();
    in.R = r.i64();
    in.P = r.i64();
    for (int k = kStageSlots; k < kSlots; ++k) read_desc(in.d[k]);
    static_assert(kExtBytes + (kSlots - kStageSlots) * kDescBytes == 548, "keep make_corpus.py in step");
  }
  in.payload = r.i < size ? data + r.i : nullptr;
  in.payload_n = r.i < size ? size - r.i : 0;
  if (!(in.mode & kModeRawSizes)) {
    // Small sizes: most executions then build a problem the harness can run. Router calls
    // get fewer tokens: the reference scores every logit in long double.
    const bool router = in.entry == kEntryRoute || in.entry == kEntryFused;
    auto mod = [](int64_t v, uint64_t m) { return static_cast<int64_t>(static_cast<uint64_t>(v) % m); };
    const uint64_t h = static_cast<uint64_t>(in.H);
    in.T = mod(in.T, router ? 257 : 4097);
    in.H = static_cast<int64_t>((h & 0xFFFFFFFFu) % 65 * 128 + (h >> 32) % 128);
    in.K = mod(in.K, 33);
    in.M = in.T + mod(in.M, 4097);  // max_tokens >= T, up to T + 4096
    in.E = mod(in.E, 513);
    in.top_k = mod(in.top_k, 18);
    in.V = mod(in.V, 65);
    in.R = mod(in.R, 9);
    in.P = mod(in.P, 1025);
  }
  return in;
}

/// i128 -> int64 with wrap-around (the harness builds hostile values on purpose).
int64_t wrap64(i128 v) { return static_cast<int64_t>(static_cast<uint64_t>(v)); }
bool fits64(i128 v) { return v >= INT64_MIN && v <= INT64_MAX; }
i128 abs128(i128 v) { return v < 0 ? -v : v; }

std::string str128(i128 v) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  unsigned __int128 u = neg ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  std::string s;
  while (u != 0) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  }
  return neg ? "-" + s : s;
}

std::string hex8(uint8_t v) {
  char b[8];
  std::snprintf(b, sizeof b, "0x%02x", v);
  return b;
}

// ---------------------------------------------------------------------------------------
// The harness' own view of dtypes (independent of the library's dtype_size).

constexpr int kDTypes = 9;  // kBFloat16 .. kInt8
int64_t elem_size(DType t) {
  switch (t) {
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    default: return 1;  // one-byte types, and codes naming no DType (the library sizes those 1)
  }
}

/// Code 0: the slot's natural dtype; 1..199: DType((code-1) % 9); 200..255: the raw value,
/// which names no DType at all (the validator must reject it by value, not crash).
DType pick_dtype(uint8_t code, DType natural) {
  if (code == 0) return natural;
  if (code >= 200) return static_cast<DType>(code);
  return static_cast<DType>((code - 1) % kDTypes);
}

Device pick_device(uint8_t code) {
  switch (code % 6) {
    case 1: return Device::cuda(0);
    case 2: return Device::cuda(1);
    case 3: return Device{Device::Type::kCPU, 1};
    case 4: return Device::cuda(-1);
    case 5: return Device{static_cast<Device::Type>(7), 0};  // no such device type
    default: return Device::cpu();
  }
}

// ---------------------------------------------------------------------------------------
// Tensor plans.

enum class Kind { kAbsent, kReal, kPhantom, kNull };

struct Plan {
  Kind kind = Kind::kAbsent;
  TensorRef ref;
  int64_t es = 1;
  bool rank_ok = false;  // 0 <= ndim <= 2: the shape/stride fields in use mean something
  bool neg_size = false;
  i128 numel = 0;            // exact, when rank_ok and !neg_size
  bool offsets_fit = false;  // element offsets and byte offsets representable in int64
  i128 lo = 0, hi = 0;       // byte span [lo, hi) relative to data (empty tensors: 0, 0)
  int region = -1;
  i128 rel = 0;         // byte offset of data from its region's origin
  bool absurd = false;  // non-empty and cannot exist in the address space
  bool nonempty() const { return rank_ok && !neg_size && numel > 0; }
};

/// Exact element count, extent and byte span of a plan's TensorRef.
void measure(Plan& p) {
  const TensorRef& t = p.ref;
  p.rank_ok = t.ndim >= 0 && t.ndim <= 2;
  if (!p.rank_ok) return;
  p.numel = 1;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) p.neg_size = true;
    p.numel *= t.shape[d];  // |product| < 2^126: exact
  }
  if (p.neg_size) return;
  if (p.numel == 0) {
    p.offsets_fit = true;  // no elements, no offsets
    return;
  }
  i128 elo = 0, ehi = 0;
  bool fit = true;
  for (int d = 0; d < t.ndim; ++d) {
    const i128 ext = static_cast<i128>(t.shape[d] - 1) * t.strides[d];  // |ext| < 2^126
    fit = fit && fits64(ext);
    (ext < 0 ? elo : ehi) += ext;
  }
  fit = fit && fits64(elo) && fits64(ehi);
  if (!fit) return;  // offsets_fit stays false; bytes are never formed (they could pass 2^127)
  p.lo = elo * p.es;
  p.hi = (ehi + 1) * p.es;
  p.offsets_fit = fits64(p.lo) && fits64(p.hi);
}

/// Distinct indices map to the same element (exact, any strides).
bool self_aliases(const TensorRef& t) {
  if (t.ndim == 1) return t.shape[0] > 1 && t.strides[0] == 0;
  if (t.ndim != 2) return false;
  const int64_t n0 = t.shape[0], n1 = t.shape[1];
  if (n0 <= 0 || n1 <= 0) return false;
  if (n0 > 1 && t.strides[0] == 0) return true;
  if (n1 > 1 && t.strides[1] == 0) return true;
  if (n0 == 1 || n1 == 1) return false;
  // di*s0 + dj*s1 = 0 has a solution with 0 < |di| < n0, |dj| < n1 iff the smallest one,
  // (|s1|/g, |s0|/g) with g = gcd(|s0|, |s1|), fits.
  const unsigned __int128 a = static_cast<unsigned __int128>(abs128(t.strides[0]));
  const unsigned __int128 b = static_cast<unsigned __int128>(abs128(t.strides[1]));
  unsigned __int128 x = a, y = b;
  while (y != 0) {
    const unsigned __int128 r = x % y;
    x = y;
    y = r;
  }
  return b / x < static_cast<unsigned __int128>(n0) && a / x < static_cast<unsigned __int128>(n1);
}

/// The usual sufficient non-overlap test (dims of size > 1 sorted by |stride|, each stride
/// at least the previous one times its size): what a validator may demand of an output
/// without imposing anything the contract forbids.
bool sorted_stride_ok(const TensorRef& t) {
  std::vector<std::pair<i128, i128>> d;
  for (int i = 0; i < t.ndim && i < 2; ++i) {
    if (t.shape[i] > 1) d.emplace_back(abs128(t.strides[i]), t.shape[i]);
  }
  std::sort(d.begin(), d.end());
  i128 need = 1;
  for (const auto& [st, n] : d) {
    if (st < need) return false;
    need = st * n;
  }
  return true;
}

/// A dim of size 1 with stride 0: aliases nothing, but "zero strides" on an output may be
/// refused, so such a call is not required to pass.
bool zero_stride_on_unit_dim(const TensorRef& t) {
  for (int i = 0; i < t.ndim && i < 2; ++i) {
    if (t.shape[i] == 1 && t.strides[i] == 0) return true;
  }
  return false;
}

/// The TensorRef a descriptor asks for, around the slot's natural shape [R, C] (or [R]).
void build_ref(const Desc& d, DType dt, int natural_rank, int64_t R, int64_t C, TensorRef& t) {
  t = TensorRef();
  t.dtype = dt;
  int rank = natural_rank;
  if (d.rank != 0) rank = static_cast<int>((d.rank - 1) % 5) - 1;  // -1, 0, 1, 2, 3
  t.ndim = rank;
  i128 r = R, c = C;
  switch (d.shape % 4) {
    case 1:
      r = d.a;
      c = d.b;
      break;  // explicit
    case 2:
      r = static_cast<i128>(R) + d.a;
      c = static_cast<i128>(C) + d.b;
      break;  // deltas
    case 3:
      if (natural_rank == 2) {
        r = C;
        c = R;
      }
      break;  // swapped
    default: break;
  }
  const i128 pad = d.pad;
  const i128 cols = rank >= 2 ? c : 1;
  i128 s0 = cols, s1 = 1;
  switch (d.layout % 10) {
    case 1: s0 = cols + pad; break;  // padded rows
    case 2:
      s0 = 1;
      s1 = r + pad;
      break;                            // transposed (column-major)
    case 3: s0 = -(cols + pad); break;  // rows reversed
    case 4:
      s0 = cols + pad;
      s1 = -1;
      break;  // columns reversed
    case 5:
      s0 = 2 * cols + pad;
      s1 = 2;
      break;  // every other element
    case 6:
      s0 = 1;
      s1 = (r + 3) / 4 * 4 + pad;
      break;  // MN-major, rows aligned to 4
    case 7:
      s0 = 0;
      s1 = 0;
      break;  // zero strides
    case 8:
      s0 = d.s0;
      s1 = d.s1;
      break;  // explicit
    case 9:
      s0 = 0;
      s1 = 1;
      break;  // one row broadcast
    default: break;
  }
  if (rank == 1) {
    // 1-D: the one stride follows the layout; the unused second fields carry the
    // descriptor's raw numbers, which the library must ignore.
    if (d.layout % 10 == 2 || d.layout % 10 == 6) s0 = 1 + pad;
    t.shape[0] = wrap64(r);
    t.strides[0] = wrap64(s0);
    t.shape[1] = d.b;
    t.strides[1] = d.s1;
    return;
  }
  // Rank 2; and rank 0 or out of range, where every field is garbage the library must not
  // trust.
  t.shape[0] = wrap64(r);
  t.shape[1] = wrap64(c);
  t.strides[0] = wrap64(s0);
  t.strides[1] = wrap64(s1);
}

// ---------------------------------------------------------------------------------------
// The pool: regions of real memory, each between red zones.

struct Region {
  i128 lo = 0, hi = 0;  // byte range relative to the origin (the first member's data)
  int misalign = 0;
  int64_t start = 0;  // pool offset of byte lo
  uint8_t fill = 0;
  std::vector<int> members;
};

MEGAMOE_FUZZ_BULK void fill_red(uint8_t* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(0xC3 ^ (i * 0x9D));
}

/// First index where a and b differ, skipping indices where skip (when given) is nonzero;
/// -1 when none.
MEGAMOE_FUZZ_BULK int64_t first_diff(const uint8_t* a, const uint8_t* b, int64_t n, const uint8_t* skip) {
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] != b[i] && (skip == nullptr || skip[i] == 0)) return i;
  }
  return -1;
}

/// Byte stream for input elements: the payload cycled, or splitmix64 when there is none.
struct DataStream {
  const uint8_t* p;
  size_t n, i = 0;
  uint64_t state;
  MEGAMOE_FUZZ_BULK uint8_t next() {
    if (n != 0) {
      const uint8_t b = p[i];
      i = i + 1 == n ? 0 : i + 1;
      return b;
    }
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint8_t>(z ^ (z >> 31));
  }
};

/// Visit the byte offset (relative to data) of every element of a real, non-empty tensor of
/// rank 0..2 (rank 0: one element at offset 0).
template <typename F>
MEGAMOE_FUZZ_BULK void for_each_element(const TensorRef& t, int64_t es, F&& f) {
  const int64_t rows = t.ndim >= 1 ? t.shape[0] : 1, cols = t.ndim == 2 ? t.shape[1] : 1;
  const int64_t rs = t.ndim >= 1 ? t.strides[0] : 0, cs = t.ndim == 2 ? t.strides[1] : 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) f(i, j, (i * rs + j * cs) * es);
  }
}

// ---------------------------------------------------------------------------------------
// Diagnostics.

std::string g_context;  // what was decoded, for the report of a finding

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "\n=== megamoe fuzz finding ===\n%s\n--- decoded input ---\n%s\n", what.c_str(),
               g_context.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

std::string describe(const Input& in, const Plan* plans, const megamoe::StageArgs& a) {
  const megamoe::QuantScheme& q = a.hidden_quant;
  char floor_text[32];
  std::snprintf(floor_text, sizeof floor_text, "%.9g", static_cast<double>(q.amax_floor));
  std::string s =
      "T=" + std::to_string(a.hidden_states.shape[0]) + " (header " + std::to_string(in.T) +
      ") H=" + std::to_string(in.H) + " K=" + std::to_string(in.K) + " mode=" + std::to_string(in.mode) +
      "\nscheme elem " + std::to_string(in.elem) + " scale " + std::to_string(in.scale) + " group " +
      std::to_string(q.group_m) + "x" + std::to_string(q.group_k) + (q.is_static ? " static" : " dynamic") +
      (q.symmetric ? " symmetric" : " asymmetric") + " scale2 " + std::to_string(in.scale2) + " rounding " +
      std::to_string(in.rounding) + " amax_floor " + floor_text + "\nshared_block_m " +
      (a.shared_block_m ? std::to_string(*a.shared_block_m) : std::string("none")) + "\n";
  for (int k = 0; k < kSlots; ++k) {
    const Plan& p = plans[k];
    if (p.kind == Kind::kAbsent) continue;
    const TensorRef& t = p.ref;
    const char* kind = p.kind == Kind::kReal ? "real" : p.kind == Kind::kNull ? "null" : "phantom";
    s += std::string("  ") + kSlotName[k] + ": " + kind + " dtype " +
         std::to_string(static_cast<int>(t.dtype)) + " ndim " + std::to_string(t.ndim) + " shape (" +
         std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) + ") strides (" +
         std::to_string(t.strides[0]) + ", " + std::to_string(t.strides[1]) + ") device " +
         std::to_string(static_cast<int>(t.device.type)) + ":" + std::to_string(t.device.index) + " span [" +
         str128(p.lo) + ", " + str128(p.hi) + ") region " + std::to_string(p.region) + " rel " +
         str128(p.rel) + (p.absurd ? " ABSURD" : "") + "\n";
  }
  return s;
}

// ---------------------------------------------------------------------------------------
// One API call's outcome.

struct Outcome {
  bool threw = false;
  megamoe::ErrorCode code = megamoe::ErrorCode::kInvalidArgument;
  std::string msg;
};

template <typename F>
Outcome run_api(const char* name, F&& f) {
  Outcome o;
  try {
    f();
  } catch (const megamoe::Error& e) {
    o.threw = true;
    o.code = e.code();
    o.msg = e.what();
    if (o.msg.empty()) finding(std::string(name) + " threw megamoe::Error with an empty message");
  } catch (const std::exception& e) {
    finding(std::string(name) + " let a non-megamoe exception escape: " + e.what());
  } catch (...) {
    finding(std::string(name) + " let a non-std exception escape");
  }
  return o;
}

/// Codes a rejection may carry in a CPU-only build: an invalid argument, a request this
/// build cannot serve (CUDA tensors), host memory running out; never kCuda or kInternal.
void check_code(const char* api, const Outcome& o) {
  const bool ok = o.code == megamoe::ErrorCode::kInvalidArgument ||
                  o.code == megamoe::ErrorCode::kUnsupported || o.code == megamoe::ErrorCode::kOutOfMemory;
  if (!ok) {
    finding(std::string(api) + " threw error code " + std::to_string(static_cast<int>(o.code)) + ": " +
            o.msg);
  }
}

// ---------------------------------------------------------------------------------------

int fuzz_one(const uint8_t* data, size_t size) {
  const Input in = decode(data, size);
  const bool cuda_build = megamoe::has_cuda_backend();

  // ---- Scheme. -------------------------------------------------------------------------
  megamoe::QuantScheme q;
  q.elem = static_cast<QuantElem>(in.elem);
  q.scale = static_cast<ScaleType>(in.scale);
  q.is_static = (in.qflags & 1) != 0;
  q.symmetric = (in.qflags & 2) == 0;
  q.scale2 = static_cast<megamoe::Scale2>(in.scale2);
  q.rounding = static_cast<megamoe::Rounding>(in.rounding);
  if (in.floor_bits != 0) std::memcpy(&q.amax_floor, &in.floor_bits, 4);  // 0: the default
  q.group_k = in.group_k;
  q.group_m = in.group_m;
  const bool fp4 = q.elem == QuantElem::kFloat4E2M1;
  // Scale words are packed four bytes per int32 for UE8M0 and e4m3 scales.
  const bool packed = q.scale == ScaleType::kUE8M0 || q.scale == ScaleType::kFloat8E4M3;
  const bool ue8m0 = q.scale == ScaleType::kUE8M0;
  // Definitely outside every family the contract names (fp8 e4m3 with UE8M0/fp32 scales;
  // MXFP4; NVFP4): the call must be rejected.
  const bool g_ok = q.group_k > 0 && 128 % q.group_k == 0;
  // MXFP8 e5m2: e5m2 values, UE8M0 scales, G = 32 only.
  const bool e5m2 = q.elem == QuantElem::kFloat8E5M2;
  // bf16 pass-through: bf16 elements, no scales, group_k 0 (not modelled: maybe below).
  const bool bf16 = q.elem == QuantElem::kBFloat16 && q.scale == ScaleType::kNone && q.group_k == 0 &&
                    q.group_m == 1 && !q.is_static && q.symmetric && q.scale2 == megamoe::Scale2::kNone &&
                    in.rounding <= 1 && std::isfinite(q.amax_floor) && q.amax_floor >= 0.0f;
  const bool scheme_bad = !bf16 && (
      !(q.elem == QuantElem::kFloat8E4M3 || fp4 || e5m2) || (e5m2 && (!ue8m0 || q.group_k != 32)) ||
      !(q.scale == ScaleType::kUE8M0 || q.scale == ScaleType::kFloat32 ||
        q.scale == ScaleType::kFloat8E4M3) ||
      q.is_static || !q.symmetric || q.group_m != 1 || !g_ok || in.scale2 > 3 || in.rounding > 2 ||
      (!fp4 && (q.scale == ScaleType::kFloat8E4M3 || q.scale2 != megamoe::Scale2::kNone)) ||
      (fp4 && q.scale == ScaleType::kFloat32));
  // The fp8 contract proper (SPEC "Inputs and outputs" .. "Beyond the reference") is
  // modelled in full, acceptance included; for the rest (other amax floors, MXFP4, NVFP4)
  // the library may accept or refuse, and what it writes when it accepts is checked
  // through the reference wherever the reference models the scheme (ref_format below).
  const bool fp8 = !scheme_bad && !fp4 && !e5m2 && !bf16;
  const bool floor_ok = std::isfinite(q.amax_floor) && q.amax_floor >= 0.0f;  // 0: the unit scale
  const bool fp8_plain =
      fp8 && q.amax_floor == 1e-4f &&
      (q.rounding == megamoe::Rounding::kDefault || q.rounding == megamoe::Rounding::kNearestEven);

  // ---- Entry, modes, natural sizes of every slot. ----------------------------------------
  const Entry entry = static_cast<Entry>(in.entry);
  const bool stage_entry = entry == kEntryStage || entry == kEntryFused;    // stages activations
  const bool router_entry = entry == kEntryRoute || entry == kEntryFused;   // runs the router
  const uint8_t xf = in.xflags;
  const bool full_buffer = (xf & kXFullBuffer) != 0 && entry != kEntryRoute;
  std::optional<float> alpha;  // StageArgs / RoutingArgs::routed_scaling_factor
  if ((xf & kXAlpha) && entry != kEntryRoute) {
    float v;
    std::memcpy(&v, &in.alpha_bits, 4);
    alpha = v;
  }
  std::optional<float> ralpha;  // RouterArgs::routed_scaling_factor (0 bits: absent, no scaling)
  if (in.ralpha_bits != 0) {
    float v;
    std::memcpy(&v, &in.ralpha_bits, 4);
    ralpha = v;
  }
  const int64_t T = in.T, H = in.H, K = router_entry ? in.top_k : in.K;
  const int64_t M = full_buffer ? in.M : T;  // rows of the outputs
  const int64_t E = in.E, V = in.V, R = in.R, P = in.P;
  const int64_t G = g_ok ? q.group_k : 32;  // natural widths only; checked below
  const int64_t sf_cols = packed ? H / (4 * G) : H / G;
  i128 required_rows = 0;  // ceil(T / bm) * align(bm, 128), exact
  if (in.bm > 0 && T > 0) {
    required_rows =
        (static_cast<i128>(T) + in.bm - 1) / in.bm * ((static_cast<i128>(in.bm) + 127) / 128 * 128);
  }
  const int64_t nat_shared_rows = required_rows > INT64_MAX ? INT64_MAX : static_cast<int64_t>(required_rows);
  // Per slot (order of Slot): present?, natural dtype, rank, rows and columns.
  const bool padding = (in.mode & kModePadding) != 0;
  const bool hash = (xf & kXHash) != 0, eplb = (xf & kXEplb) != 0, partial = (xf & kXPartial) != 0;
  // clang-format off
  const bool present[kSlots] = {
      stage_entry, true, true,
      (stage_entry || entry == kEntryRouting) && padding,
      stage_entry && (in.mode & kModeGlobal) != 0,
      stage_entry, stage_entry, entry != kEntryRoute, entry != kEntryRoute,
      stage_entry && (in.mode & kModeShared) != 0, stage_entry && (in.mode & kModeXScales) != 0,
      stage_entry && (in.mode & kModeNonfinite) != 0,
      // Router; kXPartial drops one tensor of the hash pair / the EPLB four (a rejection).
      router_entry, router_entry && (xf & kXBias) != 0, router_entry && hash,
      router_entry && hash && !partial, router_entry && eplb, router_entry && eplb,
      router_entry && eplb, router_entry && eplb && !partial,
      router_entry && (xf & kXRNonfinite) != 0, router_entry && (xf & kXRPad) != 0};
  const DType natural_dt[kSlots] = {DType::kBFloat16, DType::kFloat32, DType::kInt64, DType::kBool,
                                    DType::kFloat32, fp4 ? DType::kUInt8 : DType::kFloat8E4M3,
                                    packed ? DType::kInt32 : DType::kFloat32, DType::kInt64,
                                    DType::kFloat32, DType::kInt32, DType::kFloat32, DType::kInt64,
                                    DType::kFloat32, DType::kFloat32, DType::kInt32, DType::kInt64,
                                    DType::kInt32, DType::kInt32, DType::kInt64, DType::kInt32,
                                    DType::kInt64, DType::kBool};
  // clang-format on
  const int natural_rank[kSlots] = {2, 2, 2, 1, 1, 2, 2, 2, 2, 2, 1, 1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1};
  const int64_t nat_rows[kSlots] = {T, T, T, T, 1, M, M, M, M, nat_shared_rows, M, 1,
                                    T, E, V, T, E, E, P, 1, 1, T};
  const int64_t nat_cols[kSlots] = {H, K, K, 0, 0, fp4 ? H / 2 : H, sf_cols, K, K, sf_cols, 0, 0,
                                    E, 0, K, 0, R, 0, 0, 0, 0, 0};
  for (int k = 0; k < kSlots; ++k) {
    g_output[k] = (k >= kXq && k <= kNonfinite) || k == kLoad || k == kRNonfinite ||
                  (router_entry && (k == kIds || k == kWeights)) ||
                  (k == kGlobal && q.scale2 == megamoe::Scale2::kOnline);  // NVFP4 online writes gs
  }

  Plan plans[kSlots];
  for (int k = 0; k < kSlots; ++k) {
    if (!present[k]) continue;
    Plan& p = plans[k];
    const Desc& d = in.d[k];
    build_ref(d, pick_dtype(d.dtype, natural_dt[k]), natural_rank[k], nat_rows[k], nat_cols[k], p.ref);
    p.ref.device = cuda_build ? Device::cpu() : pick_device(d.device);
    p.es = elem_size(p.ref.dtype);
    measure(p);
    p.kind = Kind::kReal;
  }

  // ---- Backing: regions first (sizes relative to their origins). -------------------------
  std::vector<Region> regions;
  i128 pool_need = 0;
  auto new_region = [&](int k, i128 lo, i128 hi) {
    Region r;
    r.lo = lo;
    r.hi = hi;
    r.misalign = in.d[k].misalign % 64;
    r.fill = in.d[k].fill;
    r.members.push_back(k);
    regions.push_back(r);
    plans[k].region = static_cast<int>(regions.size()) - 1;
    plans[k].rel = 0;
    pool_need += (hi - lo) + 2 * kRed + 128;
  };
  for (int k = 0; k < kSlots; ++k) {
    Plan& p = plans[k];
    if (p.kind == Kind::kAbsent) continue;
    const Desc& d = in.d[k];
    // place % 32: 1 = a null pointer (fine only for an empty tensor); 2..13 = inside the
    // buffer of tensor (place % 32 - 2), when that one comes earlier; else its own buffer.
    if (d.place % 32 == 1) {
      p.kind = Kind::kNull;
      continue;
    }
    const bool backable =
        p.rank_ok && !p.neg_size && p.offsets_fit && p.numel <= kMaxNumel && p.hi - p.lo <= kMaxSpan;
    if (!backable || pool_need + (p.hi - p.lo) + 2 * kRed > kMaxPool) {
      p.kind = Kind::kPhantom;  // a small real allocation; the library must not go past it
      p.lo = 0;
      p.hi = 0;
      new_region(k, -kPhantom / 2, kPhantom / 2);
      continue;
    }
    const int host = d.place % 32 >= 2 && d.place % 32 < 2 + kSlots ? d.place % 32 - 2 : -1;
    if (host >= 0 && host < k && plans[host].region >= 0) {
      // Share the host's region at a fuzzed byte offset: every relative position from "ends
      // just before the host's span" to "starts just after it", overlapping ones included.
      const Plan& h = plans[host];
      const i128 hlo = h.kind == Kind::kPhantom ? -kPhantom / 2 : h.lo;
      const i128 hhi = h.kind == Kind::kPhantom ? kPhantom / 2 : h.hi;
      const i128 width = (hhi - hlo) + (p.hi - p.lo) + 1;
      i128 m = static_cast<i128>(d.off) % width;
      if (m < 0) m += width;
      const i128 rel = h.rel + (hlo - p.hi) + m;
      Region& r = regions[static_cast<size_t>(h.region)];
      const i128 lo = std::min(r.lo, rel + p.lo), hi = std::max(r.hi, rel + p.hi);
      if (hi - lo <= 2 * kMaxSpan && pool_need + (hi - lo) - (r.hi - r.lo) <= kMaxPool) {
        pool_need += (hi - lo) - (r.hi - r.lo);
        r.lo = lo;
        r.hi = hi;
        r.members.push_back(k);
        p.region = h.region;
        p.rel = rel;
        continue;
      }
    }
    new_region(k, p.lo, p.hi);
  }

  // Lay out and fill the pool: red zone, region, red zone, region, ..., red zone.
  int64_t cursor = 0;
  for (Region& r : regions) {
    cursor = (cursor + kRed + 63) / 64 * 64 + r.misalign;
    r.start = cursor;
    cursor += static_cast<int64_t>(r.hi - r.lo);
  }
  const int64_t pool_size = cursor + kRed;
  std::unique_ptr<uint8_t[]> pool(new uint8_t[static_cast<size_t>(pool_size)]);
  uint8_t* const base = pool.get();
  fill_red(base, pool_size);
  for (const Region& r : regions) std::memset(base + r.start, r.fill, static_cast<size_t>(r.hi - r.lo));
  for (Plan& p : plans) {
    if (p.kind == Kind::kReal || p.kind == Kind::kPhantom) {
      const Region& r = regions[static_cast<size_t>(p.region)];
      p.ref.data = base + r.start + static_cast<int64_t>(p.rel - r.lo);
    } else if (p.kind == Kind::kNull) {
      p.ref.data = nullptr;
    }
  }
  // Absurd: the span a non-empty tensor describes leaves [0, 2^57) from its actual address.
  for (Plan& p : plans) {
    if (p.kind == Kind::kAbsent || !p.nonempty()) continue;
    if (!p.offsets_fit) {
      p.absurd = true;
      continue;
    }
    Plan tmp;  // the true span (phantoms had theirs cleared for region building)
    tmp.ref = p.ref;
    tmp.es = p.es;
    measure(tmp);
    const i128 addr = static_cast<i128>(reinterpret_cast<uintptr_t>(p.ref.data));
    if (addr + tmp.lo < 0 || addr + tmp.hi > kAddressLimit) p.absurd = true;
    if (p.kind == Kind::kPhantom) {
      p.lo = tmp.lo;
      p.hi = tmp.hi;
    }
  }

  // MEGAMOE_FUZZ_ALIGNED=1 (triage only): skip inputs whose data pointers are not aligned
  // to their element size, to look past an open finding about unaligned loads.
  static const bool aligned_only = std::getenv("MEGAMOE_FUZZ_ALIGNED") != nullptr;
  if (aligned_only) {
    for (const Plan& p : plans) {
      if (p.ref.data != nullptr &&
          reinterpret_cast<uintptr_t>(p.ref.data) % static_cast<uintptr_t>(p.es) != 0) {
        return 0;
      }
    }
  }

  // Input elements (and nonfinite_count's initial value) from the data stream. Inputs may
  // alias one another: the last write wins and the reference reads what is there.
  const uint64_t seed = 0x243F6A8885A308D3ull ^ static_cast<uint64_t>(in.T) * 0x100000001B3ull ^
                        static_cast<uint64_t>(in.H) ^ (static_cast<uint64_t>(in.K) << 17);
  DataStream ds{in.payload, in.payload_n, 0, seed};
  for (int k : {kHidden, kWeights, kIds, kPad, kGlobal, kNonfinite, kLogits, kBias, kTid2eid, kInputIds, kL2p,
                kReplicas, kLoad, kRecord, kRNonfinite, kRPad}) {
    Plan& p = plans[k];
    if (p.kind != Kind::kReal || !p.nonempty() || (is_output(k) && k != kNonfinite && k != kLoad && k != kRNonfinite))
      continue;
    uint8_t* d0 = static_cast<uint8_t*>(p.ref.data);
    // The router's device-side indices (table entries, token ids, physical ids, replica
    // counts) and its record flag: one stream byte each, mostly in range (else every token
    // would be dropped), sometimes just outside it or extreme.
    const int64_t range = k == kTid2eid ? E : k == kInputIds ? V : k == kL2p ? P : k == kReplicas ? R + 1 : 0;
    const bool index = range > 0 || k == kRecord;
    if (index && (p.ref.dtype == DType::kInt32 || p.ref.dtype == DType::kInt64)) {
      for_each_element(p.ref, p.es, [&](int64_t, int64_t, int64_t off) MEGAMOE_FUZZ_BULK {
        const uint8_t b = ds.next();
        int64_t v;
        if (k == kRecord) {
          v = (b & 3) == 0 ? 0 : static_cast<int64_t>(b) << 24;  // nonzero: any value counts
        } else if (b < 0xF0) {
          v = b % range;
        } else {
          const int64_t special[16] = {-1, -2, range, range + 1, INT32_MIN, INT32_MAX, -range, range - 1,
                                       0, 1, 255, 256, int64_t{1} << 32, INT64_MIN, INT64_MAX, -(int64_t{1} << 32)};
          v = special[b - 0xF0];
        }
        if (p.ref.dtype == DType::kInt32) {
          const int32_t v32 = static_cast<int32_t>(v);
          std::memcpy(d0 + off, &v32, 4);
        } else {
          std::memcpy(d0 + off, &v, 8);
        }
      });
      continue;
    }
    for_each_element(p.ref, p.es, [&](int64_t, int64_t, int64_t off) MEGAMOE_FUZZ_BULK {
      for (int64_t b = 0; b < p.es; ++b) {
        uint8_t v = ds.next();
        // Without a payload a mask byte is mostly 0 (not padded), else a nonzero value.
        if ((k == kPad || k == kRPad) && in.payload_n == 0) v = (v & 3) != 0 ? 0 : static_cast<uint8_t>(v | 1);
        d0[off + b] = v;
      }
    });
  }

  megamoe::StageArgs a;
  a.hidden_states = plans[kHidden].ref;
  a.topk_weights = plans[kWeights].ref;
  a.topk_ids = plans[kIds].ref;
  a.x_q = plans[kXq].ref;
  a.x_sf = plans[kXsf].ref;
  a.topk_idx_out = plans[kIdxOut].ref;
  a.topk_weights_out = plans[kWOut].ref;
  if (present[kPad]) a.is_padding = plans[kPad].ref;
  if (present[kShared]) a.shared_x_sf = plans[kShared].ref;
  if (present[kGlobal]) a.global_scale = plans[kGlobal].ref;
  if (present[kXScales]) a.x_scales = plans[kXScales].ref;
  if (present[kNonfinite]) a.nonfinite_count = plans[kNonfinite].ref;
  if (in.mode & kModeBlockM) a.shared_block_m = stage_entry ? std::optional<int64_t>(in.bm) : std::nullopt;
  a.hidden_quant = q;
  a.full_buffer = full_buffer;
  if (entry == kEntryStage) a.routed_scaling_factor = alpha;
  // route_and_stage rejects a staging scaling factor (the router's applies): kXAlpha asks
  // for one there to see it refused.
  if (entry == kEntryFused) a.routed_scaling_factor = alpha;
  megamoe::RoutingArgs ra;
  ra.topk_weights = plans[kWeights].ref;
  ra.topk_ids = plans[kIds].ref;
  ra.topk_idx_out = plans[kIdxOut].ref;
  ra.topk_weights_out = plans[kWOut].ref;
  if (present[kPad]) ra.is_padding = plans[kPad].ref;
  ra.full_buffer = full_buffer;
  ra.routed_scaling_factor = alpha;
  megamoe::RouterArgs rt;
  rt.router_logits = plans[kLogits].ref;
  rt.top_k = in.top_k;
  rt.routed_scaling_factor = ralpha;
  rt.topk_ids = plans[kIds].ref;
  rt.topk_weights = plans[kWeights].ref;
  auto opt = [&](int k) { return present[k] ? std::optional<TensorRef>(plans[k].ref) : std::nullopt; };
  rt.e_score_correction_bias = opt(kBias);
  rt.tid2eid = opt(kTid2eid);
  rt.input_ids = opt(kInputIds);
  rt.logical_to_physical_map = opt(kL2p);
  rt.logical_replica_count = opt(kReplicas);
  rt.expert_load_view = opt(kLoad);
  rt.record_enabled = opt(kRecord);
  rt.nonfinite_count = opt(kRNonfinite);
  rt.is_padding = opt(kRPad);
  if (entry == kEntryFused) {
    // Ignored by route_and_stage: the router's outputs take their place.
    a.topk_ids = TensorRef();
    a.topk_weights = TensorRef();
  }
  g_context = describe(in, plans, a);
  if (in.mode & kModeExtension) {
    char ab[64];
    std::snprintf(ab, sizeof ab, "%.9g / %.9g", alpha ? static_cast<double>(*alpha) : 0.0,
                  ralpha ? static_cast<double>(*ralpha) : 0.0);
    g_context += std::string("entry ") + kEntryName[entry] + " xflags " + std::to_string(xf) + " full_buffer " +
                 std::to_string(full_buffer) + " M " + std::to_string(in.M) + " alpha " +
                 (alpha ? "given" : "none") + " (stage / router: " + ab + ") E " + std::to_string(E) +
                 " top_k " + std::to_string(in.top_k) + " V " + std::to_string(V) + " R " + std::to_string(R) +
                 " P " + std::to_string(P) + "\n";
  }

  // ---- The contract's verdict. ---------------------------------------------------------
  std::string bad;             // first definite violation: the call must be rejected
  std::string unsure;          // first reason the call may be refused although nothing is violated
  bool validate_only = false;  // a non-empty tensor is not backed, or T is too large to run
  bool dropin = false;         // the default scheme with a packed x_q: MXFP4 (SPEC)
  auto violate = [&](const std::string& why) {
    if (bad.empty()) bad = why;
  };
  auto maybe = [&](const std::string& why) {
    if (unsure.empty()) unsure = why;
  };
  auto dtype_in = [&](int k, std::initializer_list<DType> ok) {
    if (std::find(ok.begin(), ok.end(), plans[k].ref.dtype) == ok.end()) {
      violate(std::string(kSlotName[k]) + " has a wrong dtype");
    }
  };
  auto shape2 = [&](int k, i128 r, i128 c) {
    const TensorRef& t = plans[k].ref;
    if (t.ndim != 2)
      violate(std::string(kSlotName[k]) + " is not 2-D");
    else if (t.shape[0] != r || t.shape[1] != c)
      violate(std::string(kSlotName[k]) + " has a wrong shape");
  };
  auto vec = [&](int k, i128 n, std::initializer_list<DType> ok) {
    const TensorRef& t = plans[k].ref;
    if (t.ndim != 1)
      violate(std::string(kSlotName[k]) + " is not 1-D");
    else if (t.shape[0] != n)
      violate(std::string(kSlotName[k]) + " has a wrong length");
    dtype_in(k, ok);
  };
  auto scalar = [&](int k, DType dt) {  // one element: 0-D, [1] or [1, 1]
    const Plan& c = plans[k];
    if (!c.rank_ok || c.neg_size || c.numel != 1) violate(std::string(kSlotName[k]) + " is not one element");
    dtype_in(k, {dt});
  };
  const TensorRef& hs = a.hidden_states;
  int64_t aT = 0, aH = 0, aK = 0, aM = 0, aE = 0;  // aM: rows of the outputs (M, or T)
  bool zero_tokens = false;  // the call returns at once: T == 0 and no full-buffer tail
  bool full_rules = false;   // the call is judged by every rule (not only the early exit's)

  // The top-k rules of prepare_inputs and stage_routing (route_and_stage: the router's
  // outputs are the top-k inputs), full-buffer rows and the scaling factor included.
  auto topk_rules = [&]() {
    const TensorRef& ids = plans[kIds].ref;
    const TensorRef& w = plans[kWeights].ref;
    if (ids.ndim != 2 || w.ndim != 2) {
      violate("topk_ids or topk_weights is not 2-D");
    } else {
      aK = ids.shape[1];
      if (ids.shape[0] != w.shape[0] || ids.shape[1] != w.shape[1]) violate("topk shapes differ");
      if (ids.shape[0] != aT || aK < 0) violate("topk_ids has a wrong shape");
    }
    dtype_in(kIds, {DType::kInt32, DType::kInt64});
    dtype_in(kWeights, {DType::kFloat32, DType::kBFloat16, DType::kFloat16});
    if (present[kPad]) vec(kPad, aT, {DType::kBool, DType::kUInt8});
    aM = aT;
    if (full_buffer) {
      const TensorRef& o = plans[kIdxOut].ref;
      if (o.ndim != 2) {
        violate("topk_idx_out is not 2-D");
      } else {
        aM = o.shape[0];
        if (aM < aT) violate("full buffer: max_tokens (topk_idx_out rows) < T");
      }
    }
    shape2(kIdxOut, aM, aK);
    dtype_in(kIdxOut, {DType::kInt64});
    shape2(kWOut, aM, aK);
    dtype_in(kWOut, {DType::kFloat32});
    if (alpha && !std::isfinite(*alpha)) violate("routed_scaling_factor is not finite");
  };

  // Every staging rule but the top-k ones (SPEC "Argument checking").
  auto stage_rules = [&]() {
    dtype_in(kHidden, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
    if (aH < 0 || aH % 128 != 0) violate("H is not a non-negative multiple of 128");
    if (aH == 0) maybe("H == 0");
    if (scheme_bad) violate("scheme outside every accepted family");
    if (!scheme_bad && packed && (aH / q.group_k) % 4 != 0)
      violate("packed scales with H/G not a multiple of 4");
    if (!scheme_bad && !fp8) maybe("a scheme beyond the fp8 contract (MXFP8 e5m2, MXFP4/NVFP4 family, bf16)");
    if (fp8 && !fp8_plain) maybe("fp8 with a non-default amax floor or tie rule");
    // SPEC: the default scheme with an int8/uint8 x_q of width H/2 means MXFP4 (also at
    // H == 0, where that width is the fp8 one too: the library applies the rule as written).
    const TensorRef& xq = a.x_q;
    dropin = fp8 && ue8m0 && q.group_k == 32 && q.rounding == megamoe::Rounding::kDefault &&
             xq.ndim == 2 && xq.shape[1] == aH / 2 && (xq.dtype == DType::kUInt8 || xq.dtype == DType::kInt8);
    if (dropin) maybe("MXFP4 drop-in (x_q of width H/2)");
    const bool model_quant_outputs = fp8 && !dropin;  // x_q / x_sf shapes modelled exactly
    const int64_t cols = !scheme_bad && !bf16 ? (packed ? aH / (4 * q.group_k) : aH / q.group_k) : 0;
    topk_rules();
    if (a.shared_x_sf.has_value() != a.shared_block_m.has_value()) violate("shared_x_sf xor shared_block_m");
    if (a.shared_x_sf && a.shared_block_m) {
      const int64_t bm = *a.shared_block_m;
      const TensorRef& s = *a.shared_x_sf;
      if (!ue8m0) violate("shared staging without UE8M0 scales");
      if (bm <= 0) {
        violate("shared_block_m <= 0");
      } else {
        const i128 need = (static_cast<i128>(aT) + bm - 1) / bm * ((static_cast<i128>(bm) + 127) / 128 * 128);
        if (s.ndim != 2)
          violate("shared_x_sf is not 2-D");
        else if (s.shape[0] < need)
          violate("shared_x_sf has too few rows (" + str128(need) + " required)");
        else if (!scheme_bad && s.shape[1] != cols)
          violate("shared_x_sf has a wrong width");
      }
      dtype_in(kShared, {DType::kInt32});
    }
    if (model_quant_outputs) {
      shape2(kXq, aM, aH);
      dtype_in(kXq, {DType::kFloat8E4M3, DType::kUInt8});
      shape2(kXsf, aM, cols);
      dtype_in(kXsf, {ue8m0 ? DType::kInt32 : DType::kFloat32});
      // fp8 has no second-level scale: a global_scale or x_scales is at best ignored.
      if (a.global_scale) maybe("global_scale with an fp8 scheme");
      if (a.x_scales) maybe("x_scales with an fp8 scheme");
    } else if (!scheme_bad) {
      maybe("x_q / x_sf / second-level scale tensors of an FP4 format");
    }
    if (a.nonfinite_count) {
      // A counter: one int64 element (0-D, [1] or [1, 1]).
      const Plan& c = plans[kNonfinite];
      if (!c.rank_ok || c.neg_size || c.numel != 1) violate("nonfinite_count is not one element");
      dtype_in(kNonfinite, {DType::kInt64});
    }
  };

  // The router's rules (router.h, validate_router), then for route_and_stage the staging's.
  auto router_rules = [&]() {
    dtype_in(kLogits, {DType::kFloat32, DType::kBFloat16});
    if (aE < 1 || aE > 512) violate("E outside 1..512");
    const int64_t k = in.top_k;
    aK = k;
    if (k < 1 || k > 16 || k > aE) violate("top_k outside 1..min(16, E)");
    if (ralpha && !std::isfinite(*ralpha)) violate("the router's routed_scaling_factor is not finite");
    shape2(kIds, aT, k);
    dtype_in(kIds, {DType::kInt32, DType::kInt64});
    shape2(kWeights, aT, k);
    dtype_in(kWeights, {DType::kFloat32});
    if (present[kTid2eid] != present[kInputIds]) violate("tid2eid without input_ids or the reverse");
    if (present[kTid2eid] && present[kBias]) violate("a hash layer with a selection bias");
    if (present[kTid2eid]) {
      const TensorRef& t = plans[kTid2eid].ref;
      if (t.ndim != 2)
        violate("tid2eid is not 2-D");
      else if (t.shape[0] < 1 || t.shape[1] != k)
        violate("tid2eid has a wrong shape");
      dtype_in(kTid2eid, {DType::kInt32});
    }
    if (present[kInputIds]) vec(kInputIds, aT, {DType::kInt32, DType::kInt64});
    if (present[kBias]) vec(kBias, aE, {DType::kFloat32, DType::kBFloat16});
    const int eplb_given = present[kL2p] + present[kReplicas] + present[kLoad] + present[kRecord];
    if (eplb_given != 0 && eplb_given != 4) violate("EPLB without all four tensors");
    if (present[kL2p]) {
      const TensorRef& t = plans[kL2p].ref;
      if (t.ndim != 2)
        violate("logical_to_physical_map is not 2-D");
      else if (t.shape[0] != aE || t.shape[1] < 1)
        violate("logical_to_physical_map has a wrong shape");
      dtype_in(kL2p, {DType::kInt32});
    }
    if (present[kReplicas]) vec(kReplicas, aE, {DType::kInt32});
    if (present[kLoad]) {
      const TensorRef& t = plans[kLoad].ref;
      if (t.ndim != 1 || t.shape[0] < 0) violate("expert_load_view is not 1-D");
      dtype_in(kLoad, {DType::kInt32, DType::kInt64});
    }
    if (present[kRecord]) scalar(kRecord, DType::kInt32);
    if (present[kRNonfinite]) scalar(kRNonfinite, DType::kInt64);
    if (entry == kEntryRoute) {
      if (present[kRPad]) vec(kRPad, aT, {DType::kBool, DType::kUInt8});
      return;
    }
    if (present[kRPad]) violate("route_and_stage with RouterArgs::is_padding");
    if (alpha) violate("route_and_stage with StageArgs::routed_scaling_factor");
    if (hs.ndim != 2) {
      violate("hidden_states is not 2-D");
      return;
    }
    if (hs.shape[0] != aT) violate("hidden_states rows != router_logits rows");
    aH = hs.shape[1];
    stage_rules();
  };

  int slot0 = kHidden;  // the tensor whose device every other must share
  if (entry == kEntryStage) {
    aT = hs.shape[0];
    aH = hs.shape[1];
    if (hs.ndim != 2) {
      violate("hidden_states is not 2-D");
    } else if (aT < 0) {
      violate("T < 0");
    } else if (aT == 0 && !full_buffer) {
      zero_tokens = true;  // returns at once without error, whatever else is passed
      if (aH < 0) maybe("T == 0 with H < 0");
    } else {
      full_rules = true;
      stage_rules();
    }
  } else if (entry == kEntryRouting) {
    slot0 = kIds;
    const TensorRef& ids = plans[kIds].ref;
    aT = ids.shape[0];
    if (ids.ndim != 2) {
      violate("topk_ids is not 2-D");
    } else if (aT < 0) {
      violate("T < 0");
    } else if (aT == 0 && !full_buffer) {
      zero_tokens = true;
      if (ids.shape[1] < 0) maybe("T == 0 with K < 0");
    } else {
      full_rules = true;
      topk_rules();
    }
  } else {
    slot0 = kLogits;
    const TensorRef& lg = plans[kLogits].ref;
    aT = lg.shape[0];
    aE = lg.shape[1];
    if (lg.ndim != 2) {
      violate("router_logits is not 2-D");
    } else if (entry == kEntryFused && (hs.ndim != 2 || hs.shape[0] != aT)) {
      // Checked before the T == 0 return: [0, E] logits never hide a non-empty batch.
      violate("route_and_stage: hidden_states is not 2-D with the logits' rows");
    } else if (aT < 0) {
      violate("T < 0");
    } else if (aT == 0 && !(entry == kEntryFused && full_buffer)) {
      zero_tokens = true;
      if (aE < 0) maybe("T == 0 with E < 0");
    } else {
      full_rules = true;
      router_rules();
    }
  }
  const Device dev0 = plans[slot0].ref.device;
  // Nothing to do although every rule was checked: T == 0 and an empty full-buffer tail.
  const bool zero_work = zero_tokens || (aT == 0 && aM == 0);
  if (full_rules) {
    for (int k = 0; k < kSlots; ++k) {
      const Plan& p = plans[k];
      if (p.kind == Kind::kAbsent) continue;
      const Device& dv = p.ref.device;
      const std::string nm = kSlotName[k];
      if (dv.type != Device::Type::kCPU && dv.type != Device::Type::kCUDA)
        violate(nm + " has an unknown device type");
      if (dv.type == Device::Type::kCUDA && dv.index < 0) violate(nm + " has a negative CUDA ordinal");
      if (dv.type == Device::Type::kCPU && dv.index != 0) maybe(nm + " on cpu:N, N != 0");
      if (dv != dev0) violate(nm + " on another device than " + kSlotName[slot0]);
      if (!p.rank_ok || p.neg_size) {
        maybe(nm + " has a rank or size the model does not judge");  // a shape rule decides
        continue;
      }
      if (p.nonempty() && p.kind == Kind::kNull) violate(nm + " is null but not empty");
      if (p.absurd) violate(nm + " spans memory outside the address space");
      if (p.kind == Kind::kPhantom && !p.absurd && p.nonempty()) validate_only = true;
      if (is_output(k) && p.nonempty()) {
        if (self_aliases(p.ref))
          violate(nm + " has aliasing strides");
        else if (!sorted_stride_ok(p.ref))
          maybe(nm + " has non-aliasing strides outside the sorted-stride rule");
        if (zero_stride_on_unit_dim(p.ref)) maybe(nm + " has a zero stride on a size-1 dim");
      }
    }
    // Overlap of an output with any other tensor: only tensors sharing a region can meet.
    for (const Region& r : regions) {
      if (r.members.size() < 2) continue;
      bool span_meet = false;  // cheap test first: spans
      for (int i : r.members) {
        for (int j : r.members) {
          const Plan& pi = plans[i];
          const Plan& pj = plans[j];
          if (i == j || !is_output(i) || pi.kind != Kind::kReal || pj.kind != Kind::kReal) continue;
          if (!pi.nonempty() || !pj.nonempty()) continue;
          if (pi.rel + pi.lo < pj.rel + pj.hi && pj.rel + pj.lo < pi.rel + pi.hi) span_meet = true;
        }
      }
      if (!span_meet) continue;
      maybe("an output's span meets another tensor's span");
      // Exact element overlap: mark each byte with one bit per slot.
      std::vector<uint32_t> owner(static_cast<size_t>(r.hi - r.lo), 0);
      uint32_t outs = 0;
      for (int j : r.members) {
        if (is_output(j)) outs = static_cast<uint32_t>(outs | (1u << j));
      }
      for (int k : r.members) {
        const Plan& p = plans[k];
        if (p.kind != Kind::kReal || !p.nonempty()) continue;
        const uint32_t bit = static_cast<uint32_t>(1u << k);
        const int64_t o0 = static_cast<int64_t>(p.rel - r.lo);
        bool hit = false;
        for_each_element(p.ref, p.es, [&](int64_t, int64_t, int64_t off) MEGAMOE_FUZZ_BULK {
          for (int64_t b = 0; b < p.es; ++b) {
            uint32_t& m = owner[static_cast<size_t>(o0 + off + b)];
            const uint32_t others = static_cast<uint32_t>(m & ~bit);
            if (others != 0 && (is_output(k) || (others & outs) != 0)) hit = true;
            m = static_cast<uint32_t>(m | bit);
          }
        });
        if (hit)
          violate(std::string(kSlotName[k]) + " shares an element with another tensor (one an output)");
      }
    }
    if (aT > kMaxRunT) validate_only = true;
    // The router reference scores every logit in long double: bounded work per execution.
    if (router_entry && static_cast<i128>(aT) * aE > kMaxRouterScores) validate_only = true;
  }
  const bool all_cuda = !cuda_build && dev0.type == Device::Type::kCUDA;

  // ---- The calls, red zones poisoned. ----------------------------------------------------
  std::vector<uint8_t> before(base, base + pool_size);
  auto poison = [&](bool on) {
    int64_t prev_end = 0;
    for (const Region& r : regions) {
      if (on)
        ASAN_POISON_MEMORY_REGION(base + prev_end, static_cast<size_t>(r.start - prev_end));
      else
        ASAN_UNPOISON_MEMORY_REGION(base + prev_end, static_cast<size_t>(r.start - prev_end));
      prev_end = r.start + static_cast<int64_t>(r.hi - r.lo);
    }
    if (on)
      ASAN_POISON_MEMORY_REGION(base + prev_end, static_cast<size_t>(pool_size - prev_end));
    else
      ASAN_UNPOISON_MEMORY_REGION(base + prev_end, static_cast<size_t>(pool_size - prev_end));
  };
  auto unchanged = [&](const char* after) {
    const int64_t i = first_diff(base, before.data(), pool_size, nullptr);
    if (i >= 0) {
      finding(std::string(after) + " changed pool byte " + std::to_string(i) + " (" +
              hex8(before[static_cast<size_t>(i)]) + " -> " + hex8(base[i]) + ")");
    }
  };
  const std::string verdict = !bad.empty()      ? "must reject: " + bad
                              : !unsure.empty() ? "either: " + unsure
                              : zero_tokens     ? std::string("must accept: T == 0")
                                                : std::string("must accept");
  g_context += "verdict: " + verdict + (validate_only ? " (validate only)" : "") + "\n";

  // validate() / validate_router() first (stage_routing has no validate-only form).
  const bool has_validate = entry != kEntryRouting;
  auto call_validate = [&]() {
    switch (entry) {
      case kEntryRoute: return run_api("validate_router", [&] { megamoe::validate_router(rt); });
      case kEntryFused: return run_api("validate_router", [&] { megamoe::validate_router(rt, &a); });
      default: return run_api("validate", [&] { megamoe::validate(a); });
    }
  };
  const char* const api = kEntryName[entry];
  auto call = [&]() {
    switch (entry) {
      case kEntryRouting: return run_api(api, [&] { megamoe::stage_routing(ra); });
      case kEntryRoute: return run_api(api, [&] { megamoe::route(rt); });
      case kEntryFused: return run_api(api, [&] { megamoe::route_and_stage(rt, a); });
      default: return run_api(api, [&] { megamoe::prepare_inputs(a); });
    }
  };
  Outcome v;
  // MEGAMOE_FUZZ_VERBOSE=1: what each input decoded to, the verdict and validate()'s answer
  // (to see what a seed exercises: build-fuzz/.../megamoe_fuzz_stage tests/fuzz/corpus/*).
  static const bool verbose = std::getenv("MEGAMOE_FUZZ_VERBOSE") != nullptr;
  if (has_validate) {
    poison(true);
    v = call_validate();
    poison(false);
    if (verbose) {
      std::fprintf(stderr, "%svalidate: %s\n", g_context.c_str(), v.threw ? v.msg.c_str() : "accepted");
    }
    unchanged("validate()");
    if (v.threw) check_code("validate", v);
    if (!bad.empty() && !v.threw) finding("validate() accepted a call that violates the contract: " + bad);
    if (v.threw && bad.empty() && unsure.empty() && (zero_tokens || !validate_only)) {
      finding("validate() rejected a call the contract accepts: " + v.msg);
    }
  } else if (verbose) {
    std::fprintf(stderr, "%s", g_context.c_str());
  }
  const bool surely_valid = has_validate ? !v.threw : bad.empty() && unsure.empty();
  if (all_cuda && surely_valid && !zero_work) {
    // CPU-only build: a valid call on CUDA tensors must be refused (kUnsupported), untouched.
    poison(true);
    const Outcome c = call();
    poison(false);
    unchanged("a call on CUDA tensors");
    if (!c.threw) finding(std::string(api) + "() accepted CUDA tensors in a CPU-only build");
    if (c.code != megamoe::ErrorCode::kUnsupported) {
      finding(std::string(api) + "() on CUDA tensors threw code " + std::to_string(static_cast<int>(c.code)) +
              ": " + c.msg);
    }
    return 0;
  }
  // Unbacked tensors: only a call that must be rejected may reach the call proper.
  if (validate_only && bad.empty()) return 0;

  poison(true);
  const Outcome c = call();
  poison(false);
  if (verbose && !has_validate) std::fprintf(stderr, "%s: %s\n", api, c.threw ? c.msg.c_str() : "accepted");
  if (c.threw) {
    check_code(api, c);
    unchanged("a rejected call");
    if (has_validate && !v.threw) finding("validate() accepted but " + std::string(api) + "() rejected: " + c.msg);
    if (!has_validate && bad.empty() && unsure.empty() && !all_cuda) {
      finding(std::string(api) + "() rejected a call the contract accepts: " + c.msg);
    }
    return 0;
  }
  if (has_validate && v.threw) finding("validate() rejected (" + v.msg + ") but " + api + "() accepted");
  if (!bad.empty()) finding(std::string(api) + "() accepted a call that violates the contract: " + bad);
  if (zero_work) {
    unchanged("a call with nothing to do (T == 0, no full-buffer tail)");
    return 0;
  }

  // ---- Accepted: the expected pool image. --------------------------------------------------
  // expect: the bytes the pool must hold; free: bytes whose value is not predicted (the
  // quantized outputs of formats the reference does not model).
  std::vector<uint8_t> expect = before;
  std::vector<uint8_t> free_byte(static_cast<size_t>(pool_size), 0);
  const int64_t cols = stage_entry ? a.x_sf.shape[1] : 0;
  auto elem_off = [&](int k, int64_t i, int64_t j) MEGAMOE_FUZZ_BULK {
    const TensorRef& t = plans[k].ref;
    const int64_t es = plans[k].es;
    return (static_cast<const uint8_t*>(t.data) - base) +
           ((t.ndim >= 1 ? i * t.strides[0] : 0) + (t.ndim == 2 ? j * t.strides[1] : 0)) * es;
  };
  auto widen = [](DType dt, const uint8_t* p) MEGAMOE_FUZZ_BULK {
    uint16_t h;
    float f;
    if (dt == DType::kBFloat16 || dt == DType::kFloat16) {
      std::memcpy(&h, p, 2);
      return dt == DType::kBFloat16 ? megamoe_ref::bf16_to_float(h) : megamoe_ref::half_to_float(h);
    }
    std::memcpy(&f, p, 4);
    return f;
  };
  auto load_int = [&](int k, int64_t i, int64_t j) MEGAMOE_FUZZ_BULK {
    const uint8_t* pi = before.data() + elem_off(k, i, j);
    if (plans[k].ref.dtype == DType::kInt32) {
      int32_t v32;
      std::memcpy(&v32, pi, 4);
      return static_cast<int64_t>(v32);
    }
    int64_t v64;
    std::memcpy(&v64, pi, 8);
    return v64;
  };
  // The top-k the staging repacks: the inputs, or the router's outputs (router entries).
  std::vector<int64_t> ids(static_cast<size_t>(aT * aK));
  std::vector<float> w(ids.size());
  std::vector<uint8_t> pad(static_cast<size_t>(aT), 0);
  const int pad_slot = entry == kEntryRoute ? kRPad : kPad;
  [&]() MEGAMOE_FUZZ_BULK {
    for (int64_t t = 0; t < aT; ++t) {
      for (int64_t k = 0; k < aK && !router_entry; ++k) {
        ids[static_cast<size_t>(t * aK + k)] = load_int(kIds, t, k);
        w[static_cast<size_t>(t * aK + k)] = widen(plans[kWeights].ref.dtype, before.data() + elem_off(kWeights, t, k));
      }
      if (present[pad_slot]) pad[static_cast<size_t>(t)] = before[static_cast<size_t>(elem_off(pad_slot, t, 0))];
    }
  }();
  auto put = [&](int k, int64_t i, int64_t j, const void* src) MEGAMOE_FUZZ_BULK {
    std::memcpy(expect.data() + elem_off(k, i, j), src, static_cast<size_t>(plans[k].es));
  };
  // Rows 0..T-1 only: full-buffer rows T..M-1 of x_q / x_sf / x_scales stay untouched.
  auto set_free = [&](int k) MEGAMOE_FUZZ_BULK {
    const Plan& p = plans[k];
    if (p.kind != Kind::kReal || !p.nonempty()) return;
    const int64_t o0 = static_cast<const uint8_t*>(p.ref.data) - base;
    for_each_element(p.ref, p.es, [&](int64_t r, int64_t, int64_t off) MEGAMOE_FUZZ_BULK {
      if (r < aT || p.ref.ndim == 0) std::memset(free_byte.data() + o0 + off, 1, static_cast<size_t>(p.es));
    });
  };
  if (router_entry) {
    // The independent router reference over the inputs as the pool held them; its ids and
    // weights are the top-k the staging of route_and_stage repacks.
    megamoe_router_ref::Problem rp;
    rp.T = aT;
    rp.E = aE;
    rp.K = aK;
    rp.alpha = ralpha;
    rp.logits.resize(static_cast<size_t>(aT * aE));
    [&]() MEGAMOE_FUZZ_BULK {
      for (int64_t t = 0; t < aT; ++t) {
        for (int64_t e = 0; e < aE; ++e) {
          rp.logits[static_cast<size_t>(t * aE + e)] =
              widen(plans[kLogits].ref.dtype, before.data() + elem_off(kLogits, t, e));
        }
      }
      if (present[kBias]) {
        for (int64_t e = 0; e < aE; ++e)
          rp.bias.push_back(widen(plans[kBias].ref.dtype, before.data() + elem_off(kBias, e, 0)));
      }
      if (present[kPad] || present[kRPad]) rp.pad = pad;
      if (present[kTid2eid]) {
        rp.V = plans[kTid2eid].ref.shape[0];
        for (int64_t r = 0; r < rp.V; ++r) {
          for (int64_t k = 0; k < aK; ++k) rp.tid2eid.push_back(static_cast<int32_t>(load_int(kTid2eid, r, k)));
        }
        for (int64_t t = 0; t < aT; ++t) rp.input_ids.push_back(load_int(kInputIds, t, 0));
      }
      if (present[kL2p]) {
        rp.R = plans[kL2p].ref.shape[1];
        rp.P = plans[kLoad].ref.shape[0];
        for (int64_t e = 0; e < aE; ++e) {
          for (int64_t r = 0; r < rp.R; ++r) rp.l2p.push_back(static_cast<int32_t>(load_int(kL2p, e, r)));
          rp.replicas.push_back(static_cast<int32_t>(load_int(kReplicas, e, 0)));
        }
        rp.record = load_int(kRecord, 0, 0) != 0;
      }
    }();
    const megamoe_router_ref::Result rr = megamoe_router_ref::route(rp);
    ids = rr.ids;
    w = rr.weights;
    const bool ids32 = plans[kIds].ref.dtype == DType::kInt32;
    [&]() MEGAMOE_FUZZ_BULK {
      for (int64_t t = 0; t < aT; ++t) {
        for (int64_t k = 0; k < aK; ++k) {
          const size_t i = static_cast<size_t>(t * aK + k);
          const int32_t id32 = static_cast<int32_t>(ids[i]);
          put(kIds, t, k, ids32 ? static_cast<const void*>(&id32) : static_cast<const void*>(&ids[i]));
          put(kWeights, t, k, &w[i]);
        }
      }
      // expert_load_view: incremented, wrapping as the device's atomics do.
      for (int64_t i = 0; i < rp.P && rp.record; ++i) {
        const uint64_t n = static_cast<uint64_t>(rr.load[static_cast<size_t>(i)]);
        if (plans[kLoad].ref.dtype == DType::kInt32) {
          const uint32_t v = static_cast<uint32_t>(load_int(kLoad, i, 0)) + static_cast<uint32_t>(n);
          put(kLoad, i, 0, &v);
        } else {
          const uint64_t v = static_cast<uint64_t>(load_int(kLoad, i, 0)) + n;
          put(kLoad, i, 0, &v);
        }
      }
    }();
    if (present[kRNonfinite]) {
      const uint64_t c1 = static_cast<uint64_t>(load_int(kRNonfinite, 0, 0)) + static_cast<uint64_t>(rr.nonfinite);
      put(kRNonfinite, 0, 0, &c1);
    }
  }
  using RF = megamoe_ref::Format;
  std::optional<RF> ref_format;  // the reference's model of the accepted scheme, when it has one
  int64_t nonfinite = 0;
  if (stage_entry) {
    std::vector<float> hidden(static_cast<size_t>(aT * aH));
    [&]() MEGAMOE_FUZZ_BULK {
      for (int64_t t = 0; t < aT; ++t) {
        for (int64_t h = 0; h < aH; ++h) {
          const float x = widen(hs.dtype, before.data() + elem_off(kHidden, t, h));
          hidden[static_cast<size_t>(t * aH + h)] = x;
          nonfinite += std::isfinite(x) ? 0 : 1;
        }
      }
    }();
    const bool ties_rne = q.rounding == megamoe::Rounding::kNearestEven;
    const bool fp4_ttz =
        q.rounding == megamoe::Rounding::kDefault || q.rounding == megamoe::Rounding::kTiesTowardZero;
    if (floor_ok && dropin) {
      ref_format = RF::mxfp4(megamoe_ref::Fp4Ties::kTowardZero, q.amax_floor);
    } else if (floor_ok && e5m2 && (q.rounding == megamoe::Rounding::kDefault || ties_rne)) {
      ref_format = RF::mxfp8_e5m2(q.amax_floor);
    } else if (floor_ok && fp8 && (q.rounding == megamoe::Rounding::kDefault || ties_rne)) {
      ref_format = RF::fp8(ue8m0, q.group_k, q.amax_floor);
    } else if (floor_ok && fp4 && ue8m0 && q.group_k == 32 && q.scale2 == megamoe::Scale2::kNone &&
               (fp4_ttz || ties_rne)) {
      ref_format = RF::mxfp4(ties_rne ? megamoe_ref::Fp4Ties::kNearestEven : megamoe_ref::Fp4Ties::kTowardZero,
                             q.amax_floor);
    } else if (floor_ok && fp4 && q.scale == ScaleType::kFloat8E4M3 && q.group_k == 16 && fp4_ttz &&
               q.scale2 == megamoe::Scale2::kPerToken) {
      ref_format = RF::nvfp4_per_token(q.amax_floor);
    } else if (floor_ok && fp4 && q.scale == ScaleType::kFloat8E4M3 && q.group_k == 16 && fp4_ttz &&
               q.scale2 == megamoe::Scale2::kOnline) {
      ref_format = RF::nvfp4_online(q.amax_floor);
    } else if (fp4 && q.scale == ScaleType::kFloat8E4M3 && q.group_k == 16 && fp4_ttz &&
               q.scale2 == megamoe::Scale2::kStatic && a.global_scale && plans[kGlobal].kind == Kind::kReal &&
               plans[kGlobal].nonempty() && plans[kGlobal].ref.dtype == DType::kFloat32) {
      // Only a finite positive gs: SPEC's clamp of a NaN quotient is not pinned down.
      float gs;
      std::memcpy(&gs, before.data() + elem_off(kGlobal, 0, 0), 4);
      if (std::isfinite(gs) && gs > 0.0f) ref_format = RF::nvfp4_static(gs);
    }
    if (ref_format) {
      const RF& rf = *ref_format;
      const int64_t qc = rf.q_cols(aH), sc = rf.sf_cols(aH);
      if (a.x_q.shape[1] != qc || cols != sc) {
        finding("accepted x_q / x_sf widths " + std::to_string(a.x_q.shape[1]) + " / " + std::to_string(cols) +
                " where the format has " + std::to_string(qc) + " / " + std::to_string(sc));
      }
      const megamoe_ref::Result ref = megamoe_ref::stage(hidden.data(), aT, aH, ids.data(), w.data(), aK,
                                                         a.is_padding ? pad.data() : nullptr, rf);
      if (ref.nonfinite != nonfinite)
        finding("the reference and the harness count non-finite values differently");
      const bool words = rf.packed_scales();
      [&]() MEGAMOE_FUZZ_BULK {
        for (int64_t t = 0; t < aT; ++t) {
          for (int64_t h = 0; h < qc; ++h) put(kXq, t, h, &ref.x_q[static_cast<size_t>(t * qc + h)]);
          for (int64_t s = 0; s < sc; ++s) {
            const size_t i = static_cast<size_t>(t * sc + s);
            put(kXsf, t, s,
                words ? static_cast<const void*>(&ref.sf_words[i]) : static_cast<const void*>(&ref.sf_f32[i]));
          }
          if (!ref.x_scales.empty() && a.x_scales) put(kXScales, t, 0, &ref.x_scales[static_cast<size_t>(t)]);
        }
      }();
      // x_scales passed to a format without per-token scales: nothing says what happens to it.
      if (a.x_scales && ref.x_scales.empty()) set_free(kXScales);
      if (is_output(kGlobal) && aT > 0 && plans[kGlobal].kind == Kind::kReal && plans[kGlobal].nonempty()) {
        put(kGlobal, 0, 0, &ref.global_scale);  // NVFP4 online's gs
      }
    } else {
      set_free(kXq);
      set_free(kXsf);
      if (a.x_scales) set_free(kXScales);
      if (is_output(kGlobal)) set_free(kGlobal);
    }
  }
  // Top-k repack (SPEC "Top-k repack"), the same for every format: padded tokens and
  // full-buffer tail rows -1 / +0.0, kept weights fl(w * alpha) with NaN bits kept; a NaN
  // the product makes (+-Inf times 0) is 0x7FC00000 (include/megamoe/stage.h), not the
  // host's default NaN (0xFFC00000 on x86).
  if (entry != kEntryRoute && aK > 0) {  // K == 0: no element, whatever M is
    [&]() MEGAMOE_FUZZ_BULK {
      for (int64_t t = 0; t < aM; ++t) {
        const bool padded = t >= aT || (present[kPad] && pad[static_cast<size_t>(t)] != 0);
        for (int64_t k = 0; k < aK; ++k) {
          const int64_t id = padded ? -1 : ids[static_cast<size_t>(t * aK + k)];
          float wt = padded ? 0.0f : w[static_cast<size_t>(t * aK + k)];
          if (!padded && alpha && !std::isnan(wt)) {
            wt = megamoe_router_ref::mul32(wt, *alpha);
            if (std::isnan(wt)) wt = megamoe_router_ref::nan_out();
          }
          put(kIdxOut, t, k, &id);
          put(kWOut, t, k, &wt);
        }
      }
    }();
  }
  if (stage_entry && a.nonfinite_count) {
    uint64_t c0;
    std::memcpy(&c0, before.data() + elem_off(kNonfinite, 0, 0), 8);
    const uint64_t c1 = c0 + static_cast<uint64_t>(nonfinite);  // the caller's counter, added to
    put(kNonfinite, 0, 0, &c1);
  }
  if (stage_entry && a.shared_x_sf) {
    // Mapped rows: a copy of the token's x_sf row (the reference's, or, for formats it does
    // not model, what the library wrote there); unmapped rows keep their bytes.
    [&]() MEGAMOE_FUZZ_BULK {
      for (int64_t t = 0; t < aT; ++t) {
        const int64_t row = megamoe_ref::shared_row(t, *a.shared_block_m);
        for (int64_t s = 0; s < cols; ++s) {
          std::memcpy(expect.data() + elem_off(kShared, row, s),
                      (ref_format ? expect.data() : base) + elem_off(kXsf, t, s), 4);
        }
      }
    }();
  }
  // Name a pool byte: which tensor's element, or a gap/red zone.
  auto where = [&](int64_t i) {
    std::string w0 = "a red zone or gap";
    for (int k = 0; k < kSlots; ++k) {
      const Plan& p = plans[k];
      if (p.kind != Kind::kReal || !p.nonempty()) continue;
      const int64_t o0 = static_cast<const uint8_t*>(p.ref.data) - base;
      for_each_element(p.ref, p.es, [&](int64_t r, int64_t cc, int64_t off) MEGAMOE_FUZZ_BULK {
        if (i >= o0 + off && i < o0 + off + p.es) {
          w0 = std::string(kSlotName[k]) + "[" + std::to_string(r) + ", " + std::to_string(cc) + "] byte " +
               std::to_string(i - o0 - off);
        }
      });
    }
    return w0;
  };
  const int64_t i = first_diff(base, expect.data(), pool_size, free_byte.data());
  if (i >= 0) {
    finding("accepted call: pool byte " + std::to_string(i) + " (" + where(i) + ") is " + hex8(base[i]) +
            ", expected " + hex8(expect[static_cast<size_t>(i)]) + " (was " +
            hex8(before[static_cast<size_t>(i)]) + ")");
  }
  if (entry == kEntryFused) {
    // router.h: the bytes of route_and_stage are those of route() then prepare_inputs()
    // with the router's outputs as the top-k inputs; every byte, the formats the reference
    // does not model included. Both calls must accept what the fused call accepted.
    const std::vector<uint8_t> fused(base, base + pool_size);
    std::memcpy(base, before.data(), static_cast<size_t>(pool_size));
    megamoe::RouterArgs r2 = rt;
    r2.is_padding = a.is_padding;
    megamoe::StageArgs s2 = a;
    s2.topk_ids = rt.topk_ids;
    s2.topk_weights = rt.topk_weights;
    poison(true);
    const Outcome c1 = run_api("route", [&] { megamoe::route(r2); });
    const Outcome c2 = c1.threw ? c1 : run_api("prepare_inputs", [&] { megamoe::prepare_inputs(s2); });
    poison(false);
    if (c1.threw || c2.threw) finding("route_and_stage() accepted, route() + prepare_inputs() rejected: " + c2.msg);
    const int64_t j = first_diff(base, fused.data(), pool_size, nullptr);
    if (j >= 0) {
      finding("route_and_stage() and route() + prepare_inputs() differ at pool byte " + std::to_string(j) + " (" +
              where(j) + "): " + hex8(fused[static_cast<size_t>(j)]) + " vs " + hex8(base[j]));
    }
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return fuzz_one(data, size); }
