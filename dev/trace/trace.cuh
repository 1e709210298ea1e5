// trace.cuh: the decode kernels' clock64 phase points (the fast kernel's stage_at, the row
// kernel, the router block), a development aid that no product build contains.
// dev/trace/tree.sh copies this header into a scratch copy of the tree as
// src/cuda/kernels/trace.cuh and applies dev/trace/instrument.patch, which includes it from
// the kernels and places the points; scripts/device.sh trace builds and runs that copy.
// Threads 0 and 32 of the first eight blocks and of the last block print one line each from
// the device; bench/trace_summary.py turns the lines into medians.
//
// A point records the SM clock; MM_TRACE_AFTER(k, v) first waits for @p v (the phase's
// result: an asm input operand), so that it marks when that value exists rather than when
// the instructions producing it were issued.
#pragma once

#include <cstdio>

namespace megamoe {
namespace cuda {

struct TraceBuf {
  long long c[8];          ///< c[0] the start; c[k] point k (0: not reached)
  unsigned long long g0;   ///< globaltimer (ns) at the start
};

__device__ __forceinline__ long long trace_clock() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
}
__device__ __forceinline__ long long trace_clock_after(float dep) {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) : "f"(dep) : "memory");
  return c;
}
__device__ __forceinline__ unsigned long long trace_gtimer() {
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g)::"memory");
  return g;
}

/// One line per tracing thread: kernel name, block, thread, SM, the globaltimer at the start
/// and at the end, the points as cycles from the start (-1: not reached), the end.
__device__ __forceinline__ void trace_print(const char* name, TraceBuf& b, bool print) {
  const long long end = trace_clock();
  const bool who = (blockIdx.x < 8u || blockIdx.x + 1u == gridDim.x) && (threadIdx.x == 0u || threadIdx.x == 32u);
  if (!print || !who) return;  // (the other threads read no timer)
  const unsigned long long g1 = trace_gtimer();
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  long long d[6];
#pragma unroll
  for (int k = 0; k < 6; ++k) d[k] = b.c[k + 1] != 0 ? b.c[k + 1] - b.c[0] : -1;
  printf("TRACE %s b=%u t=%u sm=%u g0=%llu g1=%llu d=%lld %lld %lld %lld %lld %lld %lld\n", name, blockIdx.x,
         threadIdx.x, smid, b.g0, g1, d[0], d[1], d[2], d[3], d[4], d[5], end - b.c[0]);
}

}  // namespace cuda
}  // namespace megamoe

#define MM_TRACE_DECL                                  \
  ::megamoe::cuda::TraceBuf mm_trace_ = {};            \
  mm_trace_.g0 = ::megamoe::cuda::trace_gtimer();      \
  mm_trace_.c[0] = ::megamoe::cuda::trace_clock();
#define MM_TRACE_AT(k) (mm_trace_.c[k] = ::megamoe::cuda::trace_clock())
#define MM_TRACE_AFTER(k, dep) (mm_trace_.c[k] = ::megamoe::cuda::trace_clock_after(dep))
#define MM_TRACE_PRINT(name, print) ::megamoe::cuda::trace_print(name, mm_trace_, print)
// A callee's points: its parameter list ends with MM_TRACE_PARAM, the call's arguments
// with MM_TRACE_ARG (the caller's buffer).
#define MM_TRACE_PARAM , ::megamoe::cuda::TraceBuf& mm_trace_
#define MM_TRACE_ARG , mm_trace_
