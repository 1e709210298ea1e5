// megamoe_stage.cpp: the megamoe-stage CLI. Stages DeepSeek-V4-shaped (or file-provided)
// inputs with megamoe::prepare_inputs on the CPU or a CUDA device (or, with --rmsnorm-weight,
// normalizes and stages them with megamoe::rmsnorm_and_stage), times it, measures the
// quantization quality and compares every output bitwise with the independent reference
// (reference_check.h; in builds with MEGAMOE_CLI_REFERENCE). Public API only.
//
// Exit status: 0 = outputs match the reference (or, without the reference check, a
// successful run), 1 = mismatch, 2 = usage, input or runtime error.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cuda_buffers.h"
#include "megamoe/megamoe.h"
#include "megamoe/cpu.h"
#include "megamoe/plan.h"
#include "norm_inputs.h"
#include "reference_check.h"
#include "stage_check.h"
#include "stage_inputs.h"

namespace megamoe_cli {
namespace {

using ojson = nlohmann::ordered_json;

struct Options {
  GenOptions gen;
  std::string scheme = "mxfp8";
  int64_t shared_block_m = 0;
  bool has_shared = false;
  std::string device = "auto";
  int iters = 0;  // 0 = auto
  bool explain = false;  // --explain: print megamoe::explain of the call
  bool explain_only = false;  // --explain without --iters: print the plan, run nothing
  int threads = 0;  // --threads: CPU staging threads, 0 = every CPU
  std::optional<float> amax_floor;    // --amax-floor, else the scheme's (1e-4)
  std::optional<float> global_scale;  // --global-scale (nvfp4-static), else max|x| / 2688
  bool full_buffer = false;           // --full-buffer
  int64_t max_tokens = 0;             // --max-tokens: M, the full buffer's rows
  std::string input, output, save_inputs;
  bool json = false;
  bool router = false;  // --router: the fused DeepSeek-V4 router
  float routed_scaling_factor = 1.5f;
  std::string logits_dtype = "bf16";
  // The norm form (--rmsnorm-weight): megamoe::rmsnorm_and_stage in place of prepare_inputs.
  std::string rmsnorm_weight;       // --rmsnorm-weight: its spec (norm_inputs.h); empty: not the norm form
  std::string residual;             // --residual: its spec; empty: no residual
  float eps = 1e-6f;                // --eps
  bool write_y = false;             // --write-y
  bool write_residual_out = false;  // --write-residual-out
  bool norm() const { return !rmsnorm_weight.empty(); }
};

const std::map<std::string, megamoe::QuantScheme>& schemes() {
  static const std::map<std::string, megamoe::QuantScheme> m = {
      {"mxfp8", megamoe::QuantScheme::mxfp8()},
      {"ue8m0-g128", megamoe::QuantScheme::fp8_ue8m0_g128()},
      {"fp32-g128", megamoe::QuantScheme::fp8_fp32_g128()},
      // DeepGEMM's SM90 MegaMoE pre-dispatch (and SGLang's kernels) floor the amax at 1e-10.
      {"fp32-g128-sm90", megamoe::QuantScheme::fp8_fp32_g128().with_amax_floor(1e-10f)},
      {"fp32-g32", megamoe::QuantScheme::fp8_fp32_g32()},
      {"mxfp8-e5m2", megamoe::QuantScheme::mxfp8_e5m2()},
      {"mxfp4", megamoe::QuantScheme::mxfp4()},
      {"mxfp4-rne", megamoe::QuantScheme::mxfp4(megamoe::Rounding::kNearestEven)},
      {"nvfp4-static", megamoe::QuantScheme::nvfp4_static()},
      {"nvfp4-per-token", megamoe::QuantScheme::nvfp4_per_token()},
      {"bf16", megamoe::QuantScheme::bf16()},
      {"nvfp4-online", megamoe::QuantScheme::nvfp4_online()}};
  return m;
}

const char* kFooter = R"(Inputs (without --input): hidden_states [T, H] bf16 = bf16(randn * 17) (std::mt19937
seeded with --seed, std::normal_distribution; the exact values depend on the C++ standard
library), topk_ids [T, K] int32 = K distinct experts in [0, --experts) per token,
topk_weights [T, K] fp32 uniform in [0.01, 1), is_padding [T] bool with token t padded
when (t + 1) % --pad-every == 0 (no is_padding tensor when --pad-every is 0).

Safetensors tensors read by --input (and written by --save-inputs):
  hidden_states [T, H] BF16/F16/F32, topk_ids [T, K] I32/I64,
  topk_weights [T, K] F32/BF16/F16, is_padding [T] BOOL/U8 (optional; nonzero = padded).
Written by --output: x_fp8 [T, H] F8_E4M3 (mxfp8-e5m2: F8_E5M2; bf16: BF16; fp4 schemes:
x_q [T, H/2] U8, column 2j in the low nibble of byte j), x_sf [T, H/(4G)] I32 (UE8M0 or,
for nvfp4, e4m3 bytes packed little-endian, 4 per word), [T, H/G] F32 or [T, 0] (bf16),
x_scales [T] F32
(nvfp4-per-token), topk_idx_out [T, K] I64, topk_weights_out [T, K] F32, and shared_x_sf
[R, H/(4G)] I32 with --shared-block-m (rows no token maps to are 0); with --full-buffer
every output has --max-tokens rows. Its __metadata__ (and that of --save-inputs) names
the scheme (megamoe::scheme_name), group size, tie rule, amax floor and megamoe version;
--input reports a file's __metadata__ when it has one.

Report:
  time       median wall time of --iters calls after one warmup call (CUDA: event pairs
             around each call on one stream; CPU: steady_clock around each call).
  bandwidth  bytes / time, bytes = T*H*(input element size) + T*H (fp8) + scale bytes
             (x_sf, plus shared_x_sf copies) + T*K*(id bytes + weight bytes + 8 + 4)
             + T (is_padding, when present); fp4: T*H/2 for x_q, plus x_scales / the
             4-byte global_scale for nvfp4; --full-buffer: the top-k outputs' M rows
             (M*K*(8 + 4)), the activation outputs' T rows (the rest is not written).
  SNR        10*log10(sum x^2 / sum (x - deq)^2) over every finite input element x, where
             deq = value(x_q) * (scale of its group): e4m3, e5m2 or e2m1 value times
             2^(e-127) (UE8M0), the fp32 scale, or the e4m3 scale times global_scale /
             x_scales[t] (nvfp4); "inf" when deq == x everywhere.
  max relative error
             max |x - deq| / |x| over the finite elements x the format resolves. fp8
             schemes: elements with |x| > 1e-3 * amax, amax being the largest finite |x|
             of the element's group of G values (smaller elements would be dominated by
             fp8's absolute resolution); at most 2^-4 for fp8 e4m3 (2^-3 for e5m2,
             mxfp8-e5m2) unless amax is below the 1e-4 floor. fp4 schemes (mxfp4*,
             nvfp4-*): elements with |x| >= 0.5 * the group's dequantized scale, e2m1's
             smallest nonzero magnitude there (smaller elements round to 0 or to it, an
             error of up to 1 in any encoder, and count in the SNR only); about 1/3 at
             most (at 0.75 * scale) unless an nvfp4 e4m3 scale is too small for its group.
  reference  every output compared bitwise with tests/reference/megamoe_reference.h
             (shared_x_sf rows through megamoe_ref::shared_row): "bit-exact match" or the
             first mismatch (tensor, [row, col], megamoe's bits, the reference's bits).

With --router (the fused DeepSeek-V4 router, megamoe::route_and_stage): router_logits
[T, E] (--logits-dtype, default bf16) = randn * 2 and e_score_correction_bias [E] fp32 =
randn * 0.5 (std::mt19937 seeded with --seed + 1), E = --experts (<= 512), K = --topk
(<= 16), routed scaling --routed-scaling-factor (default 1.5). The router picks the K
largest sqrt(softplus(logit)) + bias per token and writes topk_ids [T, K] int32 and
topk_weights [T, K] fp32; the staging uses them in place of generated top-k inputs (one
launch on CUDA). Reported in addition: "router" = route() alone per call, and "router
reference" = topk_ids / topk_weights compared bitwise with
tests/reference/router_reference.h; "reference" then checks the staged outputs against
the staging reference fed with the router reference's ids and weights. --output also
writes topk_ids and topk_weights. --router excludes --input and --save-inputs.

With --rmsnorm-weight (the norm form, megamoe::rmsnorm_and_stage in place of prepare_inputs):
hidden_states (BF16) is the norm's x; the call adds --residual when given (z = bf16(x +
residual), else z = x), normalizes every row (y = bf16(bf16(z * s) * weight), s = 1 /
sqrt(mean(z^2) + --eps); every rounding point in docs/CONTRACT.md "RMSNorm and stage") and
stages y in place of hidden_states, with every scheme and option above. A weight or a
residual is: ones (weight only) or random (generated: weight bf16 of uniform [0.5, 1.5),
residual bf16(randn * 17), std::mt19937 seeded with --seed + 2 and --seed + 3), the name of
a tensor of the --input file, a safetensors FILE (its only tensor, or the one named
rmsnorm_weight / residual) or FILE:TENSOR; weight [H] BF16/F32, residual [T, H] BF16.
--write-y and --write-residual-out make the call write y and the new residual z; --output
then writes them as y and residual_out [T, H] BF16 beside the staged outputs, and
--save-inputs writes the weight and residual as rmsnorm_weight and residual.
Reported in addition: "norm" (weight, residual, eps, the outputs the call writes);
"stage check" = every staged output compared bitwise with megamoe::prepare_inputs (CPU
backend) applied to the call's y (without --write-y, the y of one more call that writes
it; exit 1 on a difference, in every build); "norm reference" = y and residual_out
compared bitwise with tests/reference/norm_reference.h; "reference" then checks the staged
outputs against the staging reference of the norm reference's y. SNR and max relative
error compare with y; bytes add the residual, the weight, y and residual_out.
nvfp4-static needs --global-scale here (its default reads the staged rows, which the call
computes). --rmsnorm-weight excludes --router.

Exit status: 0 bit-exact match, 1 mismatch with the reference, 2 usage, input or runtime
error (the message names the file, tensor, what was expected and what was got).)";

/// The end of --help in a build without the reference check.
const char* kNoReferenceFooter = R"(

This build has no reference check (CMake option MEGAMOE_CLI_REFERENCE off): "reference"
and "router reference" read "not compiled in", and the exit status is 0 unless an error
occurred.)";

/// Validator of an integer flag: a decimal integer in [lo, hi]. It rewrites the text to
/// canonical form because CLI11's own conversion (strtoll, base 0) saturates out-of-range
/// values to INT64_MAX and reads "010" as octal 8.
CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  auto check = [lo, hi, range](std::string& s) -> std::string {
    int64_t v = 0;
    const char* end = s.data() + s.size();
    const auto [p, ec] = std::from_chars(s.data(), end, v);
    if (ec == std::errc::result_out_of_range) return "value " + s + " is out of range " + range;
    if (ec != std::errc() || p != end) return "expected a decimal integer, got '" + s + "'";
    if (v < lo || v > hi) return "value " + s + " is out of range " + range;
    s = std::to_string(v);
    return {};
  };
  // The help text's type column: "INT:>= 0", "INT:in [1, 2147483647]", or plain "INT".
  std::string desc;
  if (lo != INT64_MIN) desc = hi == INT64_MAX ? ">= " + std::to_string(lo) : "in " + range;
  return CLI::Validator(check, desc);
}

/// Validator of -H: integer_in's parsing, but a size <= 0 gets a plain message instead of
/// the range [1, 9223372036854775807]; a positive size that is not a multiple of 128 is left
/// to megamoe::validate, whose message --input files get too.
CLI::Validator hidden_size() {
  const CLI::Validator parse = integer_in(INT64_MIN, INT64_MAX);
  auto check = [parse](std::string& s) -> std::string {
    const std::string bad = parse(s);
    if (!bad.empty()) return bad;
    // CLI11 puts "--hidden: " in front of the message.
    if (s[0] == '-' || s == "0") return "expected a positive multiple of 128, got " + s;
    return {};
  };
  return CLI::Validator(check, "> 0, a multiple of 128");
}

/// @p j as indented text; bytes that are not UTF-8 (a file name, say) become U+FFFD
/// instead of throwing.
std::string dump(const ojson& j) { return j.dump(2, ' ', false, ojson::error_handler_t::replace); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char* dtype_label(const std::string& st) {
  static const std::map<std::string, const char*> m = {
      {"BF16", "bfloat16"}, {"F16", "float16"}, {"F32", "float32"}, {"I32", "int32"},
      {"I64", "int64"},     {"BOOL", "bool"},   {"U8", "uint8"}};
  auto it = m.find(st);
  return it == m.end() ? st.c_str() : it->second;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// The router's limits as include/megamoe/router.h states them (E in 1..512, K in 1..16),
/// checked before the [T, E] logits are generated; the library checks them again.
constexpr int64_t kRouterMaxExperts = 512;
constexpr int64_t kRouterMaxTopk = 16;

/// Generated inputs of at least this many elements (T * H) get a progress line.
constexpr int64_t kProgressElements = int64_t{1} << 20;

/// The progress line: one line on stderr, rewritten in place ("\r", erase to the end) and
/// erased before the report or an error message is printed.
struct Progress {
  bool on = false;
  void step(const std::string& what) const {
    if (on) std::cerr << "\r\033[Kmegamoe-stage: " << what << "..." << std::flush;
  }
  void clear() const {
    if (on) std::cerr << "\r\033[K" << std::flush;
  }
  void done() {
    clear();
    on = false;
  }
  ~Progress() { done(); }
};

/// The safetensors __metadata__ of --output and --save-inputs: what a reader needs to
/// decode the file without this command line.
std::map<std::string, std::string> format_metadata(const megamoe::QuantScheme& q, const Options& o) {
  const bool fp4 = q.elem == megamoe::QuantElem::kFloat4E2M1;
  const bool rne = fp4 ? q.rounding == megamoe::Rounding::kNearestEven : q.rounding != megamoe::Rounding::kTiesTowardZero;
  return {{"scheme", megamoe::scheme_name(q)},
          {"cli_scheme", o.scheme},
          {"group_size", std::to_string(q.group_k)},
          {"tie_rule", rne ? "nearest-even" : "toward-zero"},
          {"amax_floor", fmt("%.9g", q.amax_floor)},
          {"megamoe_version", megamoe::version()}};
}

/// Allocate the outputs for @p in under scheme @p q (shapes from the contract; invalid
/// requests still get buffers so that megamoe::validate can name the problem).
StageOutputs make_outputs(const StageInputs& in, const megamoe::QuantScheme& q, const Options& o) {
  const int64_t T = in.T(), H = in.H(), K = in.K(), G = q.group_k > 0 ? q.group_k : 1;
  const int64_t cols = q.ue8m0() ? H / (4 * G) : H / G;
  StageOutputs out;
  out.scheme = q;
  // The library's one shape rule; a request it rejects gets the fp8-sized buffers below,
  // so that megamoe::validate names the problem with the contract's message.
  std::optional<megamoe::OutputShapes> shapes;
  try {
    shapes = megamoe::output_shapes(T, H, K, q, o.has_shared ? std::optional<int64_t>(o.shared_block_m) : std::nullopt);
  } catch (const megamoe::Error&) {
  }
  if (shapes) {
    // Full-buffer mode: every output gets M rows; rows T..M-1 start as kUntouchedByte, which
    // the x outputs must keep and the top-k outputs must overwrite (the check says which).
    const int64_t M = o.full_buffer ? o.max_tokens : T;
    auto alloc = [&](const megamoe::TensorSpec& spec, const char* name) {
      static const std::map<megamoe::DType, const char*> st = {
          {megamoe::DType::kFloat8E4M3, "F8_E4M3"}, {megamoe::DType::kFloat8E5M2, "F8_E5M2"},
          {megamoe::DType::kUInt8, "U8"},           {megamoe::DType::kInt32, "I32"},
          {megamoe::DType::kFloat32, "F32"},        {megamoe::DType::kInt64, "I64"},
          {megamoe::DType::kBFloat16, "BF16"}};
      std::vector<int64_t> shape = {M};
      if (spec.ndim == 2) shape.push_back(spec.shape[1]);
      Tensor t(st.at(spec.dtype), shape, std::string("output '") + name + "'");
      if (M > T) std::fill(t.data.begin() + static_cast<std::ptrdiff_t>(t.data.size() / M * T), t.data.end(), kUntouchedByte);
      return t;
    };
    out.x_fp8 = alloc(shapes->x_q, q.elem == megamoe::QuantElem::kFloat4E2M1 ? "x_q" : "x_fp8");
    out.x_sf = alloc(shapes->x_sf, "x_sf");
    out.topk_idx_out = alloc(shapes->topk_idx_out, "topk_idx_out");
    out.topk_weights_out = alloc(shapes->topk_weights_out, "topk_weights_out");
    if (shapes->x_scales) out.x_scales = alloc(*shapes->x_scales, "x_scales");
    if (shapes->shared_x_sf) {
      const megamoe::TensorSpec& sh = *shapes->shared_x_sf;
      out.shared_x_sf = Tensor("I32", {sh.shape[0], sh.shape[1]}, "output 'shared_x_sf'");
      out.shared_block_m = o.shared_block_m;
    }
    out.full_buffer_rows = o.full_buffer ? M : 0;
    return out;
  }
  out.x_fp8 = Tensor("F8_E4M3", {T, H}, "output 'x_fp8'");
  out.x_sf = Tensor(q.ue8m0() ? "I32" : "F32", {T, cols}, "output 'x_sf'");
  out.topk_idx_out = Tensor("I64", {T, K}, "output 'topk_idx_out'");
  out.topk_weights_out = Tensor("F32", {T, K}, "output 'topk_weights_out'");
  if (o.has_shared) {
    const int64_t bm = o.shared_block_m;
    int64_t rows = 0;  // bm <= 0: megamoe::validate rejects it with the contract's message
    if (bm > 0) {
      // ceil(a / b) without forming a + b - 1, which wraps for a bm near INT64_MAX; the
      // product is checked.
      auto ceil_div = [](int64_t a, int64_t b) { return a == 0 ? 0 : (a - 1) / b + 1; };
      rows = checked_value(Checked(ceil_div(T, bm)) * ceil_div(bm, 128) * 128,
                           "--shared-block-m " + std::to_string(bm) + ": the shared_x_sf row count ceil(" +
                               std::to_string(T) + " / bm) * round_up(bm, 128)");
    }
    out.shared_x_sf = Tensor("I32", {rows, cols}, "output 'shared_x_sf'");
    out.shared_block_m = bm;
  }
  return out;
}

/// Bytes one call moves (see the footer): every input and output buffer once, plus the
/// x_sf copy written to shared_x_sf (one I32 row per token, so x_sf's own byte count). In
/// full-buffer mode the activation outputs (x_q, x_sf, x_scales, the shared copy) are
/// written for the T tokens' rows only, the top-k outputs for all M rows.
int64_t bytes_per_call(const StageInputs& in, const StageOutputs& out) {
  Checked b = 0;
  const int64_t T = in.T();
  // Bytes of @p t's first T rows (rows of equal size; t has at least T rows).
  auto token_rows = [&](const Tensor& t) -> int64_t {
    const int64_t rows = t.shape.empty() ? 0 : t.shape[0];
    return rows == 0 ? 0 : static_cast<int64_t>(t.data.size()) / rows * T;
  };
  for (const Tensor* t : {&in.hidden_states, &in.topk_ids, &in.topk_weights, &out.topk_idx_out, &out.topk_weights_out}) {
    b = b + static_cast<int64_t>(t->data.size());
  }
  b = b + token_rows(out.x_fp8) + token_rows(out.x_sf);
  if (in.is_padding) b = b + static_cast<int64_t>(in.is_padding->data.size());
  if (out.shared_x_sf) b = b + token_rows(out.x_sf);
  if (out.x_scales) b = b + token_rows(*out.x_scales);
  if (out.scheme.scale2 == megamoe::Scale2::kStatic || out.scheme.scale2 == megamoe::Scale2::kOnline) {
    b = b + 4;  // the global_scale read (nvfp4-static) or written (nvfp4-online)
  }
  return checked_value(b, "the byte count per call");
}

/// Point @p a's outputs at @p out's buffers (the global scale stays @p a's).
void point_outputs(megamoe::StageArgs& a, StageOutputs& out) {
  a.x_q = out.x_fp8.ref();
  a.x_sf = out.x_sf.ref();
  a.topk_idx_out = out.topk_idx_out.ref();
  a.topk_weights_out = out.topk_weights_out.ref();
  if (out.shared_x_sf) a.shared_x_sf = out.shared_x_sf->ref();
  if (out.x_scales) a.x_scales = out.x_scales->ref();
}

/// Compare @p got and @p want (same dtype and shape) element by element, bitwise.
void compare_bytes(RefCheck& r, const std::string& name, const Tensor& got, const Tensor& want) {
  const size_t esize = static_cast<size_t>(st_dtype_size(got.dtype));
  const int64_t cols = got.shape.size() == 2 ? got.shape[1] : 1;
  auto hex = [&](const Tensor& t, size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, t.data.data() + at, esize);  // little-endian host, as the files
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%0*llx", static_cast<int>(2 * esize), static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  for (size_t at = 0; esize > 0 && at < got.data.size(); at += esize) {
    if (std::memcmp(got.data.data() + at, want.data.data() + at, esize) == 0) continue;
    const auto e = static_cast<int64_t>(at / esize);
    if (!r.first) r.first = Mismatch{name, e / cols, e % cols, e, hex(got, at), hex(want, at)};
    ++r.mismatches;
  }
}

/// The norm form's stage check: every staged output in @p out against megamoe::prepare_inputs
/// (host tensors: the CPU backend) applied to @p y with @p args' other inputs and options,
/// into fresh outputs of the same shapes.
RefCheck check_staged_equals_prepare(const Tensor& y, const megamoe::StageArgs& args, const StageInputs& in,
                                     const StageOutputs& out, const megamoe::QuantScheme& q, const Options& o) {
  Tensor rows = y;  // a view of it goes to the call
  StageOutputs want = make_outputs(in, q, o);
  megamoe::StageArgs a = args;
  a.hidden_states = rows.ref();
  point_outputs(a, want);
  Tensor gs;
  if (q.scale2 == megamoe::Scale2::kOnline) {
    gs = Tensor("F32", {1}, "output 'global_scale'");
    a.global_scale = gs.ref();
  }
  megamoe::prepare_inputs(a);
  RefCheck r;
  compare_bytes(r, q.elem == megamoe::QuantElem::kFloat4E2M1 ? "x_q" : "x_fp8", out.x_fp8, want.x_fp8);
  compare_bytes(r, "x_sf", out.x_sf, want.x_sf);
  if (out.x_scales) compare_bytes(r, "x_scales", *out.x_scales, *want.x_scales);
  if (q.scale2 == megamoe::Scale2::kOnline && in.T() > 0) {
    Tensor got("F32", {1}, "output 'global_scale'");
    std::memcpy(got.data.data(), &out.global_scale, 4);
    compare_bytes(r, "global_scale", got, gs);
  }
  compare_bytes(r, "topk_idx_out", out.topk_idx_out, want.topk_idx_out);
  compare_bytes(r, "topk_weights_out", out.topk_weights_out, want.topk_weights_out);
  if (out.shared_x_sf) compare_bytes(r, "shared_x_sf", *out.shared_x_sf, *want.shared_x_sf);
  return r;
}

/// Whether @p a and @p b name one file: the same file when both exist (another spelling, a
/// symlink or a hard link), else the same normalized absolute path when neither does yet.
bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  const bool xa = fs::exists(a, ea), xb = fs::exists(b, eb);
  if (xa && xb) {
    std::error_code ec;
    return fs::equivalent(a, b, ec) && !ec;
  }
  if (xa || xb || ea || eb) return false;  // a file that exists is not one still to be made
  const fs::path ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  return !ea && !eb && ca == cb;
}

/// Refuse, before any work, a command line whose files overwrite one another: --output or
/// --save-inputs on the --input file, or --output on the --save-inputs file.
void check_distinct_files(const Options& o) {
  struct Pair {
    const char* writer;
    const std::string& written;
    const char* reader;
    const std::string& read;
    const char* what;
  };
  const Pair pairs[] = {
      {"--output", o.output, "--input", o.input, "writing the outputs would overwrite the inputs"},
      {"--save-inputs", o.save_inputs, "--input", o.input, "saving the inputs would rewrite the file being read"},
      {"--output", o.output, "--save-inputs", o.save_inputs, "the outputs would overwrite the saved inputs"}};
  for (const Pair& p : pairs) {
    if (p.written.empty() || p.read.empty() || !same_file(p.written, p.read)) continue;
    throw CliError(std::string(p.writer) + " " + p.written + ": the same file as " + p.reader + " " + p.read +
                   " (" + p.what + "); name another file");
  }
}

/// The norm form's files (--rmsnorm-weight, --residual FILE[:TENSOR]) against the files
/// written, as check_distinct_files does for the others.
void check_norm_files(const Options& o, const StageInputs& in) {
  const std::pair<const char*, std::string> read[] = {{"--rmsnorm-weight", norm_spec_file(o.rmsnorm_weight, in)},
                                                      {"--residual", norm_spec_file(o.residual, in)}};
  const std::pair<const char*, const std::string*> written[] = {{"--output", &o.output},
                                                                {"--save-inputs", &o.save_inputs}};
  for (const auto& [reader, file] : read) {
    for (const auto& [writer, path] : written) {
      if (file.empty() || path->empty() || !same_file(*path, file)) continue;
      throw CliError(std::string(writer) + " " + *path + ": the same file as " + reader + " " + file +
                     " (writing it would overwrite an input); name another file");
    }
  }
}

int run(const Options& o) {
  check_distinct_files(o);
  const auto sit = schemes().find(o.scheme);
  const megamoe::QuantScheme q = o.amax_floor ? sit->second.with_amax_floor(*o.amax_floor) : sit->second;
  if (o.global_scale && q.scale2 != megamoe::Scale2::kStatic) {
    throw CliError("--global-scale: only the nvfp4-static scheme takes a global scale (--scheme " + o.scheme + ")");
  }
  if (o.global_scale && !(std::isfinite(*o.global_scale) && *o.global_scale > 0.0f)) {
    throw CliError("--global-scale: expected a finite positive value, got " + fmt("%g", *o.global_scale));
  }
  if (o.amax_floor && q.scale2 == megamoe::Scale2::kStatic) {
    throw CliError("--amax-floor: nvfp4-static has no amax floor (its scales come from --global-scale)");
  }
  if (o.norm() && q.scale2 == megamoe::Scale2::kStatic && !o.global_scale) {
    // The default, max|x| / 2688, would read the rows staged: y, which the call computes.
    throw CliError("--scheme nvfp4-static with --rmsnorm-weight: give --global-scale (the default reads the "
                   "staged rows, which the norm computes)");
  }
  if (o.router && (o.gen.experts > kRouterMaxExperts || o.gen.topk > kRouterMaxTopk)) {
    // Refused before the [T, E] logits are generated (the library would refuse them after).
    throw CliError("--router: expected 1 to " + std::to_string(kRouterMaxExperts) +
                   " experts and a top-k of 1 to " + std::to_string(kRouterMaxTopk) +
                   " (router_logits: 1 to 512 experts; top_k), got --experts " + std::to_string(o.gen.experts) +
                   " --topk " + std::to_string(o.gen.topk));
  }

  // Device.
  std::string why;
  const int ndev = o.device == "cpu" ? 0 : cuda_device_count(&why);
  if (o.device == "cuda") {
    if (!megamoe::has_cuda_backend()) {
      throw CliError("--device cuda: the megamoe library was built without the CUDA backend");
    }
    if (ndev == 0) throw CliError("--device cuda: no usable CUDA device (" + why + ")");
  }
  const bool cuda = o.device == "cuda" || (o.device == "auto" && megamoe::has_cuda_backend() && ndev > 0);
  const int iters = o.iters > 0 ? o.iters : (cuda ? 20 : 3);

  megamoe::set_cpu_threads(o.threads);  // --threads (0: every CPU); megamoe::Error above 1024
  // Long runs on a terminal say what they are doing (the default run takes seconds on a
  // CPU); a file or a pipe on stdout gets nothing, and nothing ever goes to stdout.
  Progress progress;
  progress.on = !o.json && isatty(STDOUT_FILENO) &&
                (!o.input.empty() || o.gen.tokens >= kProgressElements / std::max<int64_t>(o.gen.hidden, 1));
  progress.step(o.input.empty() ? "generating the inputs" : "reading " + o.input);

  // Inputs.
  StageInputs in = o.input.empty() ? generate_inputs(o.gen) : load_inputs(o.input);
  std::optional<NormInputs> nin;  // the norm form's weight and residual
  if (o.norm()) {
    check_norm_files(o, in);
    nin = load_norm_inputs(o.rmsnorm_weight, o.residual, in, o.input, o.gen.seed);
  }
  const int64_t T = in.T(), H = in.H(), K = in.K();
  StageOutputs out = make_outputs(in, q, o);

  megamoe::StageArgs args;
  args.hidden_states = in.hidden_states.ref();
  args.topk_ids = in.topk_ids.ref();
  args.topk_weights = in.topk_weights.ref();
  if (in.is_padding) args.is_padding = in.is_padding->ref();
  args.x_q = out.x_fp8.ref();
  args.x_sf = out.x_sf.ref();
  args.topk_idx_out = out.topk_idx_out.ref();
  args.topk_weights_out = out.topk_weights_out.ref();
  if (out.shared_x_sf) {
    args.shared_x_sf = out.shared_x_sf->ref();
    args.shared_block_m = out.shared_block_m;
  }
  // The second-level scale of nvfp4-static: a [1] fp32 input tensor, by default
  // max|x| / 2688 (= 6 * 448, so the largest group scale is e4m3's largest value).
  Tensor gs_tensor;
  if (q.scale2 == megamoe::Scale2::kStatic) {
    float gs = 0.0f;
    if (o.global_scale) {
      gs = *o.global_scale;
    } else {
      for (float v : to_float(in.hidden_states)) {
        if (std::isfinite(v)) gs = std::max(gs, std::fabs(v));
      }
      gs /= 2688.0f;
    }
    gs_tensor = Tensor("F32", {1}, "input 'global_scale'");
    std::memcpy(gs_tensor.data.data(), &gs, 4);
    args.global_scale = gs_tensor.ref();
    out.global_scale = gs;
  } else if (q.scale2 == megamoe::Scale2::kOnline) {
    // nvfp4-online writes its global scale: a [1] fp32 output, read back after the runs.
    gs_tensor = Tensor("F32", {1}, "output 'global_scale'");
    args.global_scale = gs_tensor.ref();
  }
  if (out.x_scales) args.x_scales = out.x_scales->ref();
  args.full_buffer = o.full_buffer;
  // --router: the router's inputs and outputs; the staging's top-k inputs are its outputs.
  RouterInputs rin;
  Tensor r_ids, r_weights;
  megamoe::RouterArgs rargs;
  if (o.router) {
    rin = generate_router_inputs(o.gen, o.logits_dtype == "bf16");
    r_ids = Tensor("I32", {T, K}, "output 'topk_ids'");
    r_weights = Tensor("F32", {T, K}, "output 'topk_weights'");
    rargs.router_logits = rin.logits.ref();
    rargs.e_score_correction_bias = rin.bias.ref();
    rargs.top_k = K;
    rargs.routed_scaling_factor = o.routed_scaling_factor;
    rargs.topk_ids = r_ids.ref();
    rargs.topk_weights = r_weights.ref();
    args.topk_ids = megamoe::TensorRef();
    args.topk_weights = megamoe::TensorRef();
    megamoe::StageArgs checked = args;
    checked.hidden_quant = q;
    megamoe::validate_router(rargs, &checked);  // megamoe::Error, printed as-is, before anything runs
  }

  // The norm form: x, residual and weight in, y and residual_out out when asked for; the
  // staging's hidden_states stays empty (y takes its place). Checked before anything is
  // written, --save-inputs included.
  Tensor y_out, ro_out;
  megamoe::RmsNormArgs nargs;
  if (o.norm()) {
    nargs.x = in.hidden_states.ref();
    if (nin->residual) nargs.residual = nin->residual->ref();
    nargs.weight = nin->weight.ref();
    nargs.eps = o.eps;
    if (o.write_y) {
      y_out = Tensor("BF16", {T, H}, "output 'y'");
      nargs.y = y_out.ref();
    }
    if (o.write_residual_out) {
      ro_out = Tensor("BF16", {T, H}, "output 'residual_out'");
      nargs.residual_out = ro_out.ref();
    }
    args.hidden_states = megamoe::TensorRef();
    megamoe::StageArgs checked = args;
    checked.hidden_quant = q;
    megamoe::validate_rmsnorm(nargs, checked);  // megamoe::Error, printed as-is
  }
  if (!o.save_inputs.empty()) {
    std::vector<std::pair<std::string, const Tensor*>> extra;
    if (nin) {
      extra.emplace_back(kSavedWeightName, &nin->weight);
      if (nin->residual) extra.emplace_back(kSavedResidualName, &*nin->residual);
    }
    save_inputs(o.save_inputs, in, format_metadata(q, o), extra);
  }

  // The plan is that of the staging call these arguments make (the scheme set on a copy:
  // the fields below are filled in the order the call takes them).
  std::string plan_text;  // --explain; with --json it goes into the object
  if (o.explain) {
    megamoe::StageArgs plan = args;
    plan.hidden_quant = q;
    if (o.router) {  // the router's outputs are the staging's top-k
      plan.topk_ids = rargs.topk_ids;
      plan.topk_weights = rargs.topk_weights;
    }
    plan_text = o.norm() ? megamoe::explain(nargs, plan) : megamoe::explain(plan);
    // The plan of the staging part; route_and_stage runs the router in the same launch
    // (fast plans: its blocks before these) or, for the other kernels, just before it.
    if (o.router) plan_text += " [--router: route_and_stage adds the router to this]";
    if (o.json && o.explain_only) {
      std::cout << dump(ojson{{"tool", "megamoe-stage"}, {"plan", plan_text}, {"exit_code", 0}}) << "\n";
      return 0;
    }
    progress.clear();  // the plan goes to the same terminal
    if (!o.json) std::cout << "plan: " << plan_text << std::endl;  // before the (long) run
    if (o.explain_only) return 0;
  }
  progress.step("staging (1 warmup + " + std::to_string(iters) + " timed calls)");
  args.hidden_quant = q;
  if (!o.router && !o.norm()) megamoe::validate(args);

  // Run and time.
  std::vector<double> times, route_times;
  std::string device_desc;
  auto host_times = [&](auto&& call) {
    std::vector<double> v;
    call();  // warmup
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      const auto t1 = std::chrono::steady_clock::now();
      v.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    return v;
  };
  if (cuda) {
    if (o.router) {
      RouterTimes rt = run_cuda_router(rargs, args, 0, iters);
      times = std::move(rt.fused);
      route_times = std::move(rt.route);
    } else if (o.norm()) {
      times = run_cuda_norm(nargs, args, 0, iters);
    } else {
      times = run_cuda(args, 0, iters);
    }
    device_desc = "cuda:0 (" + cuda_device_name(0) + ")";
  } else {
    if (o.router) {
      times = host_times([&] { megamoe::route_and_stage(rargs, args); });
      // route() takes the padding mask from RouterArgs (route_and_stage from StageArgs).
      megamoe::RouterArgs alone = rargs;
      alone.is_padding = args.is_padding;
      route_times = host_times([&] { megamoe::route(alone); });
    } else if (o.norm()) {
      times = host_times([&] { megamoe::rmsnorm_and_stage(nargs, args); });
    } else {
      times = host_times([&] { megamoe::prepare_inputs(args); });
    }
    device_desc = "cpu (" + std::to_string(std::max(1u, std::thread::hardware_concurrency())) +
                  " hardware threads)";
  }
  const double t_med = median(times);
  if (q.scale2 == megamoe::Scale2::kOnline && T > 0) std::memcpy(&out.global_scale, gs_tensor.data.data(), 4);

  // The norm form's y for the checks: the timed calls' (--write-y), else that of one more
  // call on the same backend that writes it, into outputs of its own (so that the timed
  // calls' staged bytes are the ones checked); then the staged outputs against
  // prepare_inputs(y).
  Tensor y_more;
  const Tensor* y_rows = o.write_y ? &y_out : nullptr;
  std::optional<RefCheck> stage_check;
  if (o.norm()) {
    progress.step("checking the staged rows against prepare_inputs(y)");
    if (!o.write_y) {
      y_more = Tensor("BF16", {T, H}, "output 'y'");
      StageOutputs more = make_outputs(in, q, o);
      megamoe::StageArgs sa = args;
      point_outputs(sa, more);
      Tensor gs_more;
      if (q.scale2 == megamoe::Scale2::kOnline) {
        gs_more = Tensor("F32", {1}, "output 'global_scale'");
        sa.global_scale = gs_more.ref();
      }
      megamoe::RmsNormArgs na = nargs;
      na.y = y_more.ref();
      na.residual_out.reset();
      if (cuda) {
        run_cuda_norm(na, sa, 0, 1);
      } else {
        megamoe::rmsnorm_and_stage(na, sa);
      }
      y_rows = &y_more;
    }
    stage_check = check_staged_equals_prepare(*y_rows, args, in, out, q, o);
  }

  // Quality and reference.
  progress.step(reference_compiled() ? "checking against the reference" : "measuring the quality");
  const int64_t G = q.group_k;
  const std::vector<float> hidden = to_float(o.norm() ? *y_rows : in.hidden_states);  // what was quantized
  const Quality qual = measure_quality(hidden, T, H, out, G, q.ue8m0());
  const RouterRun router_run{&rin.logits, &rin.bias, K, o.routed_scaling_factor, &r_ids, &r_weights};
  const NormRun norm_run{nin ? &nin->weight : nullptr, nin && nin->residual ? &*nin->residual : nullptr, o.eps,
                         y_rows, o.write_residual_out ? &ro_out : nullptr};
  const std::optional<RefChecks> checks =
      check_reference(in, hidden, out, o.router ? &router_run : nullptr, o.norm() ? &norm_run : nullptr);

  if (!o.output.empty()) {
    std::vector<std::pair<std::string, const Tensor*>> ts = {
        {q.elem == megamoe::QuantElem::kFloat4E2M1 ? "x_q" : "x_fp8", &out.x_fp8}, {"x_sf", &out.x_sf}, {"topk_idx_out", &out.topk_idx_out},
        {"topk_weights_out", &out.topk_weights_out}};
    if (out.shared_x_sf) ts.emplace_back("shared_x_sf", &*out.shared_x_sf);
    if (o.router) {
      ts.emplace_back("topk_ids", &r_ids);
      ts.emplace_back("topk_weights", &r_weights);
    }
    if (out.x_scales) ts.emplace_back("x_scales", &*out.x_scales);
    if (o.write_y) ts.emplace_back("y", &y_out);
    if (o.write_residual_out) ts.emplace_back("residual_out", &ro_out);
    std::map<std::string, std::string> md = format_metadata(q, o);
    if (o.norm()) {
      md["call"] = "rmsnorm_and_stage";
      md["rmsnorm_eps"] = fmt("%.9g", o.eps);
    }
    if (q.scale2 == megamoe::Scale2::kStatic || q.scale2 == megamoe::Scale2::kOnline) {
      md["global_scale"] = fmt("%.9g", out.global_scale);
    }
    if (out.full_buffer_rows > 0) md["full_buffer_rows"] = std::to_string(out.full_buffer_rows);
    write_safetensors(o.output, ts, md);
  }

  // Report. With T == 0 nothing moves and nothing is quantized: no rate, no quality.
  progress.done();
  const bool empty = T == 0;
  // Nothing was quantized: no tokens, or tokens without hidden values (H == 0).
  const bool no_values = empty || H == 0;
  const std::string no_values_why = empty ? "no tokens" : "no hidden values, H = 0";
  const std::string rel_err_rule = qual.fp4_rule ? "|x| >= 0.5 * group scale, e2m1's smallest nonzero magnitude"
                                                 : "|x| > 1e-3 * group amax";
  // With --router the staging reads no top-k inputs but the logits and bias, and the
  // router writes its public ids and weights.
  const int64_t bytes = o.router ? checked_value(Checked(bytes_per_call(in, out)) -
                                                     static_cast<int64_t>(in.topk_ids.data.size()) -
                                                     static_cast<int64_t>(in.topk_weights.data.size()) +
                                                     static_cast<int64_t>(rin.logits.data.size()) +
                                                     static_cast<int64_t>(rin.bias.data.size()) +
                                                     static_cast<int64_t>(r_ids.data.size()) +
                                                     static_cast<int64_t>(r_weights.data.size()),
                                                 "the byte count per call")
                 : o.norm() ? checked_value(Checked(bytes_per_call(in, out)) +
                                                (nin->residual ? static_cast<int64_t>(nin->residual->data.size()) : 0) +
                                                static_cast<int64_t>(nin->weight.data.size()) +
                                                static_cast<int64_t>(y_out.data.size()) +
                                                static_cast<int64_t>(ro_out.data.size()),
                                            "the byte count per call")
                                 : bytes_per_call(in, out);
  const bool has_rate = !empty && bytes > 0 && t_med > 0;
  const double gbps = has_rate ? static_cast<double>(bytes) / t_med * 1e-9 : 0;
  int64_t padded = 0;
  if (in.is_padding) {
    for (uint8_t b : in.is_padding->data) padded += b != 0;
  }
  const int rc = (checks && (checks->staging.first || checks->router.first || checks->norm.first)) ||
                         (stage_check && stage_check->first)
                     ? 1
                     : 0;
  // A check the build does not have (null): null in JSON, "not compiled in" in text.
  const RefCheck* staging_check = checks ? &checks->staging : nullptr;
  const RefCheck* router_check = checks ? &checks->router : nullptr;
  auto mismatch_json = [](const RefCheck* check) {
    if (check == nullptr) return ojson();
    const RefCheck& c = *check;
    ojson r = {{"match", !c.first.has_value()}, {"mismatches", c.mismatches}};
    if (c.first) {
      r["first_mismatch"] = {{"tensor", c.first->tensor}, {"row", c.first->row},         {"col", c.first->col},
                             {"index", c.first->index},   {"got", c.first->got},         {"expected", c.first->expected}};
    } else {
      r["first_mismatch"] = nullptr;
    }
    return r;
  };
  auto mismatch_text = [](const RefCheck* check) {
    if (check == nullptr) return std::string("not compiled in");
    const RefCheck& c = *check;
    if (!c.first) return std::string("bit-exact match");
    const Mismatch& m = *c.first;
    return "MISMATCH, first in " + m.tensor + "[" + std::to_string(m.row) + ", " + std::to_string(m.col) +
           "] (flat index " + std::to_string(m.index) + "): got " + m.got + ", expected " + m.expected + " (" +
           std::to_string(c.mismatches) + " differing elements)";
  };
  const double r_med = o.router ? median(route_times) : 0.0;

  if (o.json) {
    ojson j;
    j["tool"] = "megamoe-stage";
    j["version"] = megamoe::version();
    j["backend"] = cuda ? "cuda" : "cpu";
    j["device"] = device_desc;
    j["cpu_threads"] = cuda ? ojson() : ojson(megamoe::cpu_threads());
    ojson src = {{"source", o.input.empty() ? "generated" : "file"}};
    if (o.input.empty()) {
      src["seed"] = o.gen.seed;
      src["experts"] = o.gen.experts;
      src["pad_every"] = o.gen.pad_every;
    } else {
      src["path"] = o.input;
      src["metadata"] = in.metadata;
    }
    j["input"] = src;
    j["shapes"] = {{"tokens", T},
                   {"hidden", H},
                   {"topk", K},
                   {"hidden_states", dtype_label(in.hidden_states.dtype)},
                   {"topk_ids", dtype_label(in.topk_ids.dtype)},
                   {"topk_weights", dtype_label(in.topk_weights.dtype)},
                   {"is_padding", in.is_padding ? ojson(dtype_label(in.is_padding->dtype)) : ojson()},
                   {"padded_tokens", padded}};
    j["scheme"] = {{"name", o.scheme},
                   {"description", megamoe::to_string(q)},
                   {"library_name", megamoe::scheme_name(q)},
                   {"scale", q.ue8m0() ? "ue8m0" : q.scale == megamoe::ScaleType::kFloat32 ? "float32" : "e4m3"},
                   {"amax_floor", q.amax_floor},
                   {"x_q_shape", out.x_fp8.shape},
                   {"x_scales_shape", out.x_scales ? ojson(out.x_scales->shape) : ojson()},
                   {"global_scale", q.scale2 == megamoe::Scale2::kStatic || q.scale2 == megamoe::Scale2::kOnline
                                        ? ojson(out.global_scale)
                                        : ojson()},
                   {"full_buffer_rows", out.full_buffer_rows > 0 ? ojson(out.full_buffer_rows) : ojson()},
                   {"group_size", G},
                   {"x_sf_shape", out.x_sf.shape}};
    j["shared_block_m"] = out.shared_x_sf ? ojson(out.shared_block_m) : ojson();
    j["shared_x_sf_rows"] = out.shared_x_sf ? ojson(out.shared_x_sf->shape[0]) : ojson();
    j["timing"] = {{"warmup", 1},
                   {"iters", iters},
                   {"median_us", t_med * 1e6},
                   {"min_us", *std::min_element(times.begin(), times.end()) * 1e6},
                   {"bytes", bytes},
                   {"gbps", has_rate ? ojson(gbps) : ojson()}};
    j["quality"] = {{"snr_db", std::isfinite(qual.snr_db) ? ojson(qual.snr_db) : ojson()},
                    {"snr_exact", std::isinf(qual.snr_db) && qual.snr_db > 0},
                    {"max_rel_err", no_values || !std::isfinite(qual.max_rel_err) ? ojson() : ojson(qual.max_rel_err)},
                    // The rule of max_rel_err: rel_err_floor * group amax (fp8) or
                    // rel_err_scale_step * group scale (fp4); the other key is null.
                    {"rel_err_floor", qual.fp4_rule ? ojson() : ojson(kRelErrFloor)},
                    {"rel_err_scale_step", qual.fp4_rule ? ojson(kFp4RelErrStep) : ojson()},
                    {"rel_err_rule", rel_err_rule},
                    {"rel_err_elements", qual.rel_err_elements},
                    {"finite_elements", qual.finite}};
    j["reference"] = mismatch_json(staging_check);
    if (o.router) {
      j["router"] = {{"experts", rin.logits.shape[1]},
                     {"topk", K},
                     {"logits", dtype_label(rin.logits.dtype)},
                     {"bias", dtype_label(rin.bias.dtype)},
                     {"routed_scaling_factor", o.routed_scaling_factor},
                     {"route_median_us", r_med * 1e6},
                     {"fused_median_us", t_med * 1e6},
                     {"reference", mismatch_json(router_check)}};
    } else {
      j["router"] = nullptr;
    }
    if (o.norm()) {
      auto tensor_json = [](const Tensor& t, const std::string& source) {
        return ojson{{"source", source}, {"dtype", dtype_label(t.dtype)}, {"shape", t.shape}};
      };
      j["norm"] = {{"call", "rmsnorm_and_stage"},
                   {"weight", tensor_json(nin->weight, nin->weight_source)},
                   {"residual", nin->residual ? tensor_json(*nin->residual, nin->residual_source) : ojson()},
                   {"eps", o.eps},
                   {"write_y", o.write_y},
                   {"write_residual_out", o.write_residual_out},
                   {"checked_y", o.write_y ? "timed calls" : "one more call"},
                   {"stage_check", mismatch_json(&*stage_check)},
                   {"reference", checks ? mismatch_json(&checks->norm) : ojson()}};
    } else {
      j["norm"] = nullptr;
    }
    j["plan"] = o.explain ? ojson(plan_text) : ojson();
    j["output"] = o.output.empty() ? ojson() : ojson(o.output);
    j["exit_code"] = rc;
    std::cout << dump(j) << "\n";
    return rc;
  }

  std::cout << "megamoe-stage " << megamoe::version() << "\n";
  std::cout << "backend: " << (cuda ? "cuda" : "cpu") << ", device " << device_desc;
  if (!cuda) std::cout << ", " << megamoe::cpu_threads() << " staging threads";  // --threads
  std::cout << "\n";
  std::cout << "input: "
            << (o.input.empty()
                    ? "generated (seed " + std::to_string(o.gen.seed) + ", " +
                          std::to_string(o.gen.experts) + " experts, pad every " +
                          std::to_string(o.gen.pad_every) + ")"
                    : o.input)
            << "\n";
  if (!in.metadata.empty()) {  // what --output / --save-inputs recorded about the file
    std::cout << "input metadata:";
    for (const auto& [k, v] : in.metadata) std::cout << " " << k << "=" << v;
    std::cout << "\n";
  }
  std::cout << "shapes: T=" << T << " H=" << H << " K=" << K << "; hidden_states "
            << dtype_label(in.hidden_states.dtype) << ", topk_ids " << dtype_label(in.topk_ids.dtype)
            << ", topk_weights " << dtype_label(in.topk_weights.dtype) << ", is_padding "
            << (in.is_padding ? dtype_label(in.is_padding->dtype) + std::string(" (") +
                                    std::to_string(padded) + " padded)"
                              : std::string("absent"))
            << "\n";
  std::cout << "scheme: " << o.scheme << " = " << megamoe::to_string(q) << "; x_sf "
            << out.x_sf.shape_str() << " " << dtype_label(out.x_sf.dtype);
  if (out.shared_x_sf) {
    std::cout << "; shared_x_sf " << out.shared_x_sf->shape_str() << " (shared_block_m "
              << out.shared_block_m << ")";
  }
  if (q.elem == megamoe::QuantElem::kFloat4E2M1) std::cout << "; x_q " << out.x_fp8.shape_str() << " uint8";
  if (out.x_scales) std::cout << "; x_scales " << out.x_scales->shape_str() << " float32";
  if (q.scale2 == megamoe::Scale2::kStatic || q.scale2 == megamoe::Scale2::kOnline) {
    std::cout << "; global_scale " << fmt("%.9g", out.global_scale);
  }
  if (out.full_buffer_rows > 0) std::cout << "; full buffer of " << out.full_buffer_rows << " rows";
  std::cout << "\n";
  if (o.norm()) {
    std::cout << "norm: rmsnorm_and_stage, weight " << nin->weight_source << " (" << dtype_label(nin->weight.dtype)
              << " " << nin->weight.shape_str() << "), residual "
              << (nin->residual ? nin->residual_source : std::string("none")) << ", eps " << fmt("%g", o.eps)
              << "; writes " << (o.write_y ? "y" : "no y")
              << (o.write_residual_out ? ", residual_out" : "") << "\n";
  }
  std::cout << "time: " << (t_med < 1e-3 ? fmt("%.2f us", t_med * 1e6) : fmt("%.3f ms", t_med * 1e3))
            << " per call (median of " << iters
            << " after 1 warmup)\n";
  if (has_rate) {
    std::cout << "bandwidth: " << fmt("%.2f", gbps) << " GB/s (" << bytes << " bytes per call)\n";
  } else {
    std::cout << "bandwidth: n/a (" << bytes << " bytes per call" << (empty ? ", no tokens" : "") << ")\n";
  }
  if (no_values) {
    std::cout << "SNR: n/a (" << no_values_why << ")\n";
  } else if (qual.finite == 0) {
    std::cout << "SNR: n/a (no finite input values)\n";
  } else if (std::isinf(qual.snr_db) && qual.snr_db > 0) {
    std::cout << "SNR: inf dB (dequantized values equal the input)\n";
  } else if (!std::isfinite(qual.snr_db)) {
    std::cout << "SNR: -inf dB (dequantized values that are not finite)\n";
  } else {
    std::cout << "SNR: " << fmt("%.2f", qual.snr_db) << " dB\n";
  }
  if (no_values) {
    std::cout << "max relative error: n/a (" << no_values_why << ")\n";
  } else {
    std::cout << "max relative error: " << fmt("%.4e", qual.max_rel_err) << " (elements with " << rel_err_rule
              << ")\n";
  }
  if (o.router) {
    std::cout << "router: E=" << rin.logits.shape[1] << " K=" << K << ", router_logits "
              << dtype_label(rin.logits.dtype) << ", e_score_correction_bias " << dtype_label(rin.bias.dtype)
              << ", routed scaling " << fmt("%g", o.routed_scaling_factor) << "; route alone "
              << (r_med < 1e-3 ? fmt("%.2f us", r_med * 1e6) : fmt("%.3f ms", r_med * 1e3))
              << " per call, route_and_stage (time above) "
              << (t_med < 1e-3 ? fmt("%.2f us", t_med * 1e6) : fmt("%.3f ms", t_med * 1e3)) << "\n";
    std::cout << "router reference: " << mismatch_text(router_check) << "\n";
  }
  if (o.norm()) {
    std::cout << "stage check: " << mismatch_text(&*stage_check) << " (staged outputs against prepare_inputs of "
              << (o.write_y ? "the y written" : "the y of one more call") << ")\n";
    std::cout << "norm reference: " << mismatch_text(checks ? &checks->norm : nullptr) << "\n";
  }
  std::cout << "reference: " << mismatch_text(staging_check) << "\n";
  if (!o.output.empty()) std::cout << "output: " << o.output << "\n";
  return rc;
}

}  // namespace
}  // namespace megamoe_cli

int main(int argc, char** argv) {
  using namespace megamoe_cli;
  Options o;
  CLI::App app{
      "megamoe-stage: run MegaMoE input staging (fp8 quantization of the hidden states, top-k\n"
      "repack, padding mask, shared-expert scales) on generated DeepSeek-V4-shaped inputs or on\n"
      "a safetensors file (--rmsnorm-weight: RMSNorm then staging, in one call); report time,\n"
      "bandwidth, quantization quality and a bitwise check against the independent reference.",
      "megamoe-stage"};
  app.set_version_flag("--version", megamoe::version());
  app.footer(std::string(kFooter) + (reference_compiled() ? "" : kNoReferenceFooter));
  app.get_formatter()->column_width(34);

  auto* input = app.add_option("--input", o.input,
                               "read hidden_states, topk_ids, topk_weights and optional is_padding "
                               "from this safetensors file (a regular file) instead of generating them");
  // Options of the generated inputs (meaningless with --input).
  auto gen = [&](const char* name, auto& var, const char* desc, const CLI::Validator& v) {
    app.add_option(name, var, desc)->capture_default_str()->transform(v)->excludes(input);
  };
  constexpr int64_t kMax = INT64_MAX;
  gen("-T,--tokens", o.gen.tokens, "tokens T of the generated inputs", integer_in(0, kMax));
  gen("-H,--hidden", o.gen.hidden, "hidden size H (a multiple of 128)", hidden_size());
  gen("-K,--topk", o.gen.topk, "experts per token K", integer_in(1, kMax));
  gen("--experts", o.gen.experts, "number of routed experts ids are drawn from", integer_in(1, INT32_MAX));
  gen("--pad-every", o.gen.pad_every, "pad every N-th token (is_padding); 0 = no is_padding tensor",
      integer_in(0, kMax));
  gen("--seed", o.gen.seed, "seed of the std::mt19937 input generator", integer_in(0, UINT32_MAX));
  app.add_option("--scheme", o.scheme,
                 "quantization scheme: mxfp8 (UE8M0 scales, G=32), ue8m0-g128, fp32-g128 "
                 "(Hopper), fp32-g128-sm90 (fp32-g128 with DeepGEMM SM90's amax floor 1e-10), fp32-g32, "
                 "mxfp8-e5m2 (e5m2 values, UE8M0, G=32; FlashInfer's mxfp8_e5m2), mxfp4 (e2m1, UE8M0, G=32, ties toward zero), "
                 "mxfp4-rne (ties to nearest even), nvfp4-static (e2m1, e4m3 scales, G=16, "
                 "--global-scale), nvfp4-per-token (also writes x_scales), nvfp4-online (computes and writes "
                 "global_scale), bf16 (pass-through: x_fp8 is the input as bf16, no scales)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mxfp8", "ue8m0-g128", "fp32-g128", "fp32-g128-sm90", "fp32-g32", "mxfp8-e5m2", "mxfp4",
                             "mxfp4-rne", "nvfp4-static", "nvfp4-per-token", "nvfp4-online", "bf16"}));
  app.add_option("--amax-floor", o.amax_floor,
                 "lower bound of a group's amax (NVFP4 per-token: of a row's) [default: 1e-4; "
                 "1e-10 is DeepGEMM's SM90 pre-dispatch and SGLang's; 0 gives a zero group the "
                 "unit scale, FlashInfer's SM90 rule]")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            const float v = std::strtof(s.c_str(), nullptr);
            return std::isfinite(v) && v >= 0.0f ? std::string() : "expected a finite non-negative value, got " + s;
          },
          "NON-NEGATIVE", "finite non-negative"));
  app.add_option("--global-scale", o.global_scale,
                 "nvfp4-static: the [1] fp32 global_scale input [default: max|x| / 2688 of the input]");
  auto* max_tokens = app.add_option("--max-tokens", o.max_tokens,
                                    "--full-buffer: rows M (>= T) of every output")
                         ->transform(integer_in(0, kMax));
  app.add_flag("--full-buffer", o.full_buffer,
               "full-buffer mode: rows T..M-1 of topk_idx_out / topk_weights_out become -1 / +0.0, "
               "those of x_q / x_sf / x_scales stay untouched (both checked)")
      ->needs(max_tokens);
  max_tokens->needs("--full-buffer");
  app.add_option("--shared-block-m", o.shared_block_m,
                 "also stage shared_x_sf for this shared-expert block M, with the "
                 "ceil(T/bm) * align(bm, 128) rows it requires (UE8M0 schemes only)")
      ->transform(integer_in(INT64_MIN, kMax));
  app.add_option("--device", o.device,
                 "where to run: cpu, cuda (device 0; error when none is present) or auto "
                 "(cuda when the library has the CUDA backend and a device is present, else cpu)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--iters", o.iters,
                 "timed calls; the median is reported, after one warmup call "
                 "[default: 3 on cpu, 20 on cuda]")
      ->transform(integer_in(1, INT_MAX));
  app.add_flag("--explain", o.explain,
               "print the plan megamoe::explain gives for this call (kernel, shape, index width, "
               "block/grid, store policy), then exit 0 without running; with --iters, run after it");
  app.add_option("--threads", o.threads,
                 "threads of a CPU staging call (megamoe::set_cpu_threads); 0 = every CPU")
      ->capture_default_str()
      ->transform(integer_in(0, 1024));
  app.add_option("--output", o.output,
                 "write x_fp8, x_sf, topk_idx_out, topk_weights_out (and shared_x_sf) to this "
                 "safetensors file (not the --input or --save-inputs file)");
  auto* save = app.add_option("--save-inputs", o.save_inputs,
                 "write the inputs (generated or read) to this safetensors file, readable "
                 "with --input");
  app.add_flag("--json", o.json, "print the report as one JSON object on stdout");
  auto* router = app.add_flag("--router", o.router,
                              "fused DeepSeek-V4 router: generate router logits [T, E] and a bias, "
                              "route with megamoe::route_and_stage (E = --experts, K = --topk) and "
                              "check the router against its reference too (see below)")
                     ->excludes(input)
                     ->excludes(save);
  app.add_option("--routed-scaling-factor", o.routed_scaling_factor,
                 "--router: the routed scaling factor applied to the weights")
      ->capture_default_str()
      ->needs(router);
  app.add_option("--logits-dtype", o.logits_dtype, "--router: dtype of the generated router logits")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->needs(router);
  auto* norm = app.add_option("--rmsnorm-weight", o.rmsnorm_weight,
                              "the norm form: RMSNorm the rows with this [H] BF16/F32 weight (ones, random, a "
                              "tensor of the --input file, FILE or FILE:TENSOR) and stage them with "
                              "megamoe::rmsnorm_and_stage (see below)")
                   ->excludes(router);
  auto* residual = app.add_option("--residual", o.residual,
                                  "--rmsnorm-weight: add this [T, H] BF16 residual first (random, a tensor of "
                                  "the --input file, FILE or FILE:TENSOR)")
                       ->needs(norm);
  app.add_option("--eps", o.eps, "--rmsnorm-weight: the epsilon added to the mean of squares")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            char* end = nullptr;
            const float v = std::strtof(s.c_str(), &end);
            return end != s.c_str() && *end == '\0' && std::isfinite(v) && v >= 0.0f
                       ? std::string()
                       : "expected a finite non-negative value, got " + s;
          },
          "NON-NEGATIVE", "finite non-negative"))
      ->needs(norm);
  app.add_flag("--write-y", o.write_y,
               "--rmsnorm-weight: the call also writes the normalized rows y (--output: y [T, H] BF16)")
      ->needs(norm);
  app.add_flag("--write-residual-out", o.write_residual_out,
               "--residual: the call also writes the new residual x + residual (--output: residual_out "
               "[T, H] BF16)")
      ->needs(residual);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    if (rc == 0) return 0;
    // --json promises one object on stdout, usage errors included.
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--json") == 0) {
        std::cout << dump(ojson{{"error", std::string("megamoe-stage: error: ") + e.what()}, {"exit_code", 2}}) << "\n";
        break;
      }
    }
    return 2;
  }
  o.has_shared = app.count("--shared-block-m") > 0;
  o.explain_only = o.explain && app.count("--iters") == 0;  // --explain alone runs nothing

  auto fail = [&](const std::string& msg) {
    std::cerr << msg << "\n";
    if (o.json) std::cout << dump(ojson{{"error", msg}, {"exit_code", 2}}) << "\n";
    return 2;
  };
  try {
    return run(o);
  } catch (const megamoe::Error& e) {
    return fail(std::string("megamoe-stage: error: ") + e.what());  // one prefix for every error
  } catch (const CliError& e) {
    return fail(std::string("megamoe-stage: error: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail("megamoe-stage: error: out of host memory for these shapes");
  } catch (const std::length_error& e) {
    return fail(std::string("megamoe-stage: error: a host buffer too large for these shapes (") +
                e.what() + ")");
  } catch (const std::exception& e) {
    return fail(std::string("megamoe-stage: error: ") + e.what());
  } catch (...) {
    return fail("megamoe-stage: error: unknown exception");
  }
}
