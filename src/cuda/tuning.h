// tuning.h: internal launch-heuristic overrides, for the benchmark only (not public API).
#pragma once

namespace megamoe {
namespace cuda {

/// 0 = the library's heuristic.
struct Tuning {
  int max_waves = 0;      ///< grid cap in waves of (8 blocks of 256 threads x SM count)
  int streaming = -1;     ///< fp8 stores: -1 heuristic, 0 default, 1 evict-first (.cs)
  int block_threads = 0;  ///< threads per block of the fast kernel (64, 128, 256)
  int shape = -1;         ///< fast kernel, 32-bit modes: -1 heuristic, 0 grid-stride loop,
                          ///< 1 one pass with top-k blocks, 2 token tiles (256 threads)
};

/// Override the heuristics process-wide (benchmarks sweep these; libraries never call it).
void set_tuning(const Tuning& t);

}  // namespace cuda
}  // namespace megamoe
