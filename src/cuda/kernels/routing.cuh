// routing.cuh: the routing-only kernel (stage_routing, a full-buffer tail, staging without
// activations): one thread per top-k entry of the [M, K] outputs, the staging kernels' own
// repack (topk.cuh) for rows below T, -1 / +0.0 for the tail rows T..M-1.
#pragma once

#include <cstdint>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/topk.cuh"

namespace megamoe {
namespace cuda {
namespace {

/// The routing-only kernel's parameters: the top-k fields of ParamsT, 64-bit offsets.
struct RoutingParams {
  const void* ids;
  const void* w;
  const uint8_t* pad;  // nullable
  int64_t* idx_out;
  float* w_out;
  int64_t ids_s0, ids_s1, w_s0, w_s1, pad_s0, io_s0, io_s1, wo_s0, wo_s1;
  int64_t T, M, K;
  float alpha;
  uint32_t flags;  // kFlag*: launched with PDL, ids int64, weights bf16 / fp16, alpha, expert scales
  const float* escale;
  int64_t es_s0, n_experts;
};

__global__ void __launch_bounds__(256) routing_kernel(const RoutingParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.flags & kFlagPdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
  const int64_t n = p.M * p.K;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / p.K, k = e - t * p.K;
    if (t < p.T) repack_entry(p, t, k);
    else mark_empty(p, t, k);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
