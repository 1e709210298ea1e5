// layout.h: index maps of the staging outputs, shared by the CPU backend and the kernels.
#pragma once

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace core {

/// bm rounded up to a multiple of 128.
template <typename I>
MEGAMOE_HD I aligned_block_m(I bm) {
  return (bm + 127) / 128 * 128;
}

/// The same map from token t's block q = t / bm and row in block m = t % bm, with
/// abm = aligned_block_m(bm) (kernels compute q with core::fastdiv).
template <typename I>
MEGAMOE_HD I shared_sf_row_qm(I q, I m, I abm) {
  return q * abm + (m / 128) * 128 + (m % 32) * 4 + (m % 128) / 32;
}

/// Row of shared_x_sf that receives token t's scale words (MN-major TMA permutation).
/// I: int64_t, or uint32_t where the caller knows every row fits.
template <typename I>
MEGAMOE_HD I shared_sf_row(I t, I bm) {
  return shared_sf_row_qm(t / bm, t % bm, aligned_block_m(bm));
}

/// Word of the packed UE8M0 scale row holding group g, and the byte shift inside it.
MEGAMOE_HD int64_t ue8m0_word(int64_t g) { return g / 4; }
MEGAMOE_HD uint32_t ue8m0_shift(int64_t g) { return static_cast<uint32_t>(g % 4) * 8u; }

}  // namespace core
}  // namespace megamoe
