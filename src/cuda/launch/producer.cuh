// producer.cuh: host side shared by the producers' launch units (norm.cu, mhc.cu), whose
// kernel computes bf16 rows y and stages them in the same launch (every format but NVFP4
// online), or writes them for a staging launch that follows (NVFP4 online, whose global
// scale needs every row first).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "contract/validate.h"
#include "core/checked.h"
#include "cuda/launch/aligned.cuh"
#include "cuda/launch/launch_util.cuh"
#include "formats/visit.h"
#include "megamoe/error.h"
#include "megamoe/stage.h"

namespace megamoe {
namespace cuda {

void prepare_inputs(const StageArgs& args, const detail::Problem& p, Stream stream);

namespace {

/// The rows a two-launch call writes and then stages: y when the call has it, else
/// stream-ordered scratch [T, H] bf16 on @p dev; @p none when there are no rows (T == 0:
/// the staging reads none). @p who names the producer in errors.
TensorRef rows_to_stage(const std::optional<TensorRef>& y, int64_t T, int64_t H, const Device& dev,
                        const TensorRef& none, StreamScratch& scratch, const std::string& who) {
  if (y) return *y;
  if (T == 0 || H == 0) return none;
  const core::Checked bytes = core::Checked(T) * H * 2;  // the input's element count fits (validated)
  if (!bytes.ok()) throw Error(ErrorCode::kInternal, "megamoe: " + who + ": scratch size overflows");
  const std::string what = "cudaMallocAsync (" + who + " rows)";
  return TensorRef(scratch.get(static_cast<size_t>(bytes.value()), what.c_str()), DType::kBFloat16, {T, H}, dev);
}

/// The staging launch of a two-launch call, of @p rows: stream-ordered after the producer
/// kernel, never PDL-chained to it (its vectorized loads of the rows take the non-coherent
/// read-only path, which only a kernel boundary makes see the producer's writes).
void stage_rows_after(const TensorRef& rows, const StageArgs& s, const detail::Problem& sp, Stream stream) {
  StageArgs staged = detail::staged_args(rows, s);
  staged.enable_pdl = false;
  prepare_inputs(staged, sp, stream);
}

/// @p kernel(args...) on @p grid blocks of @p threads with @p smem bytes of dynamic shared
/// memory (the kernel's limit raised to it first).
template <typename Kernel, typename... Args>
void launch_with_smem(Kernel kernel, int64_t grid, int threads, int64_t smem, bool pdl, Stream stream,
                      const char* what, const Args&... args) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
             what);
  launch_ex(kernel, grid, threads, smem, pdl, static_cast<cudaStream_t>(stream), what, args...);
}

/// fn(FormatTag<F>{}) for a format the fused kernels stage row by row (every one but NVFP4
/// online: an internal error, the caller runs two launches for it).
template <typename Fn>
void visit_fused_format(core::Format fmt, const char* who, Fn&& fn) {
  core::visit_format(fmt, [&](auto tag) {
    if constexpr (core::online_scaled(decltype(tag)::value)) {
      throw Error(ErrorCode::kInternal, std::string("megamoe: internal: ") + who + ": NVFP4 online has no fused kernel");
    } else {
      fn(tag);
    }
  });
}

/// run(a, s, p) on the tensors' device (@p device): directly, or, when a tensor of either
/// argument set is off its element size, on aligned copies of every such tensor (the
/// staging inside then sees only aligned tensors; aligned.cuh).
template <typename Args, typename Problem, typename Run>
void run_producer(const Args& a, const StageArgs& s, const Problem& p, int device, Stream stream, Run run) {
  const DeviceGuard guard(device);
  if (!p.misaligned) return run(a, s, p);
  Problem q = p;
  q.misaligned = false;
  q.stage.misaligned = false;
  struct Call {
    Args a;
    StageArgs s;
  };
  run_on_aligned_copies(
      Call{a, s}, device, stream, [](const Call& c) { return detail::named_tensors(c.a, c.s); },
      [&](const Call& c) { run(c.a, c.s, q); });
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
