// reference_check.h: the bitwise comparison of megamoe-stage's outputs with the independent
// reference of the test suite (tests/reference/megamoe_reference.h, router_reference.h).
// The CMake option MEGAMOE_CLI_REFERENCE (on in top-level builds) compiles it in
// (reference_check.cpp, the one source of the CLI that reads tests/); off, the CLI links
// reference_none.cpp instead, builds from the public headers and its own sources only, and
// reports that the check is not compiled in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stage_check.h"
#include "stage_inputs.h"

namespace megamoe_cli {

/// First differing element of a comparison.
struct Mismatch {
  std::string tensor;   ///< output name
  int64_t row = 0;      ///< row (token, or shared_x_sf row)
  int64_t col = 0;      ///< column
  int64_t index = 0;    ///< flat row-major index, row * columns + col
  std::string got;      ///< what megamoe wrote (hex bits, value where useful)
  std::string expected; ///< what the reference computed
};

/// Result of the comparison with the reference.
struct RefCheck {
  std::optional<Mismatch> first;  ///< empty when every output matches bitwise
  int64_t mismatches = 0;         ///< differing elements over all outputs
};

/// --router: the router's inputs and its outputs (topk_ids I32 and topk_weights F32 [T, K]).
struct RouterRun {
  const Tensor* logits = nullptr;  ///< F32 or BF16 [T, E]
  const Tensor* bias = nullptr;    ///< F32 [E]
  int64_t K = 0;
  float routed_scaling_factor = 1.0f;
  const Tensor* ids = nullptr;
  const Tensor* weights = nullptr;
};

/// The norm form (--rmsnorm-weight): its inputs and the rows it wrote.
struct NormRun {
  const Tensor* weight = nullptr;        ///< BF16 or F32 [H]
  const Tensor* residual = nullptr;      ///< BF16 [T, H]; null without a residual
  float eps = 0;
  const Tensor* y = nullptr;             ///< BF16 [T, H]: the normalized rows the call wrote
  const Tensor* residual_out = nullptr;  ///< BF16 [T, H]; null when not written
};

/// What the reference found.
struct RefChecks {
  RefCheck staging;  ///< every staged output (shared_x_sf rows through megamoe_ref::shared_row)
  RefCheck router;   ///< with --router: topk_ids and topk_weights
  RefCheck norm;     ///< with the norm form: y and residual_out
};

/// Whether this build compares with the reference (MEGAMOE_CLI_REFERENCE).
bool reference_compiled();

/// Compare @p out, staged from @p in (@p hidden: to_float(in.hidden_states)), bitwise with
/// the staging reference; with @p router, also the router's outputs with the router
/// reference's, and the staging reference then takes the router reference's ids and
/// weights as its top-k inputs (swapped into @p in for the comparison only). With @p norm
/// (the norm form: in.hidden_states is x), y and residual_out are compared with the norm
/// reference (tests/reference/norm_reference.h) and the staging reference stages the norm
/// reference's y (swapped in the same way; @p hidden is then unused). Empty when the
/// reference is not compiled in.
std::optional<RefChecks> check_reference(StageInputs& in, const std::vector<float>& hidden, const StageOutputs& out,
                                         const RouterRun* router, const NormRun* norm = nullptr);

}  // namespace megamoe_cli
