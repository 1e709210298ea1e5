// pool.cpp: one process-wide pool of std::threads, created on first use and kept, so a
// staging call never starts a thread (tens of microseconds each, more than a whole decode
// step's staging), plus the thread-count knob of include/megamoe/cpu.h.
//
// Why std::thread and not OpenMP: exceptions must cross back to the caller (an OpenMP
// region may not throw), several host threads may stage concurrently and each must
// finish its own work without building a team per caller, the count must change at run
// time without touching a global OpenMP setting the host application owns, and the CI
// runs the tests under ThreadSanitizer, which reports false races inside an uninstrumented
// libgomp.
//
// A call publishes a Job (a chunk count and a claim counter) in a FIFO, wakes as many
// workers as it wants helpers, and works its own chunks too. Workers take jobs in order
// and claim chunks until none is left. The caller then withdraws its job (no further
// helper can join), waits for the helpers inside to leave, and only then lets its stack
// frame (the Job) go. Because the caller claims chunks itself, a call finishes even when
// every worker is busy with someone else's job.
#include "cpu/pool.h"

#include <algorithm>
#include <atomic>
#include <cfenv>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "megamoe/cpu.h"
#include "megamoe/error.h"

namespace megamoe {
namespace cpu {
namespace {

constexpr int kMaxThreads = 1024;

struct Job {
  void (*fn)(void*, int64_t) = nullptr;
  void* ctx = nullptr;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};  // next unclaimed chunk
  int wanted = 0;                // helpers still wanted (guarded by Pool::mu)
  int inside = 0;                // helpers working on it now (guarded by Pool::mu)
  std::mutex error_mu;
  std::exception_ptr error;      // the first exception of a chunk

  void work() {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      try {
        fn(ctx, c);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mu);
        if (!error) error = std::current_exception();
        next.store(chunks, std::memory_order_relaxed);  // skip what is not started
      }
    }
  }
};

class Pool {
 public:
  /// Run job on the caller and up to `helpers` workers (see the file comment).
  void run(Job& job, int helpers) {
    int wake = 0;  // job.wanted is the workers' to decrement once the job is published
    {
      std::unique_lock<std::mutex> lk(mu);
      job.wanted = wake = grow(helpers);
      if (wake > 0) jobs.push_back(&job);
    }
    for (int i = 0; i < wake; ++i) work_cv.notify_one();
    job.work();
    std::unique_lock<std::mutex> lk(mu);
    const auto it = std::find(jobs.begin(), jobs.end(), &job);
    if (it != jobs.end()) jobs.erase(it);
    done_cv.wait(lk, [&] { return job.inside == 0; });
  }

  std::mutex mu;

 private:
  /// Start workers until there are n (as many as the system gives); returns how many exist.
  int grow(int n) {
    while (static_cast<int>(threads.size()) < n) {
      try {
        threads.emplace_back([this] { loop(); });
      } catch (...) {
        break;  // no more threads to be had: the call runs with those that exist
      }
    }
    return std::min(n, static_cast<int>(threads.size()));
  }

  void loop() {
    // A thread inherits its creator's floating-point environment; a worker must not keep
    // a flush-to-zero mode or rounding mode of whichever caller happened to start it.
    std::fesetenv(FE_DFL_ENV);
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      work_cv.wait(lk, [&] { return !jobs.empty(); });
      Job* job = jobs.front();
      if (--job->wanted == 0) jobs.pop_front();
      ++job->inside;
      lk.unlock();
      job->work();
      lk.lock();
      // The caller may free the job once inside reaches 0 under mu: touch nothing after.
      if (--job->inside == 0) done_cv.notify_all();
    }
  }

  std::condition_variable work_cv;  // a job was published
  std::condition_variable done_cv;  // a helper left a job
  std::deque<Job*> jobs;            // jobs that still want helpers, oldest first
  std::vector<std::thread> threads;
};

// The pool is never destroyed: its workers sleep in work_cv at exit, and joining them from
// a static destructor could deadlock with a call still running on another thread.
std::mutex g_create_mu;
std::atomic<Pool*> g_pool{nullptr};

#if defined(__linux__)
// fork() copies only the forking thread: a child must not wait for workers that do not
// exist, nor find the pool's mutex locked by one. Hold both mutexes across fork, and let
// the child abandon the old pool (leaked; its std::thread objects must not be destroyed)
// and create a fresh one when it first needs workers.
void before_fork() {
  g_create_mu.lock();
  if (Pool* p = g_pool.load()) p->mu.lock();
}
void after_fork_parent() {
  if (Pool* p = g_pool.load()) p->mu.unlock();
  g_create_mu.unlock();
}
void after_fork_child() {
  if (Pool* p = g_pool.load()) p->mu.unlock();
  g_pool.store(nullptr);
  g_create_mu.unlock();
}
#endif

Pool& pool() {
  if (Pool* p = g_pool.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lk(g_create_mu);
  if (Pool* p = g_pool.load()) return *p;
#if defined(__linux__)
  static const bool registered = (pthread_atfork(before_fork, after_fork_parent, after_fork_child), true);
  (void)registered;
#endif
  Pool* p = new Pool;
  g_pool.store(p, std::memory_order_release);
  return *p;
}

/// CPUs this process may run on: its affinity mask (taskset, cgroup cpusets), not every
/// CPU of the machine, so a container limited to 4 of 64 cores runs 4 threads.
int available_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return std::min(n, kMaxThreads);
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(std::min<unsigned>(n, kMaxThreads));
}

std::atomic<int> g_threads{0};  // the knob: 0 = every available CPU

}  // namespace

void parallel_for(int64_t chunks, int threads, void (*fn)(void*, int64_t), void* ctx) {
  if (chunks <= 0) return;
  const int helpers = static_cast<int>(std::min<int64_t>(std::max(threads, 1), chunks)) - 1;
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.chunks = chunks;
  if (helpers > 0) {
    pool().run(job, helpers);
  } else {
    job.work();
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace cpu

void set_cpu_threads(int n) {
  if (n < 0 || n > cpu::kMaxThreads) {
    throw Error(ErrorCode::kInvalidArgument,
                "megamoe: set_cpu_threads: expected 0 (every CPU) or 1.." + std::to_string(cpu::kMaxThreads) +
                    " threads, got " + std::to_string(n));
  }
  cpu::g_threads.store(n, std::memory_order_relaxed);
}

int cpu_threads() noexcept {
  const int n = cpu::g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  static const int cpus = cpu::available_cpus();
  return cpus;
}

}  // namespace megamoe
