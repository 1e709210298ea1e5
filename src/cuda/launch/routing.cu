// routing.cu: routing-only staging on CUDA (no activations): one thread per top-k entry of
// the M-row outputs; padded and tail rows get -1 / +0.0, kept weights are widened and
// multiplied by the routed scaling factor when one is given.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/numerics.h"
#include "cuda/launch/aligned.cuh"
#include "cuda/launch/launch_util.cuh"
#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "contract/validate.h"

namespace megamoe {
namespace cuda {
namespace {

struct RoutingParams {
  const void* ids;
  const void* w;
  const uint8_t* pad;  // nullable
  int64_t* idx_out;
  float* w_out;
  int64_t ids_s0, ids_s1, w_s0, w_s1, pad_s0, io_s0, io_s1, wo_s0, wo_s1;
  int64_t T, M, K;
  float alpha;
  int ids64, wkind;  // wkind: 0 fp32, 1 bf16, 2 fp16
  int has_alpha, pdl;
};

__global__ void __launch_bounds__(256) routing_kernel(const RoutingParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
  const int64_t n = p.M * p.K;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / p.K, k = e - t * p.K;
    bool keep = t < p.T;
    if (keep && p.pad != nullptr) keep = p.pad[t * p.pad_s0] == 0;
    int64_t id = -1;
    float w = 0.0f;
    if (keep) {
      const int64_t io = t * p.ids_s0 + k * p.ids_s1, wo = t * p.w_s0 + k * p.w_s1;
      id = p.ids64 ? static_cast<const int64_t*>(p.ids)[io] : static_cast<const int32_t*>(p.ids)[io];
      const uint16_t* w16 = static_cast<const uint16_t*>(p.w);
      w = p.wkind == 1 ? core::bf16_to_float(w16[wo])
          : p.wkind == 2 ? core::half_to_float(w16[wo])
                         : static_cast<const float*>(p.w)[wo];
      if (p.has_alpha) w = core::scale_weight(w, p.alpha);
    }
    p.idx_out[t * p.io_s0 + k * p.io_s1] = id;
    p.w_out[t * p.wo_s0 + k * p.wo_s1] = w;
  }
}

void routing_aligned(const RoutingArgs& a, const detail::Problem& pr, Stream stream) {
  RoutingParams p = {};
  p.ids = a.topk_ids.data;
  p.w = a.topk_weights.data;
  p.pad = a.is_padding ? static_cast<const uint8_t*>(a.is_padding->data) : nullptr;
  p.pad_s0 = a.is_padding ? a.is_padding->strides[0] : 0;
  p.idx_out = static_cast<int64_t*>(a.topk_idx_out.data);
  p.w_out = static_cast<float*>(a.topk_weights_out.data);
  p.ids_s0 = a.topk_ids.strides[0];
  p.ids_s1 = a.topk_ids.strides[1];
  p.w_s0 = a.topk_weights.strides[0];
  p.w_s1 = a.topk_weights.strides[1];
  p.io_s0 = a.topk_idx_out.strides[0];
  p.io_s1 = a.topk_idx_out.strides[1];
  p.wo_s0 = a.topk_weights_out.strides[0];
  p.wo_s1 = a.topk_weights_out.strides[1];
  p.T = pr.T;
  p.M = pr.M;
  p.K = pr.K;
  p.alpha = pr.alpha;
  p.has_alpha = pr.has_alpha ? 1 : 0;
  p.ids64 = a.topk_ids.dtype == DType::kInt64 ? 1 : 0;
  p.wkind = a.topk_weights.dtype == DType::kBFloat16 ? 1 : a.topk_weights.dtype == DType::kFloat16 ? 2 : 0;
  p.pdl = a.enable_pdl ? 1 : 0;
  const int64_t n = pr.M * pr.K;
  if (n == 0) return;
  const DeviceGuard guard(a.topk_ids.device.index);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536)));
  cfg.blockDim = dim3(256);
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = a.enable_pdl ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, routing_kernel, p), "cudaLaunchKernelEx(routing)");
}

}  // namespace

void stage_routing(const RoutingArgs& a, const detail::Problem& pr, Stream stream) {
  if (!pr.misaligned) return routing_aligned(a, pr, stream);
  run_on_aligned_copies(
      a, a.topk_ids.device.index, stream, [](const RoutingArgs& x) { return detail::named_tensors(x); },
      [&](const RoutingArgs& x) { routing_aligned(x, pr, stream); });
}

}  // namespace cuda
}  // namespace megamoe
