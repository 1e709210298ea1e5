// aligned.cuh: CUDA tensors whose data pointer is off its element size (a 4-byte float at
// an odd address, say; strides are whole elements, so every element is off by the same
// bytes). The kernels access elements as typed words and the counters by atomics, which
// the hardware requires at multiples of their size, so such a call runs on copies: each
// such tensor's elements gathered, byte by byte, into dense device scratch (row-major, same
// shape), the call run on those, and the outputs' elements scattered back (only element
// bytes are written: the bytes between a strided tensor's elements stay the caller's).
// Everything is queued on the call's stream, so a CUDA graph captures it too (the scratch
// as allocation and free nodes, with their limits: such a graph cannot be cloned or
// instantiated twice at once). Aligned tensors, every torch tensor's case, never come here:
// the validator flags a call that has one (Problem::misaligned).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/checked.h"
#include "cuda/launch/launch_util.cuh"
#include "megamoe/error.h"
#include "contract/validate.h"

namespace megamoe {
namespace cuda {
namespace {

/// Element e (row-major over shape [rows, cols]) of a strided tensor at @p base, as bytes.
struct StridedBytes {
  uint8_t* base;
  int64_t cols, s0, s1;  // cols: 1 for rank 0 and 1 (then s1 is unused)
  int64_t es;
};

/// The first @p bytes bytes of a strided tensor's elements (row-major) between it and a
/// dense buffer: gather (to_dense) or scatter, one byte a thread-step (any alignment).
__global__ void strided_bytes_kernel(uint8_t* dense, StridedBytes t, int64_t bytes, bool to_dense) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i / t.es, b = i - e * t.es;
    const int64_t r = e / t.cols, c = e - r * t.cols;
    uint8_t* p = t.base + (r * t.s0 + c * t.s1) * t.es + b;
    if (to_dense) dense[i] = *p;
    else *p = dense[i];
  }
}

/// The copies of one call (see the file comment). move() redirects the call's own copy of
/// its arguments; finish() after the launches scatters the outputs back and frees the
/// scratch; without finish() (an error on the way) the scratch is freed and nothing is
/// written back, so the caller's buffers are untouched.
class ElementAlignedCopies {
 public:
  explicit ElementAlignedCopies(Stream stream) : stream_(static_cast<cudaStream_t>(stream)) {}
  ElementAlignedCopies(const ElementAlignedCopies&) = delete;
  ElementAlignedCopies& operator=(const ElementAlignedCopies&) = delete;
  ~ElementAlignedCopies() {
    for (const Moved& m : moved_) {
      if (cudaFreeAsync(m.scratch, stream_) != cudaSuccess) (void)cudaGetLastError();
    }
  }

  /// @p ts: tensors of the caller's copy of the arguments (validated: sizes fit).
  void move(const std::vector<detail::NamedTensor>& ts) {
    detail::move_misaligned_to_dense(ts, [&](const detail::NamedTensor& n) {
      Moved m;
      m.from = strided(*n.t);
      m.output = n.output;
      // Inputs may repeat elements (zero strides): their dense size can exceed their span.
      const core::Checked bytes = core::Checked(n.t->numel()) * m.from.es;
      if (!bytes.ok()) {
        throw Error(ErrorCode::kUnsupported, std::string("megamoe: ") + n.name +
                                                 ": too many elements for an aligned copy (its data pointer is off "
                                                 "its element size)");
      }
      m.bytes = bytes.value();
      check_cuda(cudaMallocAsync(&m.scratch, static_cast<size_t>(m.bytes), stream_),
                 "cudaMallocAsync (an aligned copy)");
      moved_.push_back(m);
      copy(m, true);
      return m.scratch;  // the same shape, row-major (cudaMallocAsync: 256-byte aligned)
    });
  }

  /// After the call's launches: the outputs' elements back to the caller's memory, then
  /// the scratch freed (all of it, whatever fails first).
  void finish() {
    std::vector<Moved> done;
    done.swap(moved_);
    std::string failed;
    for (const Moved& m : done) {
      if (m.output && failed.empty()) {
        try {
          copy(m, false);
        } catch (const Error& e) {
          failed = e.what();
        }
      }
    }
    for (const Moved& m : done) {
      const cudaError_t e = cudaFreeAsync(m.scratch, stream_);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (failed.empty()) failed = std::string("megamoe: CUDA error in cudaFreeAsync (an aligned copy): ") +
                                     cudaGetErrorName(e);
      }
    }
    if (!failed.empty()) throw Error(ErrorCode::kCuda, failed);
  }

 private:
  struct Moved {
    void* scratch = nullptr;
    StridedBytes from{};
    int64_t bytes = 0;  // the dense copy's size, checked in move()
    bool output = false;
  };

  static StridedBytes strided(const TensorRef& t) {
    StridedBytes s;
    s.base = static_cast<uint8_t*>(t.data);
    s.es = dtype_size(t.dtype);
    s.cols = t.ndim == 2 ? std::max<int64_t>(1, t.shape[1]) : 1;
    s.s0 = t.ndim >= 1 ? t.strides[0] : 0;
    s.s1 = t.ndim == 2 ? t.strides[1] : 0;
    return s;
  }

  void copy(const Moved& m, bool to_dense) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((m.bytes + 255) / 256, 4096));
    strided_bytes_kernel<<<blocks, 256, 0, stream_>>>(static_cast<uint8_t*>(m.scratch), m.from, m.bytes, to_dense);
    check_cuda(cudaGetLastError(), to_dense ? "an aligned copy in" : "an aligned copy back");
  }

  cudaStream_t stream_;
  std::vector<Moved> moved_;
};

/// For a call the validator flagged (Problem::misaligned): run(b) on @p b, the call's own
/// copy of its arguments, once its tensors off their element size (among named_of(b)) are
/// dense aligned copies; then the outputs' elements written back.
template <typename Args, typename NamedOf, typename Run>
void run_on_aligned_copies(Args b, int device, Stream stream, NamedOf named_of, Run run) {
  const DeviceGuard guard(device);
  ElementAlignedCopies copies(stream);
  copies.move(named_of(b));
  run(b);
  copies.finish();
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
