/// @file cpu.h
/// @brief Threads of the CPU backend.
///
/// CPU staging (prepare_inputs on host tensors) runs on the calling thread plus the workers
/// of one process-wide pool that is created on first use and kept for the life of the
/// process: a call starts a worker only while the pool has fewer than it may use (at most
/// once per worker for the life of the process). A call splits its tokens into row chunks; the
/// caller works on its own chunks and returns only when all of them are done, so concurrent
/// calls from several host threads share the workers and each still finishes its own work.
/// Small problems (well under a millisecond of work) run on the calling thread alone.
#pragma once

namespace megamoe {

/// @brief Set how many threads one CPU staging call may use, the calling thread included.
///
/// @p n = 0 (the default) means one per CPU this process may run on (its affinity mask,
/// read once, at the first call);
/// 1 keeps every call on the calling thread. Takes effect for calls that start after it
/// returns; safe to call from any thread at any time. Workers are started lazily, when a
/// call first needs them, and never stopped.
/// @throws megamoe::Error (kInvalidArgument) when @p n is negative or above 1024.
void set_cpu_threads(int n);

/// @brief The number of threads a large CPU staging call uses now (>= 1): the value given
/// to set_cpu_threads, or the CPU count when that is 0.
int cpu_threads() noexcept;

}  // namespace megamoe
