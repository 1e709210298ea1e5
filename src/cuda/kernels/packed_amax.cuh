// packed_amax.cuh: the group amax of core/numerics.h ("NaN-ignoring max |x|") computed on
// packed 16-bit pairs, two elements per instruction, before widening to fp32.
//
// Why it is the same function: bf16 -> fp32 and fp16 -> fp32 are exact and monotonic, so
// the maximum of the narrow values widened equals the maximum of the widened values; the
// PTX max.{bf16x2,f16x2} instructions (sm_80+) return the non-NaN operand when exactly one
// is NaN (fmaxf semantics), keep subnormals (no .ftz), and |x| is the sign bit cleared as in
// core::abs_bits. tests/cuda/test_cuda_numerics.cu checks abs_max2 against the scalar rule
// on all 2^32 operand pairs for both formats, abs_max2_xorsign's magnitudes as well.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/numerics.h"

namespace megamoe {
namespace cuda {

enum class Half2Kind { kBF16, kF16 };

/// Lane-wise max(a, b) of two packed pairs, NaN-ignoring.
template <Half2Kind K>
__device__ __forceinline__ uint32_t max2(uint32_t a, uint32_t b) {
  uint32_t d;
  if constexpr (K == Half2Kind::kBF16) {
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
}

/// |x| of both lanes: the sign bits cleared.
__device__ __forceinline__ uint32_t abs2(uint32_t a) { return a & 0x7FFF7FFFu; }

/// Lane-wise max(|a|, |b|) of two packed pairs, NaN-ignoring.
template <Half2Kind K>
__device__ __forceinline__ uint32_t abs_max2(uint32_t a, uint32_t b) {
  return max2<K>(abs2(a), abs2(b));
}

/// One 16-bit element (low or high half of a packed word) widened to fp32, exactly.
template <Half2Kind K>
__device__ __forceinline__ float widen(uint32_t word, int half) {
  if constexpr (K == Half2Kind::kBF16) {
    return core::bf16_to_float(static_cast<uint16_t>(half == 0 ? word : word >> 16));
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(half == 0 ? word & 0xFFFFu : word >> 16)));
  }
}

/// Lane-wise max(|a|, |b|) with the sign bit the XOR of the operands' (PTX
/// max.xorsign.abs, sm_86+): the magnitude is abs_max2's, NaN-ignoring, with no separate
/// instruction clearing the signs; callers drop the sign.
template <Half2Kind K>
__device__ __forceinline__ uint32_t abs_max2_xorsign(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
  uint32_t d;
  if constexpr (K == Half2Kind::kBF16) {
    asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("max.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
#else
  return abs_max2<K>(a, b);
#endif
}

/// amax of the 2N elements packed in w[0..N): a pairwise tree of abs_max2_xorsign (signs
/// ignored), then the two halves widened and combined with fmaxf of their magnitudes.
template <Half2Kind K, int N>
__device__ __forceinline__ float abs_max_packed(const uint32_t (&w)[N]) {
  static_assert(N >= 1 && (N & (N - 1)) == 0, "power of two");
  uint32_t m[N];
#pragma unroll
  for (int i = 0; i < N; ++i) m[i] = w[i];
#pragma unroll
  for (int width = N / 2; width >= 1; width /= 2) {
#pragma unroll
    for (int i = 0; i < width; ++i) m[i] = abs_max2_xorsign<K>(m[i], m[i + width]);
  }
  return fmaxf(fabsf(widen<K>(m[0], 0)), fabsf(widen<K>(m[0], 1)));
}

}  // namespace cuda
}  // namespace megamoe
