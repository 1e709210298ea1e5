// cpu_simd_hooks.h: test hooks into the CPU quantizer's vector primitives (src/cpu/simd_ops.h),
// compiled for every instruction set the library's quantizer is (src/cpu/simd_targets.h)
// and dispatched the same way, in cpu_simd_hooks.cpp: a translation unit of the test
// binaries (and of the CPU benchmark, which prints the instruction set), not of the library.
// Each hook runs the primitives of quantize_rows on n elements, any n.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/simd.h"

namespace megamoe {
namespace cpu {
namespace simd {

/// fp8 e4m3 bytes of in[i] (core::fp8_e4m3_from_float_sw).
void encode_e4m3(const float* in, uint8_t* out, size_t n);
/// The same for inputs with 2^-6 <= |x| (Inf included) and no NaN only: the encoder of
/// groups whose every value is an e4m3 normal or saturates.
void encode_e4m3_normal(const float* in, uint8_t* out, size_t n);
/// e2m1 nibbles (one per byte) of in[i], ties toward zero or to nearest even.
void encode_e2m1(const float* in, uint8_t* out, size_t n, bool ttz);
/// Exact widening of n bf16 / fp16 / fp32 elements to fp32 bit patterns.
void widen(In in, const void* src, uint32_t* out, size_t n);
/// NaN-ignoring max |x| of each of `groups` groups of G consecutive fp32 elements (G a
/// multiple of the vector length, else false), with the NaN/Inf count of all of them.
bool group_amax(const float* x, size_t groups, size_t G, float* amax, int64_t* nonfinite);

/// The instruction sets compiled into the quantizer (a mask of HWY_* target bits): the
/// hooks are compiled for the same ones (cpu/simd_targets.h).
int64_t compiled_targets() noexcept;
/// Name of the instruction set a dispatch picks now ("AVX2", "EMU128", ...).
const char* active_target();
/// float lanes of that instruction set's vectors.
size_t active_lanes();

}  // namespace simd
}  // namespace cpu
}  // namespace megamoe
