// tuning.h: internal launch-heuristic overrides, for the benchmark only (not public API).
#pragma once

namespace megamoe {
namespace cuda {

/// 0 = the library's heuristic.
struct Tuning {
  int chunks_per_thread = 0;  ///< 16-element chunks per thread per iteration (1 or 2)
  int max_waves = 0;          ///< grid cap in waves of (8 blocks x SM count)
  int streaming = -1;         ///< -1 heuristic, 0 default caching, 1 L1-bypass/L2-prefetch loads + .cs stores
};

/// Override the heuristics process-wide (benchmarks sweep these; libraries never call it).
void set_tuning(const Tuning& t);

}  // namespace cuda
}  // namespace megamoe
