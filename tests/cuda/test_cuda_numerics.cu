// Exhaustive device-side checks of src/core/numerics.h: the hardware fp8 conversion
// (cvt.rn.satfinite.e4m3x2.f32, what the kernels use on sm_89+) against the portable
// software conversion (what the CPU backend uses), over all 2^32 fp32 bit patterns, in
// both halves of the x2 instruction; fp16 -> fp32 software vs hardware for all halves; and
// the packed bf16x2/f16x2 amax of src/cuda/kernels/packed_amax.cuh against the scalar rule
// (core::fmax_nan_ignoring of core::abs_bits on the widened values) for all 2^32 pairs; the
// chunk forms of src/cuda/kernels/chunk.cuh against the core rules on random chunks.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "formats/e2m1/f16.h"
#include "formats/e2m1/f16mul.h"
#include "formats/e2m1/fp32.h"
#include "formats/e2m1/pairs.h"
#include "formats/fp8/e5m2.h"
#include "formats/recipe.h"
#include "core/numerics.h"
#include "cuda/kernels/chunk.cuh"
#include "cuda/kernels/packed_amax.cuh"

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// Every fp32 through the hardware conversion (sm_89+) and the software rule of fp8 codec
/// kE5m2 ? e5m2 : e4m3, single and paired.
template <bool kE5m2>
__global__ void fp8_exhaustive(unsigned long long* mismatches, uint32_t* first,
                               unsigned long long* nan_outputs) {
  namespace core = megamoe::core;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const uint32_t b = static_cast<uint32_t>(i);
    const float x = __uint_as_float(b);
    const uint8_t sw = kE5m2 ? core::fp8_e5m2_from_float_sw(x) : core::fp8_e4m3_from_float_sw(x);
    const uint8_t hw = kE5m2 ? core::fp8_e5m2_from_float(x) : core::fp8_e4m3_from_float(x);
    const uint16_t pair = kE5m2 ? core::fp8x2_e5m2_from_float(x, -x) : core::fp8x2_e4m3_from_float(x, -x);
    const uint8_t sw_neg = kE5m2 ? core::fp8_e5m2_from_float_sw(-x) : core::fp8_e4m3_from_float_sw(-x);
    if (sw != hw || (pair & 0xFF) != sw || (pair >> 8) != sw_neg) {
      if (atomicAdd(mismatches, 1ull) == 0) *first = b;
    }
    if (hw == 0x7F) atomicAdd(nan_outputs, 1ull);  // positive control: the loop really ran
  }
}

__global__ void half_exhaustive(unsigned long long* mismatches, uint32_t* first) {
  const uint32_t h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= 65536) return;
  const float sw = megamoe::core::half_to_float(static_cast<uint16_t>(h));
  const float hw = __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
  const bool both_nan = sw != sw && hw != hw;
  if (!both_nan && __float_as_uint(sw) != __float_as_uint(hw)) {
    if (atomicAdd(mismatches, 1ull) == 0) *first = h;
  }
}

/// Scalar rule on widened values; false when a NaN result is acceptable (both NaN).
template <megamoe::cuda::Half2Kind K>
__device__ float scalar_rule(uint16_t a, uint16_t b) {
  using megamoe::core::abs_bits;
  const float fa = K == megamoe::cuda::Half2Kind::kBF16 ? megamoe::core::bf16_to_float(a)
                                                         : megamoe::core::half_to_float(a);
  const float fb = K == megamoe::cuda::Half2Kind::kBF16 ? megamoe::core::bf16_to_float(b)
                                                         : megamoe::core::half_to_float(b);
  return megamoe::core::fmax_nan_ignoring(abs_bits(fa), abs_bits(fb));
}

template <megamoe::cuda::Half2Kind K>
__global__ void packed_amax_exhaustive(unsigned long long* mismatches, uint32_t* first,
                                       unsigned long long* nan_results) {
  using namespace megamoe::cuda;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const uint32_t a = static_cast<uint32_t>(i) & 0xFFFFu, b = static_cast<uint32_t>(i >> 16);
    // Lane 0 gets (a, b), lane 1 gets (b, a): both lanes and both operand orders.
    const uint32_t m = abs_max2<K>(a | (b << 16), b | (a << 16));
    const uint32_t x = abs_max2_xorsign<K>(a | (b << 16), b | (a << 16));
    const float want = scalar_rule<K>(static_cast<uint16_t>(a), static_cast<uint16_t>(b));
    const uint32_t words[1] = {m}, pair[2] = {a | (b << 16), b | (a << 16)};
    const float lane0 = widen<K>(m, 0), lane1 = widen<K>(m, 1), both = abs_max_packed<K>(words);
    const float xs0 = fabsf(widen<K>(x, 0)), xs1 = fabsf(widen<K>(x, 1)), tree = abs_max_packed<K>(pair);
    bool ok;
    if (want != want) {
      ok = lane0 != lane0 && lane1 != lane1 && xs0 != xs0 && xs1 != xs1 && tree != tree;
      atomicAdd(nan_results, 1ull);
    } else {
      ok = __float_as_uint(lane0) == __float_as_uint(want) && __float_as_uint(lane1) == __float_as_uint(want) &&
           __float_as_uint(both) == __float_as_uint(want) && __float_as_uint(xs0) == __float_as_uint(want) &&
           __float_as_uint(xs1) == __float_as_uint(want) && __float_as_uint(tree) == __float_as_uint(want);
    }
    if (!ok && atomicAdd(mismatches, 1ull) == 0) *first = static_cast<uint32_t>(i);
  }
}

/// Mismatch count, first mismatching pattern and a positive-control count of one kernel.
struct Tally {
  unsigned long long mismatches = ~0ull, positives = 0;
  uint32_t first = 0;
};

/// Runs kernel<<<132 * 16, 256>>>(mismatches, first, positives) and reads the tally back.
template <typename Kernel>
Tally run_exhaustive(Kernel kernel) {
  Tally t;
  unsigned long long* d_counts = nullptr;
  uint32_t* d_first = nullptr;
  if (cudaMalloc(&d_counts, 16) != cudaSuccess || cudaMalloc(&d_first, 4) != cudaSuccess) return t;
  cudaMemset(d_counts, 0, 16);
  cudaMemset(d_first, 0, 4);
  kernel<<<132 * 16, 256>>>(d_counts, d_first, d_counts + 1);
  if (cudaGetLastError() == cudaSuccess) {
    unsigned long long c[2] = {~0ull, 0};
    if (cudaMemcpy(c, d_counts, 16, cudaMemcpyDeviceToHost) == cudaSuccess) {
      t.mismatches = c[0];
      t.positives = c[1];
    }
    cudaMemcpy(&t.first, d_first, 4, cudaMemcpyDeviceToHost);
  }
  cudaFree(d_counts);
  cudaFree(d_first);
  return t;
}

template <megamoe::cuda::Half2Kind K>
void check_packed_amax(uint64_t nan_patterns) {
  const Tally t = run_exhaustive(packed_amax_exhaustive<K>);
  EXPECT_EQ(t.mismatches, 0ull) << "first mismatching pair (b << 16 | a) 0x" << std::hex << t.first;
  // Positive control: the NaN-NaN pairs, (NaN patterns)^2 of them, and only those.
  EXPECT_EQ(t.positives, nan_patterns * nan_patterns);
}

TEST(CudaNumerics, PackedAmaxMatchesScalarRuleBF16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_packed_amax<megamoe::cuda::Half2Kind::kBF16>(2 * 127);  // exp 0xFF, mantissa != 0
}

TEST(CudaNumerics, PackedAmaxMatchesScalarRuleF16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_packed_amax<megamoe::cuda::Half2Kind::kF16>(2 * 1023);
}

TEST(CudaNumerics, Fp8HardwareMatchesSoftwareOnAllFloats) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Tally t = run_exhaustive(fp8_exhaustive<false>);
  EXPECT_EQ(t.mismatches, 0ull) << "first mismatching fp32 bits 0x" << std::hex << t.first;
  // Every fp32 NaN (2 signs x (2^23 - 1) payloads) and nothing else gives 0x7F.
  EXPECT_EQ(t.positives, 2ull * ((1ull << 23) - 1));
}

TEST(CudaNumerics, E5m2HardwareMatchesSoftwareOnAllFloats) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Tally t = run_exhaustive(fp8_exhaustive<true>);
  EXPECT_EQ(t.mismatches, 0ull) << "first mismatching fp32 bits 0x" << std::hex << t.first;
  EXPECT_EQ(t.positives, 2ull * ((1ull << 23) - 1));  // every fp32 NaN, and nothing else, gives 0x7F
}

// The hardware fp16 -> fp32 conversion (used for fp16 hidden states, where only amax and
// the fp8 result matter) equals the software rule bit for bit except on NaNs, where only
// NaN-ness is compared: the hardware canonicalizes payloads, which is why top-k weights
// (copied bit-exactly) use the software rule (CudaStage tests keep payload NaN weights).
TEST(CudaNumerics, HalfToFloatMatchesHardware) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  unsigned long long* d_count;
  uint32_t* d_first;
  ASSERT_EQ(cudaMalloc(&d_count, 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_first, 4), cudaSuccess);
  cudaMemset(d_count, 0, 8);
  cudaMemset(d_first, 0, 4);  // written only on a mismatch, read back always
  half_exhaustive<<<256, 256>>>(d_count, d_first);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  unsigned long long count = 0;
  uint32_t first = 0;
  ASSERT_EQ(cudaMemcpy(&count, d_count, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaMemcpy(&first, d_first, 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(count, 0ull) << "first mismatching half bits 0x" << std::hex << first;
  cudaFree(d_count);
  cudaFree(d_first);
}

}  // namespace

// The fast kernels' vector forms of a 16-element chunk (src/cuda/kernels/chunk.cuh: the fmaxf tree
// of fp32 chunks, the packed amax of 16-bit ones, the x2 fp8 conversion, the nibble packing,
// the non-finite count) against the scalar core rules element by element, on chunks of
// random bit patterns (a third of them specials: NaN, Inf, zeros, subnormals; some all-NaN
// chunks, whose amax is where the vector form differs, harmlessly).
namespace {

__device__ uint32_t mix(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

template <int In, megamoe::core::Format F>
__global__ void chunk_forms(uint64_t n, unsigned long long* mismatches, uint32_t* first, unsigned long long* specials) {
  namespace mcu = megamoe::cuda;
  namespace core = megamoe::core;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    mcu::RawChunk<In> c;
    for (int k = 0; k < mcu::RawChunk<In>::kWords; ++k) {
      uint32_t r = mix(i * 64 + k);
      const uint32_t kind = mix(i * 64 + 32 + k) % 6;
      if (In == mcu::kInF32) {
        if (kind == 0) r |= 0x7F800000u;                 // Inf or NaN
        else if (kind == 1) r &= 0x807FFFFFu;            // zero or subnormal
        else if (kind >= 3) r = (r & 0x807FFFFFu) | ((100u + r % 56u) << 23);  // moderate
      } else {
        const uint32_t special = In == mcu::kInBF16 ? 0x7F807F80u : 0x7C007C00u;
        if (kind == 0) r |= special;
        else if (kind == 1) r &= ~special;
        else if (kind >= 3 && In == mcu::kInBF16) {  // moderate: the fp4 paired paths' range
          r = (r & 0x807F807Fu) | ((100u + r % 56u) << 7) | ((100u + (r >> 8) % 56u) << 23);
        }
      }
      c.w[k] = r;
      if (i % 4096 == 7) c.w[k] = In == mcu::kInF32 ? 0xFFC00001u : (In == mcu::kInBF16 ? 0x7FC1FFC2u : 0x7E01FE02u);
    }
    uint32_t nf = 0, nans = 0;
    float amax = 0.0f;  // the CPU backend's fold from 0
    for (int k = 0; k < 16; ++k) {
      const float x = mcu::element<In>(c, k);
      amax = core::fmax_nan_ignoring(amax, core::abs_bits(x));
      nf += core::non_finite(x) ? 1u : 0u;
      nans += x != x ? 1u : 0u;
    }
    // chunk_amax: the same, except NaN when every element is NaN (see chunk.cuh) ...
    const float vec_amax = mcu::chunk_amax<In>(c);
    bool ok = nans == 16 ? vec_amax != vec_amax : __float_as_uint(vec_amax) == __float_as_uint(amax);
    ok = ok && mcu::chunk_nonfinite<In>(c) == nf;
    // ... which gives the same group parameters (the row kernel of NVFP4 per-token folds
    // from 0 itself); a second-level scale for the NVFP4 formats.
    const float kernel_amax = F == core::Format::kNvfp4PerToken ? fmaxf(0.0f, vec_amax) : vec_amax;
    const core::GroupParams gp = core::group_params<F>(amax, core::kAmaxFloor, 0.01f);
    const core::GroupParams kp = core::group_params<F>(kernel_amax, core::kAmaxFloor, 0.01f);
    ok = ok && gp.sf == kp.sf && __float_as_uint(gp.m) == __float_as_uint(kp.m);
    const mcu::Encoded<F> e = mcu::encode_chunk<F, In>(c, gp);
    constexpr int kBits = core::values_per_byte(F) == 1 ? 8 : 4;
    for (int k = 0; k < 16; ++k) {
      const uint32_t got = (e.w[k * kBits / 32] >> ((k * kBits) % 32)) & ((1u << kBits) - 1u);
      ok = ok && got == core::encode<F>(mcu::element<In>(c, k), gp);
    }
    if (nf != 0) atomicAdd(specials, 1ull);
    if (!ok && atomicAdd(mismatches, 1ull) == 0) *first = static_cast<uint32_t>(i);
  }
}

template <int In, megamoe::core::Format F>
void check_chunk_forms() {
  unsigned long long* d = nullptr;
  uint32_t* first = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&first, 4), cudaSuccess);
  cudaMemset(d, 0, 16);
  cudaMemset(first, 0, 4);  // written only on a mismatch, read back always
  const uint64_t n = uint64_t{1} << 20;
  chunk_forms<In, F><<<264, 256>>>(n, d, first, d + 1);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  unsigned long long c[2] = {~0ull, 0};
  uint32_t f = 0;
  ASSERT_EQ(cudaMemcpy(c, d, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaMemcpy(&f, first, 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(c[0], 0ull) << "first mismatching chunk " << f;
  EXPECT_GT(c[1], n / 4) << "too few chunks with specials";
  cudaFree(d);
  cudaFree(first);
}

TEST(CudaNumerics, ChunkVectorFormsMatchTheCoreRules) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using megamoe::core::Format;
  namespace mcu = megamoe::cuda;
  check_chunk_forms<mcu::kInBF16, Format::kFp8Ue8m0>();
  check_chunk_forms<mcu::kInF16, Format::kFp8Fp32>();
  check_chunk_forms<mcu::kInF32, Format::kFp8Ue8m0>();
  check_chunk_forms<mcu::kInBF16, Format::kMxfp4>();
  check_chunk_forms<mcu::kInF16, Format::kMxfp4Rne>();
  check_chunk_forms<mcu::kInF32, Format::kNvfp4Static>();
  check_chunk_forms<mcu::kInBF16, Format::kNvfp4PerToken>();
  check_chunk_forms<mcu::kInBF16, Format::kMxfp4Rne>();
  check_chunk_forms<mcu::kInBF16, Format::kNvfp4Static>();
}

// formats/e2m1/pairs.h (MXFP4 before sm_89) on the device against core::encode, every non-NaN
// bf16 in the low half (the high half a fixed partner) for every MXFP4 exponent in range.
template <megamoe::core::Format F>
__global__ void pairs_exhaustive(uint32_t params, unsigned long long* mismatches, uint32_t* first) {
  namespace core = megamoe::core;
  const uint64_t n = uint64_t{params} << 16;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(i & 0xFFFFu), j = static_cast<uint32_t>(i >> 16);
    if ((bits & 0x7FFFu) > 0x7F80u) continue;  // NaN: the caller's per-value path
    const uint32_t e = core::kPairsMinE + j;
    const core::GroupParams gp{e, core::ue8m0_inv_scale(e)};
    const core::E2m1PairKeys k = core::e2m1_pair_keys<F == core::Format::kMxfp4Rne>(e);
    const uint32_t partner = 0xBFC0u;  // -1.5
    const uint32_t got = core::e2m1_pair_nibbles<F == core::Format::kMxfp4Rne>(bits | (partner << 16), k);
    const uint32_t want_lo = core::encode<F>(__uint_as_float(bits << 16), gp);
    const uint32_t want_hi = core::encode<F>(__uint_as_float(partner << 16), gp);
    if (got != (want_lo | (want_hi << 16)) && atomicAdd(mismatches, 1ull) == 0) *first = static_cast<uint32_t>(i);
  }
}

/// A mismatch count and the first mismatching index, as a check kernel leaves them.
struct Mismatches {
  unsigned long long count = ~0ull;
  uint32_t first = 0;
};

/// Runs launch(count, first) on a zeroed device counter and index word, then reads them.
template <typename Launch>
Mismatches count_mismatches(Launch launch) {
  Mismatches m;
  unsigned long long* d = nullptr;
  uint32_t* first = nullptr;
  if (cudaMalloc(&d, 8) != cudaSuccess || cudaMalloc(&first, 4) != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc";
    return m;
  }
  cudaMemset(d, 0, 8);
  cudaMemset(first, 0, 4);  // written only on a mismatch, read back always
  launch(d, first);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(&m.count, d, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaMemcpy(&m.first, first, 4, cudaMemcpyDeviceToHost);
  cudaFree(d);
  cudaFree(first);
  return m;
}

template <megamoe::core::Format F>
void check_pairs(uint32_t params) {
  const Mismatches m = count_mismatches(
      [&](unsigned long long* d, uint32_t* first) { pairs_exhaustive<F><<<264, 256>>>(params, d, first); });
  EXPECT_EQ(m.count, 0ull) << "first mismatch: index " << m.first << " (bf16 0x" << std::hex << (m.first & 0xFFFFu)
                           << ", row " << std::dec << (m.first >> 16) << ")";
}

TEST(CudaNumerics, Fp4PairsMatchTheCoreRules) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using megamoe::core::Format;
  const uint32_t exponents = megamoe::core::kPairsMaxE - megamoe::core::kPairsMinE + 1;
  check_pairs<Format::kMxfp4>(exponents);
  check_pairs<Format::kMxfp4Rne>(exponents);
}

// formats/e2m1/f16.h with the device's instructions (fma.rm, cvt.rz/rn f16x2, add.sat.f16x2)
// against core::encode: every bf16 pattern (NaN included) for divisors of every binade in
// range (a pseudo-random significand each), at a position of the chunk that moves, the
// other 15 values pseudo-random ones around the group's midpoints times d.
/// Chunk i of an exhaustive NVFP4 static sweep at divisor d (index j): bf16 pattern @p bits
/// at a position that moves with j, the other 15 values |x| = d * 2^(-3 .. 3) times a random
/// 8-bit significand, either sign; as the chunk's 8 words (w) and its 16 values (v).
__device__ void static_sweep_chunk(uint64_t i, uint32_t j, uint32_t bits, float d, uint16_t (&v)[16],
                                   uint32_t (&w)[8]) {
  const uint32_t pos = (j + (bits >> 12)) % 16u;
  for (uint32_t k = 0; k < 16; ++k) {
    const uint32_t r = mix(i * 16 + k);
    const uint32_t ex = ((__float_as_uint(d) >> 23) + 253u + r % 7u) & 0xFFu;
    v[k] = static_cast<uint16_t>(k == pos ? bits : (r & 0x807Fu) | (ex << 7));
  }
  for (int k = 0; k < 8; ++k) w[k] = v[2 * k] | (static_cast<uint32_t>(v[2 * k + 1]) << 16);
}

/// The 16 nibbles of @p out equal core::encode of NVFP4 static with divisor d.
__device__ bool static_codes_match(const uint16_t (&v)[16], const uint32_t (&out)[2], float d) {
  const megamoe::core::GroupParams gp{0u, d};
  bool ok = true;
  for (int k = 0; k < 16; ++k) {
    ok = ok && ((out[k / 8] >> (4 * (k % 8))) & 0xFu) ==
                   megamoe::core::encode<megamoe::core::Format::kNvfp4Static>(__uint_as_float(uint32_t{v[k]} << 16), gp);
  }
  return ok;
}

__global__ void f16_chunks_exhaustive(unsigned long long* mismatches, uint32_t* first) {
  namespace core = megamoe::core;
  const uint64_t n = uint64_t{200} << 16;  // binades 2^-100 .. 2^99
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(i & 0xFFFFu), j = static_cast<uint32_t>(i >> 16);
    const float d = __uint_as_float(((27u + j) << 23) | (mix(j) & 0x7FFFFFu));
    uint16_t v[16];
    uint32_t w[8], out[2];
    static_sweep_chunk(i, j, bits, d, v, w);
    core::e2m1_f16_chunk(w, core::e2m1_f16_keys(d), out);
    if (!static_codes_match(v, out, d) && atomicAdd(mismatches, 1ull) == 0) *first = static_cast<uint32_t>(i);
  }
}

TEST(CudaNumerics, Nvfp4F16ChunksMatchTheCoreRules) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Mismatches m = count_mismatches(
      [](unsigned long long* d, uint32_t* first) { f16_chunks_exhaustive<<<528, 256>>>(d, first); });
  EXPECT_EQ(m.count, 0ull) << "first mismatch: index " << m.first << " (bf16 0x" << std::hex << (m.first & 0xFFFFu)
                           << ", binade " << std::dec << (m.first >> 16) << ")";
}


// formats/e2m1/fp32.h with the device's instructions (fma.rm.sat, cvt e5m2x2, prmt) against
// core::encode: every bf16 pattern (nearest even: every non-NaN one) for every exponent in
// range, at a position of the chunk that moves with the exponent, the other 15 values
// pseudo-random patterns of the moderate range.
template <bool kEven>
__global__ void fp32_chunks_exhaustive(unsigned long long* mismatches, uint32_t* first) {
  namespace core = megamoe::core;
  constexpr core::Format F = kEven ? core::Format::kMxfp4Rne : core::Format::kMxfp4;
  const uint64_t n = uint64_t{core::kFp32MaxE - core::kFp32MinE + 1} << 16;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(i & 0xFFFFu), j = static_cast<uint32_t>(i >> 16);
    if (kEven && (bits & 0x7FFFu) > 0x7F80u) continue;  // NaN: the caller's per-value path
    const uint32_t e = core::kFp32MinE + j, pos = (j + (bits >> 12)) % 16u;
    uint16_t v[16];
    for (uint32_t k = 0; k < 16; ++k) {
      const uint32_t r = mix(i * 16 + k);
      v[k] = static_cast<uint16_t>(k == pos ? bits : (r & 0x807Fu) | (((e + 248u + r % 12u) & 0xFFu) << 7));
      if (kEven && (v[k] & 0x7FFFu) > 0x7F80u) v[k] = 0x3F80u;
    }
    uint32_t w[8], out[2];
    for (int k = 0; k < 8; ++k) w[k] = v[2 * k] | (static_cast<uint32_t>(v[2 * k + 1]) << 16);
    core::e2m1_fp32_chunk<kEven>(w, core::e2m1_fp32_keys(e), out);
    const core::GroupParams gp{e, core::ue8m0_inv_scale(e)};
    bool ok = true;
    for (int k = 0; k < 16; ++k) {
      ok = ok && ((out[k / 8] >> (4 * (k % 8))) & 0xFu) == core::encode<F>(__uint_as_float(uint32_t{v[k]} << 16), gp);
    }
    if (!ok && atomicAdd(mismatches, 1ull) == 0) *first = static_cast<uint32_t>(i);
  }
}

template <bool kEven>
void check_fp32_chunks() {
  const Mismatches m = count_mismatches(
      [](unsigned long long* d, uint32_t* first) { fp32_chunks_exhaustive<kEven><<<528, 256>>>(d, first); });
  EXPECT_EQ(m.count, 0ull) << (kEven ? "rne" : "ttz") << " first mismatch: index " << m.first << " (bf16 0x"
                           << std::hex << (m.first & 0xFFFFu) << ", e " << std::dec
                           << (megamoe::core::kFp32MinE + (m.first >> 16)) << ")";
}

TEST(CudaNumerics, Mxfp4Fp32ChunksMatchTheCoreRules) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_fp32_chunks<false>();
  check_fp32_chunks<true>();
}

// core::e2m1_mul_chunk (NVFP4 per-token's codec: the f16 form, below 2^-123 the fp32 one)
// with the device's instructions against core::encode: every bf16 pattern (NaN included)
// for multipliers of 254 binades (a pseudo-random significand each; binade 0 is m = 0), at
// a position that moves, the other 15 values pseudo-random ones whose products land near
// the e2m1 grid.
__global__ void mul_chunks_exhaustive(unsigned long long* mismatches, uint32_t* first) {
  namespace core = megamoe::core;
  const uint64_t n = uint64_t{254} << 16;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(i & 0xFFFFu), j = static_cast<uint32_t>(i >> 16);
    const float m = j == 0 ? 0.0f : __uint_as_float((j << 23) | (mix(j) & 0x7FFFFFu));
    const uint32_t pos = (j + (bits >> 12)) % 16u;
    uint16_t v[16];
    for (uint32_t k = 0; k < 16; ++k) {
      const uint32_t r = mix(i * 16 + k);
      // |x| = 2^(-3 .. 3) / m times a random 8-bit significand, either sign
      const uint32_t ex = (254u - j + 253u + r % 7u) & 0xFFu;
      v[k] = static_cast<uint16_t>(k == pos ? bits : (r & 0x807Fu) | (ex << 7));
    }
    uint32_t w[8], out[2];
    for (int k = 0; k < 8; ++k) w[k] = v[2 * k] | (static_cast<uint32_t>(v[2 * k + 1]) << 16);
    core::e2m1_mul_chunk(w, m, out);
    const core::GroupParams gp{0u, m};
    bool ok = true;
    for (int k = 0; k < 16; ++k) {
      ok = ok && ((out[k / 8] >> (4 * (k % 8))) & 0xFu) ==
                     core::encode<core::Format::kNvfp4PerToken>(__uint_as_float(uint32_t{v[k]} << 16), gp);
    }
    if (!ok && atomicAdd(mismatches, 1ull) == 0) *first = static_cast<uint32_t>(i);
  }
}

TEST(CudaNumerics, Nvfp4PerTokenMulChunksMatchTheCoreRules) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Mismatches m = count_mismatches(
      [](unsigned long long* d, uint32_t* first) { mul_chunks_exhaustive<<<528, 256>>>(d, first); });
  EXPECT_EQ(m.count, 0ull) << "first mismatch: index " << m.first << " (bf16 0x" << std::hex << (m.first & 0xFFFFu)
                           << ", binade " << std::dec << (m.first >> 16) << ")";
}

// core::nvfp4_static_multiplier (the loop shape's per-block table) with the device's
// instructions (rcp.rz, fma.rm, cvt of e4m3) against its host form, and the multiply form it
// feeds against core::encode: for divisors of every binade in range (a pseudo-random
// significand each) and every e4m3 scale byte times a few global scales, formed on the device
// as the kernel forms them, the device's multiplier bitwise equal to the host's, and where
// there is one, every bf16 pattern (NaN included) at a moving position coded as fl(x / d).
__global__ void static_mul_chunks_exhaustive(const float* ds, const uint32_t* host_r, uint32_t nd,
                                             unsigned long long* mismatches, uint32_t* first) {
  namespace core = megamoe::core;
  const uint64_t n = uint64_t{nd} << 16;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(i & 0xFFFFu), j = static_cast<uint32_t>(i >> 16);
    const float d = ds[j];
    const float r = core::nvfp4_static_multiplier(d);
    bool ok = __float_as_uint(r) == host_r[j];
    if (ok && r != 0.0f) {
      uint16_t v[16];
      uint32_t w[8], out[2];
      static_sweep_chunk(i, j, bits, d, v, w);
      core::e2m1_f16_mul_chunk(w, r, out);
      ok = static_codes_match(v, out, d);
    }
    if (!ok && atomicAdd(mismatches, 1ull) == 0) *first = static_cast<uint32_t>(i);
  }
}

/// The divisors of the scale bytes as the loop kernel forms them, and the e4m3 decode itself.
__global__ void scale_byte_divisors(const float* gs, uint32_t ngs, float* ds, uint32_t* e4m3_bits) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 256u) e4m3_bits[i] = __float_as_uint(megamoe::core::e4m3_to_float(i));
  if (i < ngs * 128u) ds[i] = megamoe::core::nvfp4_static_divisor(i % 128u, gs[i / 128u]);
}

TEST(CudaNumerics, Nvfp4StaticMultipliersMatchTheHostAndTheCoreRules) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  namespace core = megamoe::core;
  const std::vector<float> gs = {1.0f, 0.37f, 0x1p-7f, 3.0e-3f, 1.7e4f};
  std::vector<float> ds(gs.size() * 128);
  std::vector<uint32_t> e4m3(256);
  float *d_gs = nullptr, *d_ds = nullptr;
  uint32_t *d_bits = nullptr, *d_r = nullptr;
  const size_t nd = ds.size() + 200;
  ASSERT_EQ(cudaMalloc(&d_gs, gs.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_ds, nd * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_bits, 256 * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_r, nd * 4), cudaSuccess);
  cudaMemcpy(d_gs, gs.data(), gs.size() * 4, cudaMemcpyHostToDevice);
  scale_byte_divisors<<<(static_cast<uint32_t>(ds.size()) + 255) / 256, 256>>>(d_gs, static_cast<uint32_t>(gs.size()),
                                                                              d_ds, d_bits);
  ASSERT_EQ(cudaMemcpy(ds.data(), d_ds, ds.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(e4m3.data(), d_bits, 256 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint32_t b = 0; b < 256; ++b) {
    const float host = core::e4m3_to_float(b);
    if (host != host) {
      EXPECT_EQ(e4m3[b] & 0x7FFFFFFFu, 0x7FC00000u) << b;
    } else {
      EXPECT_EQ(e4m3[b], core::float_bits(host)) << b;
    }
  }
  for (size_t k = 0; k < ds.size(); ++k) {  // (byte 0x7F: a NaN, whose bits the device chooses)
    const float host = core::nvfp4_static_divisor(static_cast<uint32_t>(k % 128), gs[k / 128]);
    if (host != host) {
      EXPECT_NE(ds[k], ds[k]) << k;
    } else {
      EXPECT_EQ(core::float_bits(ds[k]), core::float_bits(host)) << k;
    }
  }
  uint32_t seed = 20261203u;
  for (uint32_t j = 0; j < 200; ++j) {  // binades 2^-100 .. 2^99
    seed = seed * 1664525u + 1013904223u;
    ds.push_back(core::bits_float(((27u + j) << 23) | (seed >> 9)));
  }
  std::vector<uint32_t> r(nd);
  int64_t none = 0;
  for (size_t k = 0; k < nd; ++k) {
    r[k] = core::float_bits(core::nvfp4_static_multiplier(ds[k]));
    none += r[k] == 0u ? 1 : 0;
  }
  EXPECT_LT(none * 20, static_cast<int64_t>(nd));  // bytes 0 and 0x7F of each global scale, and the rare others
  cudaMemcpy(d_ds, ds.data(), nd * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_r, r.data(), nd * 4, cudaMemcpyHostToDevice);
  const Mismatches m = count_mismatches([&](unsigned long long* c, uint32_t* first) {
    static_mul_chunks_exhaustive<<<528, 256>>>(d_ds, d_r, static_cast<uint32_t>(nd), c, first);
  });
  EXPECT_EQ(m.count, 0ull) << "first mismatch: index " << m.first << " (bf16 0x" << std::hex << (m.first & 0xFFFFu)
                           << ", divisor " << std::hexfloat << ds[m.first >> 16] << ")";
  cudaFree(d_gs);
  cudaFree(d_ds);
  cudaFree(d_bits);
  cudaFree(d_r);
}

}  // namespace
