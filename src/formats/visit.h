// visit.h: the one switch on a format (host code). visit_format hands a callable the
// format as a compile-time tag, so each backend instantiates its per-format code from one
// generic call; its cases come from the registry (formats/format_list.h), so every row has
// one. visit_fast_group does the same for the fast kernel's (format, G) variants.
#pragma once

#include <string>
#include <type_traits>

#include "formats/format_list.h"
#include "megamoe/error.h"

namespace megamoe {
namespace core {

/// A format as a type: FormatTag<F>::value == F.
template <Format F>
using FormatTag = std::integral_constant<Format, F>;

[[noreturn]] inline void unknown_format(Format f) {
  throw Error(ErrorCode::kInternal,
              "megamoe: internal: format " + std::to_string(static_cast<int>(f)) + " has no row in the registry");
}

/// fn(FormatTag<f>{}) for the runtime format @p f.
template <class Fn>
decltype(auto) visit_format(Format f, Fn&& fn) {
  switch (f) {
#define MEGAMOE_VISIT_CASE(E, ...) \
  case Format::E: return fn(FormatTag<Format::E>{});
    MEGAMOE_FORMAT_LIST(MEGAMOE_VISIT_CASE)
#undef MEGAMOE_VISIT_CASE
  }
  unknown_format(f);
}

/// fn(FormatTag<f>{}, std::integral_constant<int, G>{}) when the fast kernel has the
/// variant (f, G) (the registry's "fast" column); false, calling nothing, otherwise.
template <class Fn>
bool visit_fast_group(Format f, int64_t G, Fn&& fn) {
  return visit_format(f, [&](auto tag) {
    constexpr Format F = decltype(tag)::value;
    if constexpr (fast_group(F, 16)) {
      if (G == 16) return fn(tag, std::integral_constant<int, 16>{}), true;
    }
    if constexpr (fast_group(F, 32)) {
      if (G == 32) return fn(tag, std::integral_constant<int, 32>{}), true;
    }
    if constexpr (fast_group(F, 128)) {
      if (G == 128) return fn(tag, std::integral_constant<int, 128>{}), true;
    }
    return false;
  });
}

}  // namespace core
}  // namespace megamoe
