// A small fixed-size thread pool for row-parallel CPU operators.
//
// ParallelFor may be called concurrently from many threads (the server runs
// several requests at once); each call splits its range into chunks that the
// calling thread and idle workers claim. The caller always participates, so a
// pool with 1 thread (no workers) runs everything inline. Results never
// depend on the thread count: callers partition work by row and every row is
// computed by exactly one thread.
#ifndef TOKENSEL_KERNELS_CPU_THREAD_POOL_H_
#define TOKENSEL_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tokensel::kernels::cpu {

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
  // `grain` long (except the last), and returns when all have finished.
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;
  void ParallelFor(int64_t n, int64_t grain, const RangeFn& fn);

 private:
  struct Job;
  void WorkerLoop();
  static void RunChunks(Job& job);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Runs fn over [0, n) on `pool`, or inline when pool is null.
void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain, const ThreadPool::RangeFn& fn);

// Lowers `lowest` to `candidate` when that is smaller, lock-free: the lowest
// failing row of a ParallelFor, whichever chunk finds its failure first.
inline void StoreMin(std::atomic<int64_t>& lowest, int64_t candidate) {
  int64_t current = lowest.load(std::memory_order_relaxed);
  while (candidate < current && !lowest.compare_exchange_weak(current, candidate)) {
  }
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_THREAD_POOL_H_
