// A small fixed-size thread pool for row-parallel CPU operators.
//
// ParallelFor may be called concurrently from many threads (the server runs
// several requests at once); each call splits its range into chunks that the
// calling thread and idle workers claim. The caller always participates, so a
// pool with 1 thread (no workers) runs everything inline. Results never
// depend on the thread count: callers partition work by row and every row is
// computed by exactly one thread.
//
// A ParallelFor call allocates nothing on the heap (the job lives on the
// caller's stack, the queue is intrusive, `fn` is a FunctionRef), so an op's
// scratch is only what the op itself allocates (cpu_ops.h ScratchBytes).
//
// Stop (stop.h): ParallelFor captures the calling thread's StopToken at entry
// and checks it before every chunk, installing it on the thread that runs the
// chunk (so CheckStop() inside `fn` sees it). Once a check fails no further
// chunk of the call starts; chunks already running finish; the failure is
// latched into the caller's scope, so the caller's next CheckStop() reports
// it. With a token, ranges are cut into at least kStopChunks chunks (grain
// permitting) so a stop takes effect within about 1/kStopChunks of the call.
//
// Exceptions: if `fn` throws (std::bad_alloc from a chunk's scratch), no
// further chunk starts, and once every thread is done with the call the
// first exception is rethrown to the caller of ParallelFor, on the caller's
// thread; thrown on a worker it would otherwise terminate the process. The
// pool stays usable.
#ifndef TOKENSEL_KERNELS_CPU_THREAD_POOL_H_
#define TOKENSEL_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tokensel::kernels::cpu {

// Chunks a call is cut into (at least, when `grain` allows) while a stop
// token is installed: the stop latency is about the call's time / this.
inline constexpr int64_t kStopChunks = 256;

class ThreadPool {
 public:
  // `threads` >= 1 is the total parallelism including the caller (threads-1
  // workers are started). 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each at least
  // `grain` long (except the last), and returns when all have finished (or,
  // once stopped, when the running ones have). At most threads() chunks of
  // one call run at the same time.
  using RangeFn = absl::FunctionRef<void(int64_t begin, int64_t end)>;
  void ParallelFor(int64_t n, int64_t grain, RangeFn fn);

 private:
  struct Job;
  void WorkerLoop();
  void Enqueue(Job* job);  // requires mu_
  void Unlink(Job* job);   // requires mu_

  std::mutex mu_;
  std::condition_variable cv_;
  Job* head_ = nullptr;  // jobs that still take helpers, oldest first
  Job* tail_ = nullptr;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Runs fn over [0, n) on `pool`, or inline (chunked only while a stop token
// is installed) when pool is null.
void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain, ThreadPool::RangeFn fn);

// Lowers `lowest` to `candidate` when that is smaller, lock-free: the lowest
// failing row of a ParallelFor, whichever chunk finds its failure first.
inline void StoreMin(std::atomic<int64_t>& lowest, int64_t candidate) {
  int64_t current = lowest.load(std::memory_order_relaxed);
  while (candidate < current && !lowest.compare_exchange_weak(current, candidate)) {
  }
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_THREAD_POOL_H_
