// producer.cuh: a producer kernel written only against megamoe's public device API
// (megamoe/device/stage.cuh). Its own math is a scaled copy, y = bf16(fl(x * scale)) of
// bf16 rows x; instead of writing y and launching prepare_inputs(y), it stages y itself
// (every format stage_target accepts, every staging option), with the bytes prepare_inputs
// would write. tests/cuda/test_device_api.cu holds it to that, byte for byte.
//
// One block a row, any number of threads (a power of two up to 1024): the row's values are
// recomputed on each read (the API's get(i)), which a real producer would hold in registers
// or shared memory after its own math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "megamoe/device/stage.cuh"

namespace producer_example {

namespace dev = megamoe::device;

struct Rows {
  const uint16_t* x;  ///< [T, H] bf16
  int64_t s0, s1;     ///< element strides
  float scale;
};

/// The producer's own output value h of row t: bf16(fl(x * scale)) (round to nearest even,
/// NaN as the conversion makes it), as fp32.
__device__ __forceinline__ float value(const Rows& r, int64_t t, int64_t h) {
  const float x = __uint_as_float(static_cast<uint32_t>(r.x[t * r.s0 + h * r.s1]) << 16);
  return __bfloat162float(__float2bfloat16_rn(__fmul_rn(x, r.scale)));
}

template <dev::Format F>
__global__ void scale_and_stage(const Rows r, const dev::StageTarget tg) {
  __shared__ float red[1024];
  const int64_t b = blockIdx.x;
  const int P = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  if (b >= tg.T) {  // full-buffer tail rows: one block each
    for (int64_t k = tid; k < tg.K; k += P) dev::mark_empty_entry(tg, b, k);
    return;
  }
  const int64_t t = b;
  uint32_t nf = 0;
  if constexpr (megamoe::core::passthrough(F)) {
    for (int64_t h = tid; h < tg.H; h += P) {
      const float v = value(r, t, h);
      nf += dev::count_nonfinite(v);
      dev::store_bf16(tg, t, h, static_cast<uint16_t>(__float_as_uint(v) >> 16));
    }
  } else {
    // NVFP4 per token needs the row's max |y| before any group.
    float row_amax = 0.0f;
    if constexpr (megamoe::core::row_scaled(F)) {
      float a = 0.0f;
      for (int64_t h = tid; h < tg.H; h += P) a = dev::amax_step(a, value(r, t, h));
      red[tid] = a;
      __syncthreads();
      for (int s = P / 2; s >= 1; s /= 2) {
        if (tid < s) red[tid] = fmaxf(red[tid], red[tid + s]);
        __syncthreads();
      }
      row_amax = red[0];
    }
    const float s2 = dev::second_level_scale<F>(tg, row_amax);
    if constexpr (megamoe::core::row_scaled(F)) {
      if (tid == 0) dev::store_token_scale(tg, t, s2);
    }
    for (int64_t g = tid; g < tg.H / tg.G; g += P) {
      const int64_t h0 = g * tg.G;
      const auto get = [&](int64_t i) { return value(r, t, h0 + i); };
      for (int64_t i = 0; i < tg.G; ++i) nf += dev::count_nonfinite(get(i));
      dev::store_scale<F>(tg, t, g, dev::stage_group<F>(tg, t, g, get, s2));
    }
  }
  for (int64_t k = tid; k < tg.K; k += P) dev::repack_topk(tg, t, k);
  dev::add_nonfinite(tg, nf);
}

/// Launch the producer for the validated target @p tg (device::stage_target): T row
/// blocks, then one block per full-buffer tail row.
inline cudaError_t launch_scale_and_stage(const Rows& r, const dev::StageTarget& tg, int threads,
                                          cudaStream_t stream) {
  const int64_t blocks = tg.full_buffer ? tg.M : tg.T;
  if (blocks == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  dev::visit_format(dev::format_of(tg), [&](auto tag) {
    constexpr dev::Format F = decltype(tag)::value;
    if constexpr (!megamoe::core::online_scaled(F)) {  // stage_target refuses NVFP4 online
      scale_and_stage<F><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(r, tg);
      err = cudaGetLastError();
    }
  });
  return err;
}

}  // namespace producer_example
