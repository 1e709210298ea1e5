// The validator and the one shape rule (megamoe::output_shapes) agree: for every format and
// a sweep of sizes, shared-expert blocks and full-buffer mode, outputs allocated from
// output_shapes pass megamoe::validate, and every output with one dimension one off (or
// the second-level scales' rank or presence changed) is rejected. A validator that derived
// a shape beside the rule would fail here for the format or size where the two part.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"
#include "test_util.h"

namespace {

using megamoe::DType;
using megamoe::OutputShapes;
using megamoe::QuantScheme;
using megamoe::StageArgs;
using megamoe::TensorRef;
using megamoe::TensorSpec;

/// Every preset, and fp8 at the group sizes only the generic rule names.
std::vector<QuantScheme> schemes() {
  return {QuantScheme::mxfp8(),          QuantScheme::fp8_ue8m0_g128(),
          QuantScheme::fp8_fp32_g128(),  QuantScheme::fp8_fp32_g32(),
          QuantScheme::mxfp8_e5m2(),     QuantScheme::mxfp4(),
          QuantScheme::mxfp4(megamoe::Rounding::kNearestEven),
          QuantScheme::nvfp4_static(),   QuantScheme::nvfp4_per_token(),
          QuantScheme::bf16(),           QuantScheme::nvfp4_online(),
          mt::scheme(true, 16),          mt::scheme(true, 64),
          mt::scheme(false, 16),         mt::scheme(false, 64)};
}

/// One staging call whose outputs have the shapes (and dtypes) @p out gives; each tensor
/// owns its buffer (validation reads none), so a tensor can be given a fresh buffer of
/// another shape without overlapping the others.
class Call {
 public:
  Call(int64_t T, int64_t H, int64_t K, const QuantScheme& q, const OutputShapes& out, bool full_buffer,
       std::optional<int64_t> bm) {
    a.hidden_states = tensor(DType::kBFloat16, 2, {T, H});
    a.topk_weights = tensor(DType::kFloat32, 2, {T, K});
    a.topk_ids = tensor(DType::kInt32, 2, {T, K});
    a.hidden_quant = q;
    a.full_buffer = full_buffer;
    a.x_q = from(out.x_q);
    a.x_sf = from(out.x_sf);
    a.topk_idx_out = from(out.topk_idx_out);
    a.topk_weights_out = from(out.topk_weights_out);
    if (out.x_scales) a.x_scales = from(*out.x_scales);
    if (out.global_scale) a.global_scale = from(*out.global_scale);
    if (out.shared_x_sf) {
      a.shared_x_sf = from(*out.shared_x_sf);
      a.shared_block_m = bm;
    }
  }

  /// A tensor of @p t's dtype with shape @p shape (rank @p ndim) over a fresh buffer.
  TensorRef tensor(DType dt, int ndim, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    mem_.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(n * megamoe::dtype_size(dt) + 16)));
    uint8_t* data = mem_.back().get();
    if (ndim == 0) return TensorRef(data, dt, {});
    if (ndim == 1) return TensorRef(data, dt, {shape[0]});
    return TensorRef(data, dt, {shape[0], shape[1]});
  }
  TensorRef from(const TensorSpec& s) { return tensor(s.dtype, s.ndim, {s.shape[0], s.shape[1]}); }

  /// The validator's verdict: empty when accepted, else its message.
  std::string verdict() const {
    const megamoe::Status st = megamoe::try_validate(a);
    return st.ok ? std::string() : st.message;
  }

  StageArgs a;

 private:
  std::vector<std::unique_ptr<uint8_t[]>> mem_;
};

/// The outputs of a call, by name, as pointers into its StageArgs (optional ones when given).
std::vector<std::pair<const char*, TensorRef*>> outputs(StageArgs& a) {
  std::vector<std::pair<const char*, TensorRef*>> v = {{"x_q", &a.x_q},
                                                       {"x_sf", &a.x_sf},
                                                       {"topk_idx_out", &a.topk_idx_out},
                                                       {"topk_weights_out", &a.topk_weights_out}};
  if (a.x_scales) v.push_back({"x_scales", &*a.x_scales});
  if (a.global_scale) v.push_back({"global_scale", &*a.global_scale});
  if (a.shared_x_sf) v.push_back({"shared_x_sf", &*a.shared_x_sf});
  return v;
}

TEST(ShapeRule, ValidatorAcceptsExactlyTheShapesOfOutputShapes) {
  int accepted = 0, perturbed = 0;
  for (const QuantScheme& q : schemes()) {
    for (int64_t H : {128, 256, 384, 1024}) {
      for (int64_t T : {1, 3, 130}) {
        for (int64_t K : {1, 6}) {
          for (int64_t bm : {0, 1, 7, 128, 200}) {
            if (bm > 0 && !q.ue8m0()) continue;
            for (bool full : {false, true}) {
              const std::optional<int64_t> obm = bm > 0 ? std::optional<int64_t>(bm) : std::nullopt;
              // Full-buffer mode: the outputs of M = T + 5 rows (the rule's own reading).
              const int64_t M = full ? T + 5 : T;
              OutputShapes out;
              try {
                out = megamoe::output_shapes(M, H, K, q, obm);
              } catch (const megamoe::Error&) {
                continue;  // H / G not a whole number of scale words: no call to build
              }
              const std::string where = mt::scheme_tag(q) + " T=" + std::to_string(T) + " H=" +
                                        std::to_string(H) + " K=" + std::to_string(K) + " bm=" +
                                        std::to_string(bm) + (full ? " full_buffer M=" + std::to_string(M) : "");
              SCOPED_TRACE(where);
              Call c(T, H, K, q, out, full, obm);
              ASSERT_EQ(c.verdict(), "");
              ++accepted;
              // Each check below changes one tensor of c and puts it back.
              const auto rejects = [&](TensorRef& t, TensorRef changed, const std::string& what) {
                const TensorRef kept = t;
                t = changed;
                EXPECT_NE(c.verdict(), "") << what << " accepted";
                t = kept;
                ++perturbed;
              };

              // Every dimension of every output one off, alone.
              for (auto [name, t] : outputs(c.a)) {
                for (int d = 0; d < t->ndim; ++d) {
                  for (int64_t delta : {-1, 1}) {
                    if (t->shape[d] + delta < 0) continue;
                    const std::string label = std::string(name) + " dim " + std::to_string(d) +
                                              (delta > 0 ? " +1" : " -1");
                    std::vector<int64_t> shape = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0};
                    shape[d] += delta;
                    // shared_x_sf needs at least the rows the tokens map to: more rows pass,
                    // one fewer than output_shapes(T) gives is rejected (below).
                    if (std::string(name) == "shared_x_sf" && d == 0) continue;
                    // Full-buffer mode reads M from topk_idx_out: its rows one off change
                    // the M every other output is held to, so the call still fails.
                    rejects(*t, c.tensor(t->dtype, t->ndim, shape), label);
                  }
                }
              }
              if (obm) {
                // The fewest shared rows the rule allows for T tokens pass, one fewer not.
                const int64_t need = megamoe::output_shapes(T, H, K, q, obm).shared_x_sf->shape[0];
                const int64_t cols = c.a.shared_x_sf->shape[1];
                const TensorRef kept = *c.a.shared_x_sf;
                *c.a.shared_x_sf = c.tensor(DType::kInt32, 2, {need, cols});
                EXPECT_EQ(c.verdict(), "") << "shared_x_sf with output_shapes(T)'s " << need << " rows";
                *c.a.shared_x_sf = kept;
                rejects(*c.a.shared_x_sf, c.tensor(DType::kInt32, 2, {need - 1, cols}),
                        "shared_x_sf with " + std::to_string(need - 1) + " rows");
              }
              // A 1-D output as 2-D (rows kept, one column).
              if (out.x_scales) rejects(*c.a.x_scales, c.tensor(DType::kFloat32, 2, {M, 1}), "x_scales as [M, 1]");
              // Second-level scales present exactly where the rule declares them.
              for (std::optional<TensorRef>* opt : {&c.a.global_scale, &c.a.x_scales}) {
                const std::optional<TensorRef> kept = *opt;
                if (kept) {
                  opt->reset();
                } else {
                  *opt = c.tensor(DType::kFloat32, 1, {opt == &c.a.global_scale ? 1 : M});
                }
                EXPECT_NE(c.verdict(), "") << (opt == &c.a.global_scale ? "global_scale" : "x_scales")
                                           << " presence flipped, accepted";
                *opt = kept;
                ++perturbed;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(accepted, 500);
  EXPECT_GT(perturbed, 10 * accepted);
}

/// global_scale: NVFP4 static's input and NVFP4 online's output, the same [1] float32; no
/// other scheme has one. The validator holds an output to the output rules: online's may
/// not overlap an input, static's may (inputs may share memory).
TEST(ShapeRule, GlobalScaleIsOnlineOutputAndStaticInput) {
  const int64_t T = 3, H = 512, K = 2;
  for (const QuantScheme& q : schemes()) {
    SCOPED_TRACE(mt::scheme_tag(q));
    const OutputShapes out = megamoe::output_shapes(T, H, K, q);
    const bool stat = q.scale2 == megamoe::Scale2::kStatic, online = q.scale2 == megamoe::Scale2::kOnline;
    EXPECT_EQ(out.global_scale.has_value(), stat || online);
    EXPECT_EQ(out.global_scale_out, online);
    if (!out.global_scale) continue;
    EXPECT_EQ(out.global_scale->dtype, DType::kFloat32);
    EXPECT_EQ(out.global_scale->numel(), 1);
    Call c(T, H, K, q, out, false, std::nullopt);
    ASSERT_EQ(c.verdict(), "");
    // global_scale on the first element of topk_weights (an input).
    c.a.global_scale->data = c.a.topk_weights.data;
    EXPECT_EQ(c.verdict().empty(), stat) << c.verdict();
  }
}

/// The dtypes: the rule's own dtype for every output passes (above); x_q's bytes may also
/// be uint8 (fp8) or int8 (packed fp4), and vLLM's MXFP4 path (the default scheme with an
/// x_q as MXFP4's) is MXFP4's shapes.
TEST(ShapeRule, XqByteDtypesAndTheMxfp4DropIn) {
  const int64_t T = 4, H = 512, K = 2;
  for (const QuantScheme& q : schemes()) {
    SCOPED_TRACE(mt::scheme_tag(q));
    const OutputShapes out = megamoe::output_shapes(T, H, K, q);
    Call c(T, H, K, q, out, false, std::nullopt);
    const DType other = out.x_q.dtype == DType::kUInt8 ? DType::kInt8 : DType::kUInt8;
    c.a.x_q.dtype = other;
    // bf16's 2-byte elements have no byte view: uint8 would be half the row.
    if (out.x_q.dtype == DType::kBFloat16) {
      EXPECT_NE(c.verdict(), "");
    } else {
      EXPECT_EQ(c.verdict(), "");
    }
    c.a.x_q.dtype = DType::kInt32;
    EXPECT_NE(c.verdict(), "");
  }
  const OutputShapes mx4 = megamoe::output_shapes(T, H, K, QuantScheme::mxfp4());
  Call c(T, H, K, QuantScheme::mxfp8(), mx4, false, std::nullopt);
  EXPECT_EQ(c.verdict(), "");
}

}  // namespace
