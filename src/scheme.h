// scheme.h: schemes resolved to the launch table (src/scheme.cpp).
#pragma once

#include "formats/format_list.h"
#include "megamoe/quant.h"

namespace megamoe {
namespace detail {

/// The launch-table row of @p q; false when staging does not accept @p q.
bool resolve_format(const QuantScheme& q, core::Format* out);
/// The launch-table row of @p q; throws megamoe::Error naming @p q when it is rejected.
core::Format format_of(const QuantScheme& q);

}  // namespace detail
}  // namespace megamoe
