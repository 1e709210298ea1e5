// aligned.cuh: CUDA tensors whose data pointer is off its element size (a 4-byte float at
// an odd address, say; strides are whole elements, so every element is off by the same
// bytes). The kernels access elements as typed words and the counters by atomics, which
// the hardware requires at multiples of their size, so such a call runs on copies: each
// such tensor's byte span in device scratch at an aligned address (same strides), copied
// in before the call (outputs too, so that the bytes between their elements keep their
// values) and, for outputs, copied back after it. Everything is queued on the call's
// stream, so a CUDA graph captures it too (the scratch as allocation and free nodes). The
// bytes between a strided tensor's elements are copied with them (they lie inside its
// span, which the validator has checked). Aligned tensors, every torch tensor's case, never
// come here: the validator flags a call that has one (Problem::misaligned).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/launch_util.cuh"
#include "megamoe/error.h"
#include "validate.h"

namespace megamoe {
namespace cuda {
namespace {

/// The copies of one call (see the file comment). move() redirects the call's own copy of
/// its arguments; finish() after the launches copies the outputs back and frees the
/// scratch; without finish() (an error on the way) the scratch is freed and nothing is
/// copied back, so the caller's buffers are untouched.
class ElementAlignedCopies {
 public:
  explicit ElementAlignedCopies(Stream stream) : stream_(static_cast<cudaStream_t>(stream)) {}
  ElementAlignedCopies(const ElementAlignedCopies&) = delete;
  ElementAlignedCopies& operator=(const ElementAlignedCopies&) = delete;
  ~ElementAlignedCopies() {
    for (const Moved& m : moved_) (void)cudaFreeAsync(m.scratch, stream_);
  }

  /// @p ts: tensors of the caller's copy of the arguments (validated: their spans fit).
  void move(const std::vector<detail::NamedTensor>& ts) {
    for (const detail::NamedTensor& n : ts) {
      if (!detail::element_misaligned(*n.t)) continue;
      const detail::Span s = detail::byte_span(*n.t);
      Moved m;
      m.t = const_cast<TensorRef*>(n.t);
      m.lo = s.lo;
      m.bytes = static_cast<size_t>(s.hi - s.lo);
      m.output = n.output;
      check_cuda(cudaMallocAsync(&m.scratch, m.bytes, stream_), "cudaMallocAsync (an aligned copy)");
      moved_.push_back(m);
      // The data pointer keeps its place in the span: (data - lo) is whole elements.
      char* data = static_cast<char*>(m.scratch) + (reinterpret_cast<uintptr_t>(n.t->data) - s.lo);
      if (reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(dtype_size(n.t->dtype)) != 0) {
        throw Error(ErrorCode::kInternal, std::string("megamoe: ") + n.name + ": scratch off its element size");
      }
      check_cuda(cudaMemcpyAsync(m.scratch, reinterpret_cast<const void*>(s.lo), m.bytes, cudaMemcpyDeviceToDevice,
                                 stream_),
                 "cudaMemcpyAsync (an aligned copy in)");
      m.t->data = data;
    }
  }

  /// After the call's launches: the outputs' spans back to the caller's memory.
  void finish() {
    for (const Moved& m : moved_) {
      if (m.output) {
        check_cuda(cudaMemcpyAsync(reinterpret_cast<void*>(m.lo), m.scratch, m.bytes, cudaMemcpyDeviceToDevice,
                                   stream_),
                   "cudaMemcpyAsync (an aligned copy back)");
      }
    }
    std::vector<Moved> done;
    done.swap(moved_);
    for (const Moved& m : done) check_cuda(cudaFreeAsync(m.scratch, stream_), "cudaFreeAsync (an aligned copy)");
  }

 private:
  struct Moved {
    TensorRef* t = nullptr;
    void* scratch = nullptr;
    uintptr_t lo = 0;
    size_t bytes = 0;
    bool output = false;
  };
  cudaStream_t stream_;
  std::vector<Moved> moved_;
};

/// run(a) unless the validator found a tensor off its element size (@p misaligned); then
/// run(b) on a copy b of @p a whose such tensors (among named_of(b)) are aligned copies,
/// and the outputs copied back.
template <typename Args, typename NamedOf, typename Run>
void with_aligned_tensors(const Args& a, bool misaligned, int device, Stream stream, NamedOf named_of, Run run) {
  if (!misaligned) return run(a);
  const DeviceGuard guard(device);
  Args b = a;
  ElementAlignedCopies copies(stream);
  copies.move(named_of(b));
  run(b);
  copies.finish();
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
