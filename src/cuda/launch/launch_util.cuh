// launch_util.cuh: host side shared by the launch units (stage_cuda.cu, launch_*.cu):
// CUDA error checks, the kernel parameter block built from a call and its plan, and the
// one launch helper (cudaLaunchKernelEx, with the PDL attribute when the plan says so).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/fastdiv.h"
#include "core/layout.h"
#include "cuda/kernels/common.cuh"
#include "cuda/policy/plan.h"
#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "contract/validate.h"

namespace megamoe {
namespace cuda {
namespace {

/// Throws Error(kCuda) naming @p what when @p e is an error. The error is also taken off
/// the runtime's per-thread "last error" slot, so that a failure of ours is not reported
/// again by the caller's next unrelated cudaGetLastError.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw Error(ErrorCode::kCuda, std::string("megamoe: CUDA error in ") + what + ": " + cudaGetErrorName(e) + " (" +
                                    cudaGetErrorString(e) + ")");
}

/// Makes @p device current for the scope (the caller's device is restored).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

/// One stream-ordered scratch allocation of a call (cudaMallocAsync), freed on the stream
/// when the call's scope ends, after its launches (or on an error: then nothing reads it).
/// A CUDA graph captures it as allocation and free nodes.
class StreamScratch {
 public:
  explicit StreamScratch(Stream s) : stream_(static_cast<cudaStream_t>(s)) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (ptr_ != nullptr && cudaFreeAsync(ptr_, stream_) != cudaSuccess) (void)cudaGetLastError();
  }
  /// @p bytes of device memory (256-byte aligned); @p what names it in an error.
  char* get(size_t bytes, const char* what) {
    check_cuda(cudaMallocAsync(&ptr_, bytes, stream_), what);
    return static_cast<char*>(ptr_);
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

/// Launch @p kernel(args...) on @p grid blocks of @p threads with @p smem bytes of dynamic
/// shared memory, PDL-chained to the previous launch when @p pdl. Throws Error(kCuda)
/// naming @p what when the launch fails.
template <typename Kernel, typename... Args>
void launch_ex(Kernel kernel, int64_t grid, int threads, int64_t smem, bool pdl, cudaStream_t stream, const char* what,
               const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, args...), what);
}

/// Launch @p kernel with the plan's grid, block and PDL choice. A launch that fails (a bad
/// configuration, or a sticky error left by an earlier fault in this context) throws
/// Error(kCuda); faults inside the kernel surface later, asynchronously.
template <typename Kernel, typename P>
void launch_kernel(Kernel kernel, const P& prm, const Plan& plan, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(plan.grid));
  cfg.blockDim = dim3(static_cast<unsigned>(plan.threads));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = plan.pdl ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, prm), "cudaLaunchKernelEx(staging)");
}

/// The kernel parameters in index type Idx. For uint32_t, fits_idx32 has checked that every
/// offset, hence every stride of a dimension longer than 1, fits; strides of length-1
/// dimensions only ever multiply 0, so their truncation is harmless.
template <typename Idx>
ParamsT<Idx> make_params(const StageArgs& a, const detail::Problem& p, const Plan& plan) {
  auto I = [](int64_t v) { return static_cast<Idx>(v); };
  auto fastdiv_of = [](int64_t d) {  // used where d fits: the 32-bit modes, K where n_topk < 2^32 (topk_row_of)
    return core::make_fastdiv(static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(d, 0xFFFFFFFF))));
  };
  constexpr int64_t kChunkElems = 16;
  ParamsT<Idx> prm = {};
  prm.hs = a.hidden_states.data;
  prm.hs_s0 = I(a.hidden_states.strides[0]);
  prm.hs_s1 = I(a.hidden_states.strides[1]);
  prm.ids = a.topk_ids.data;
  prm.ids_s0 = I(a.topk_ids.strides[0]);
  prm.ids_s1 = I(a.topk_ids.strides[1]);
  prm.w = a.topk_weights.data;
  prm.w_s0 = I(a.topk_weights.strides[0]);
  prm.w_s1 = I(a.topk_weights.strides[1]);
  if (a.is_padding) {
    prm.pad = static_cast<const uint8_t*>(a.is_padding->data);
    prm.pad_s0 = I(a.is_padding->strides[0]);
  }
  prm.xq = static_cast<uint8_t*>(a.x_q.data);
  prm.xq_s0 = I(a.x_q.strides[0]);
  prm.xq_s1 = I(a.x_q.strides[1]);
  prm.sf = a.x_sf.data;
  prm.sf_s0 = I(a.x_sf.strides[0]);
  prm.sf_s1 = I(a.x_sf.strides[1]);
  if (a.shared_x_sf) {
    prm.shared_sf = static_cast<uint32_t*>(a.shared_x_sf->data);
    prm.sh_s0 = I(a.shared_x_sf->strides[0]);
    prm.sh_s1 = I(a.shared_x_sf->strides[1]);
    prm.shared_bm = I(p.shared_bm);
    prm.abm = I(core::aligned_block_m(p.shared_bm));
    prm.bm_div = fastdiv_of(p.shared_bm);
  }
  prm.idx_out = static_cast<int64_t*>(a.topk_idx_out.data);
  prm.io_s0 = I(a.topk_idx_out.strides[0]);
  prm.io_s1 = I(a.topk_idx_out.strides[1]);
  prm.w_out = static_cast<float*>(a.topk_weights_out.data);
  prm.wo_s0 = I(a.topk_weights_out.strides[0]);
  prm.wo_s1 = I(a.topk_weights_out.strides[1]);
  prm.floor = p.floor;
  if (a.global_scale) prm.gscale = static_cast<const float*>(a.global_scale->data);
  if (a.x_scales) {
    prm.x_scales = static_cast<float*>(a.x_scales->data);
    prm.xs_s0 = I(a.x_scales->strides[0]);
  }
  if (a.nonfinite_count) prm.nonfinite = static_cast<unsigned long long*>(a.nonfinite_count->data);
  prm.T = I(p.T);
  prm.H = I(p.H);
  prm.K = I(p.K);
  prm.G = I(p.G);
  prm.n_topk = I((plan.fused_tail ? p.M : p.T) * p.K);
  prm.alpha = p.alpha;
  if (a.expert_scales) {
    prm.escale = static_cast<const float*>(a.expert_scales->data);
    prm.es_s0 = a.expert_scales->strides[0];
    prm.n_experts = p.E;
  }
  prm.k_div = fastdiv_of(p.K);
  prm.cpr = I(p.H / kChunkElems);
  prm.n_chunks = I(p.T * (p.H / kChunkElems));
  prm.cpr_div = fastdiv_of(p.H / kChunkElems);
  prm.quant_blocks = static_cast<uint32_t>(plan.quant_blocks);
  if (plan.shape == Shape::kTile) {
    const int64_t segs = (p.H / kChunkElems + 31) / 32;
    prm.n_tiles = I((p.T + kTileTokens - 1) / kTileTokens * segs);
    prm.seg_div = fastdiv_of(segs);
  }
  prm.flags = (plan.pdl ? kFlagPdl : 0u) |  // griddepcontrol only when launched with PDL
              (a.topk_ids.dtype == DType::kInt64 ? kFlagIdsI64 : 0u) |
              (a.topk_weights.dtype == DType::kBFloat16 ? kFlagWBF16 : 0u) |
              (a.topk_weights.dtype == DType::kFloat16 ? kFlagWF16 : 0u) |
              (p.has_alpha ? kFlagAlpha : 0u) | (p.has_expert_scales ? kFlagExpertScales : 0u) |
              (plan.unit_gs ? kFlagUnitGs : 0u);
  return prm;
}

/// Kernel input dtype as the kernels' InKind.
inline int in_kind(DType d) { return d == DType::kBFloat16 ? kInBF16 : d == DType::kFloat16 ? kInF16 : kInF32; }

}  // namespace

// The launch units (one per kernel family, compiled in parallel). Each takes a plan that
// check_plan has accepted.
void launch_fast_ue8m0(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream);
void launch_fast_fp32_nvfp4(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream);
void launch_generic(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream);
void launch_rowwise(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream);
void launch_copy(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream);
/// NVFP4 online's amax launch (and the memset before it when the plan has one): gs into
/// global_scale (online.cu).
void launch_online_amax(const OnlinePlan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace megamoe
