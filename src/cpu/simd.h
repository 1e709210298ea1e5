// simd.h: the vectorized row quantizer of the CPU backend (Google Highway, one copy per
// instruction set, chosen at run time). The scalar rules of src/core stay the definition
// and the fallback (strided rows, groups narrower than a vector); the test suite compares
// each instruction set's primitives (cpu/simd_ops.h) with them through hooks of its own
// (tests/cpp/cpu_simd_hooks.h), which the library does not contain.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/recipe.h"

namespace megamoe {
namespace cpu {
namespace simd {

/// Element type of hidden_states.
enum class In : uint8_t { kBf16, kFp16, kFp32 };

/// Rows to quantize: input and x_q rows are contiguous (unit stride along H); row strides
/// and every scale output's strides are free (any sign). Addresses need no alignment.
struct Rows {
  const void* x = nullptr;  ///< element [0, 0] of hidden_states
  int64_t x_row = 0;        ///< elements between rows of hidden_states
  In in = In::kBf16;
  uint8_t* xq = nullptr;  ///< byte [0, 0] of x_q
  int64_t xq_row = 0;     ///< bytes between rows of x_q
  void* sf = nullptr;     ///< x_sf: packed words or fp32, strides in 4-byte elements
  int64_t sf_s0 = 0, sf_s1 = 0;
  void* shared_sf = nullptr;  ///< shared_x_sf or nullptr (packed UE8M0 only)
  int64_t sh_s0 = 0, sh_s1 = 0, shared_bm = 1;
  void* x_scales = nullptr;  ///< kNvfp4PerToken: the [T] fp32 per-token scales
  int64_t xs_s0 = 0;
  int64_t H = 0, G = 0;
  core::Format fmt = core::Format::kFp8Ue8m0;
  float floor = core::kAmaxFloor;  ///< amax floor
  float gs = 0.0f;                 ///< kNvfp4Static: the global scale
  bool count_nonfinite = false;
};

/// Quantize rows [t0, t1) of r (x_q, x_sf, shared_x_sf, x_scales) with the instruction set
/// Highway picks now, adding the NaN/Inf count to *nonfinite when r.count_nonfinite.
/// Returns false, having written nothing, when this instruction set cannot take the
/// problem (a group narrower than one vector): the caller then uses the scalar path.
bool quantize_rows(const Rows& r, int64_t t0, int64_t t1, int64_t* nonfinite);

/// Off: the CPU backend takes the scalar path of src/core for everything (tests, benches).
void set_enabled(bool on) noexcept;
bool enabled() noexcept;

}  // namespace simd
}  // namespace cpu
}  // namespace megamoe
