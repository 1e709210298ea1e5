// chunk.cuh: a 16-element "chunk" of one contiguous, 16-byte aligned hidden-state row as
// the vectorized kernels hold it (loaded with 16-byte loads, kept packed), its elements,
// its amax, its non-finite count, and the vector stores of the encoded values.
#pragma once

#include "formats/e2m1/f16.h"
#include "formats/e2m1/f16mul.h"
#include "formats/e2m1/fp32.h"
#include "formats/e2m1/pairs.h"
#include "formats/recipe.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/packed_amax.cuh"

namespace megamoe {
namespace cuda {
namespace {

constexpr int kChunk = 16;  // elements per thread

// The e5m2 conversion instruction (cvt.rn.satfinite.e5m2x2.f32) exists from sm_89.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
constexpr bool kHasE5m2 = true;
#else
constexpr bool kHasE5m2 = false;
#endif

/// One chunk as loaded: 8 packed words for 16-bit inputs, 16 floats' bits for fp32.
template <int In>
struct RawChunk {
  static constexpr int kWords = In == kInF32 ? kChunk : kChunk / 2;
  uint32_t w[kWords];
};

template <int In>
__device__ __forceinline__ void load_chunk(const typename InTraits<In>::T* src, RawChunk<In>& c) {
#pragma unroll
  for (int i = 0; i < RawChunk<In>::kWords / 4; ++i) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(src) + i);
    c.w[4 * i + 0] = u.x;
    c.w[4 * i + 1] = u.y;
    c.w[4 * i + 2] = u.z;
    c.w[4 * i + 3] = u.w;
  }
}

template <int In>
__device__ __forceinline__ void zero_chunk(RawChunk<In>& c) {
#pragma unroll
  for (int i = 0; i < RawChunk<In>::kWords; ++i) c.w[i] = 0u;
}

/// Element i of the chunk as fp32 (exact).
template <int In>
__device__ __forceinline__ float element(const RawChunk<In>& c, int i) {
  if constexpr (In == kInF32) return __uint_as_float(c.w[i]);
  else if constexpr (In == kInBF16) return widen<Half2Kind::kBF16>(c.w[i / 2], i % 2);
  else return widen<Half2Kind::kF16>(c.w[i / 2], i % 2);
}

/// NaN-ignoring max |x| over the chunk (core::fmax_nan_ignoring of core::abs_bits), NaN
/// when all 16 elements are NaN, where the CPU backend's fold from 0 gives 0. The group
/// math of every format but NVFP4 per-token maps both to the same scale and values (the
/// floor, or the static clamp, absorbs the NaN); the row kernel folds from 0 itself.
template <int In>
__device__ __forceinline__ float chunk_amax(const RawChunk<In>& c) {
  if constexpr (In == kInBF16) return abs_max_packed<Half2Kind::kBF16>(c.w);
  else if constexpr (In == kInF16) return abs_max_packed<Half2Kind::kF16>(c.w);
  else {
    float m[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) m[i] = core::abs_bits(__uint_as_float(c.w[i]));
#pragma unroll
    for (int width = kChunk / 2; width >= 1; width /= 2) {
#pragma unroll
      for (int i = 0; i < width; ++i) m[i] = fmaxf(m[i], m[i + width]);
    }
    return m[0];
  }
}

/// NaN and +-Inf elements of the chunk (core::non_finite; zeros for an inactive chunk).
template <int In>
__device__ __forceinline__ uint32_t chunk_nonfinite(const RawChunk<In>& c) {
  uint32_t n = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) n += core::non_finite(element<In>(c, i)) ? 1u : 0u;
  return n;
}

/// The chunk's 16 values encoded with group parameters gp: 16 fp8 bytes (4 words, the
/// two-at-a-time conversion of core::fp8x2_from_float) or 16 e2m1 nibbles (2 words,
/// low nibble first), by core::encode.
template <core::Format F>
struct Encoded {
  static constexpr int kWords = core::values_per_byte(F) == 1 ? 4 : 2;
  uint32_t w[kWords];
};

/// The chunk's e2m1 nibbles by core::encode, one value at a time.
template <core::Format F, int In>
__device__ __forceinline__ void encode_fp4_per_value(const RawChunk<In>& x, const core::GroupParams& gp,
                                                     uint32_t (&out)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint32_t word = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) word |= core::encode<F>(element<In>(x, 8 * i + k), gp) << (4 * k);
    out[i] = word;
  }
}

/// The codes of chunk x in a group with parameters gp. kF16Mul: the caller knows that the
/// f16 multiply form applies to gp.m (core::f16_mul_applies: a fast row's NVFP4 per-token
/// groups), which then runs without its test.
template <core::Format F, int In, bool kF16Mul = false>
__device__ __forceinline__ Encoded<F> encode_chunk(const RawChunk<In>& x, const core::GroupParams& gp) {
  Encoded<F> out;
  if constexpr (core::values_per_byte(F) == 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      constexpr core::Elem E = core::elem_of(F);
      const uint32_t lo = core::fp8x2_from_float<E>(core::mul_rn(element<In>(x, 4 * i + 0), gp.m),
                                                    core::mul_rn(element<In>(x, 4 * i + 1), gp.m));
      const uint32_t hi = core::fp8x2_from_float<E>(core::mul_rn(element<In>(x, 4 * i + 2), gp.m),
                                                    core::mul_rn(element<In>(x, 4 * i + 3), gp.m));
      out.w[i] = lo | (hi << 16);
    }
  } else if constexpr (In == kInBF16 && F == core::Format::kNvfp4PerToken && kHasE5m2) {
    // NVFP4 per-token of bf16 on sm_89+: the z map on f16 pairs (formats/e2m1/f16mul.h); exact
    // for every multiplier (outside the form's range, the fp32 one).
    if constexpr (kF16Mul) core::e2m1_f16_mul_chunk(x.w, gp.m, out.w);
    else core::e2m1_mul_chunk(x.w, gp.m, out.w);
  } else {
    if constexpr (In == kInBF16 && F == core::Format::kNvfp4Static) {
      // NVFP4 static of bf16: seven saturating f16x2 adds a pair (formats/e2m1/f16.h) unless
      // the group's divisor is at an end of its range (then per value).
      if (gp.m >= core::kPairsMinDivisor && gp.m <= core::kPairsMaxDivisor) {
        core::e2m1_f16_chunk(x.w, core::e2m1_f16_keys(gp.m), out.w);
        return out;
      }
    }
    if constexpr (In == kInBF16 && (F == core::Format::kMxfp4 || F == core::Format::kMxfp4Rne)) {
      // MXFP4 of bf16: on sm_89+ fp32 clamps and the e5m2 conversion (formats/e2m1/fp32.h),
      // before it two values per integer op (formats/e2m1/pairs.h); per value where the
      // group's exponent is out of the form's range or the chunk holds a NaN the form does
      // not encode (the fp32 form's ties toward zero does).
      constexpr bool kEven = F == core::Format::kMxfp4Rne;
      uint32_t nan = 0;
      if constexpr (kEven || !kHasE5m2) {
#pragma unroll
        for (int i = 0; i < 8; ++i) nan |= core::pairs_have_nan(x.w[i]);
      }
      if constexpr (kHasE5m2) {
        if (nan == 0u && gp.sf - core::kFp32MinE <= core::kFp32MaxE - core::kFp32MinE) {
          core::e2m1_fp32_chunk<kEven>(x.w, core::e2m1_fp32_keys(gp.sf), out.w);
          return out;
        }
      } else if (nan == 0u && gp.sf >= core::kPairsMinE && gp.sf <= core::kPairsMaxE) {
        const core::E2m1PairKeys k = core::e2m1_pair_keys<kEven>(gp.sf);
        uint32_t p[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] = core::e2m1_pair_nibbles<kEven>(x.w[i], k);
        core::e2m1_pack_eight_pairs(p, out.w);
        return out;
      }
    }
    encode_fp4_per_value<F, In>(x, gp, out.w);
  }
  return out;
}

/// Vector global store of N words (N = 4: 16 bytes, N = 2: 8 bytes, N = 1: 4 bytes);
/// kStream: streaming (evict-first) store.
template <bool kStream, int N>
__device__ __forceinline__ void store_words(void* ptr, const uint32_t (&v)[N]) {
  static_assert(N == 1 || N == 2 || N == 4, "4-, 8- or 16-byte stores");
  if constexpr (N == 4) {
    if constexpr (kStream) {
      asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(v[0]), "r"(v[1]),
                   "r"(v[2]), "r"(v[3])
                   : "memory");
    } else {
      *static_cast<uint4*>(ptr) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  } else if constexpr (N == 2) {
    if constexpr (kStream) {
      asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(ptr), "r"(v[0]), "r"(v[1]) : "memory");
    } else {
      *static_cast<uint2*>(ptr) = make_uint2(v[0], v[1]);
    }
  } else {
    if constexpr (kStream) {
      asm volatile("st.global.cs.u32 [%0], %1;" ::"l"(ptr), "r"(v[0]) : "memory");
    } else {
      *static_cast<uint32_t*>(ptr) = v[0];
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
