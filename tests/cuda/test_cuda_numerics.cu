// Exhaustive device-side checks of src/core/numerics.h: the hardware fp8 conversion
// (cvt.rn.satfinite.e4m3x2.f32, what the kernels use on sm_89+) against the portable
// software conversion (what the CPU backend uses), over all 2^32 fp32 bit patterns, in
// both halves of the x2 instruction; and fp16 -> fp32 software vs hardware for all halves.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "core/numerics.h"

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

__global__ void fp8_exhaustive(unsigned long long* mismatches, uint32_t* first,
                               unsigned long long* nan_outputs) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const uint32_t b = static_cast<uint32_t>(i);
    const float x = __uint_as_float(b);
    const uint8_t sw = megamoe::core::fp8_e4m3_from_float_sw(x);
    const uint8_t hw = megamoe::core::fp8_e4m3_from_float(x);
    const uint16_t pair = megamoe::core::fp8x2_e4m3_from_float(x, -x);
    const uint8_t sw_neg = megamoe::core::fp8_e4m3_from_float_sw(-x);
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

TEST(CudaNumerics, Fp8HardwareMatchesSoftwareOnAllFloats) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  unsigned long long *d_count, *d_nans;
  uint32_t* d_first;
  ASSERT_EQ(cudaMalloc(&d_count, 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_nans, 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_first, 4), cudaSuccess);
  cudaMemset(d_count, 0, 8);
  cudaMemset(d_nans, 0, 8);
  cudaMemset(d_first, 0, 4);
  fp8_exhaustive<<<132 * 16, 256>>>(d_count, d_first, d_nans);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  unsigned long long count = 0, nans = 0;
  uint32_t first = 0;
  ASSERT_EQ(cudaMemcpy(&count, d_count, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaMemcpy(&nans, d_nans, 8, cudaMemcpyDeviceToHost);
  cudaMemcpy(&first, d_first, 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(count, 0ull) << "first mismatching fp32 bits 0x" << std::hex << first;
  // Every fp32 NaN (2 signs x (2^23 - 1) payloads) and nothing else gives 0x7F.
  EXPECT_EQ(nans, 2ull * ((1ull << 23) - 1));
  cudaFree(d_nans);
  cudaFree(d_count);
  cudaFree(d_first);
}

TEST(CudaNumerics, HalfToFloatMatchesHardware) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  unsigned long long* d_count;
  uint32_t* d_first;
  ASSERT_EQ(cudaMalloc(&d_count, 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_first, 4), cudaSuccess);
  cudaMemset(d_count, 0, 8);
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
