// validate.h: the one argument validator behind both backends.
#pragma once

#include <cstdint>
#include <vector>

#include "core/formats.h"
#include "megamoe/stage.h"

namespace megamoe {
namespace detail {

/// Sizes and options resolved from validated StageArgs.
struct Problem {
  int64_t T = 0;        ///< tokens
  int64_t H = 0;        ///< hidden size
  int64_t K = 0;        ///< top-k
  int64_t G = 0;        ///< group size
  int64_t sf_cols = 0;  ///< scale-row width of x_sf (words or floats)
  int64_t xq_cols = 0;  ///< row width of x_q in bytes (H, or H/2 for fp4)
  core::Format fmt = core::Format::kFp8Ue8m0;  ///< launch-table row
  QuantScheme scheme;   ///< the scheme staged (after the MXFP4 drop-in rule)
  float floor = 1e-4f;  ///< amax floor
  bool ue8m0 = true;    ///< UE8M0 scales
  bool has_global = false;     ///< global_scale given (NVFP4 static)
  bool has_x_scales = false;   ///< x_scales given (NVFP4 per-token)
  bool has_nonfinite = false;  ///< nonfinite_count given
  int64_t M = 0;               ///< rows of the top-k outputs (T, or max_tokens in full-buffer mode)
  bool full_buffer = false;    ///< rows T..M-1 of the top-k outputs are filled with -1 / +0.0
  bool has_alpha = false;      ///< kept weights are multiplied by alpha (one fp32 rounding)
  float alpha = 1.0f;          ///< routed scaling factor
  bool routing_only = false;   ///< no activations: only the top-k repack runs
  bool has_padding = false;
  bool has_shared = false;
  int64_t shared_bm = 1;
};

/// Check everything SPEC.md requires; throws megamoe::Error before anything is written.
/// Returns the resolved problem (T == 0 is valid and means "nothing to do").
Problem validate_args(const StageArgs& args);
/// The same for a routing-only call.
Problem validate_routing(const RoutingArgs& args);
/// True when the call has work (T > 0, or a full-buffer tail to fill).
inline bool has_work(const Problem& p) { return p.T > 0 || (p.full_buffer && p.M > 0); }

/// Element offsets, relative to the data pointer, of a tensor's first and last elements in
/// address order: lo <= 0 <= hi (both 0 for an empty tensor).
struct Extent {
  int64_t lo = 0;
  int64_t hi = 0;
};
/// False when an offset does not fit in int64 (the validator rejects such tensors).
bool try_element_extent(const TensorRef& t, Extent* out);
/// For validated tensors (the validator has proven that the extent fits).
Extent element_extent(const TensorRef& t);

/// Every tensor of a call (optional ones when present), with its argument name.
struct NamedTensor {
  const TensorRef* t;
  const char* name;
  bool output;
};
std::vector<NamedTensor> named_tensors(const StageArgs& args);

/// Byte address range [lo, hi) touched by a tensor (empty tensors: lo == hi).
struct Span {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
};
/// False when the span wraps around the address space or its byte offsets overflow.
bool try_byte_span(const TensorRef& t, Span* out);
/// For validated tensors.
Span byte_span(const TensorRef& t);

}  // namespace detail
}  // namespace megamoe
