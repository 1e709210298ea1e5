// validate.h: the one argument validator behind both backends.
#pragma once

#include <cstdint>

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
  bool ue8m0 = true;    ///< UE8M0 scales (else fp32)
  bool has_padding = false;
  bool has_shared = false;
  int64_t shared_bm = 1;
};

/// Check everything SPEC.md requires; throws megamoe::Error before anything is written.
/// Returns the resolved problem (T == 0 is valid and means "nothing to do").
Problem validate_args(const StageArgs& args);

/// Byte address range [lo, hi) touched by a tensor (empty tensors: lo == hi).
struct Span {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
};
Span byte_span(const TensorRef& t);

}  // namespace detail
}  // namespace megamoe
