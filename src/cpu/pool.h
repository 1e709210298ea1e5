// pool.h: the persistent worker pool of the CPU backend (see pool.cpp for the design).
#pragma once

#include <cstdint>
#include <type_traits>

namespace megamoe {
namespace cpu {

/// Run fn(ctx, c) for every chunk c in [0, chunks), on the calling thread and up to
/// threads - 1 pool workers; return when every chunk has run. Chunks are claimed one at a
/// time from a shared counter, so a busy core takes fewer. When a chunk throws, the chunks
/// not yet started are skipped and the first exception is rethrown here, after every
/// worker has left the job.
void parallel_for(int64_t chunks, int threads, void (*fn)(void*, int64_t), void* ctx);

/// Same with a callable f(int64_t chunk).
template <typename F>
void parallel_for(int64_t chunks, int threads, F&& f) {
  using Fn = std::remove_reference_t<F>;
  parallel_for(chunks, threads, [](void* p, int64_t c) { (*static_cast<Fn*>(p))(c); },
               const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace cpu
}  // namespace megamoe
