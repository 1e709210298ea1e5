// scheme.h: schemes resolved to the launch table, and the shape rule's parts
// (src/scheme.cpp).
#pragma once

#include <cstdint>

#include "core/checked.h"
#include "formats/format_list.h"
#include "megamoe/quant.h"
#include "megamoe/shapes.h"

namespace megamoe {
namespace detail {

/// The launch-table row of @p q; false when staging does not accept @p q.
bool resolve_format(const QuantScheme& q, core::Format* out);
/// The launch-table row of @p q; throws megamoe::Error naming @p q when it is rejected.
core::Format format_of(const QuantScheme& q);

/// The shape rule of output_shapes (include/megamoe/shapes.h) without its checks: the
/// outputs of @p T rows for hidden size @p H and top-k @p K under @p q, whose format @p f
/// output_shapes has accepted for this H (a multiple of 128, whole scale words). No size is
/// multiplied, so rows whose products pass int64 are answered too: the validator, which
/// names an oversized tensor itself, asks this for the M rows of a call. shared_x_sf is
/// left unset (its rows: shared_sf_rows).
OutputShapes output_shapes_of(core::Format f, const QuantScheme& q, int64_t T, int64_t H, int64_t K);
/// The rows shared_x_sf needs for @p T tokens in blocks of @p bm > 0: ceil(T / bm) *
/// align(bm, 128), none for T == 0; not ok() when the count passes int64 (a huge bm).
core::Checked shared_sf_rows(int64_t T, int64_t bm);

}  // namespace detail
}  // namespace megamoe
