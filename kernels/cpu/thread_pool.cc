#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace tokensel::kernels::cpu {

struct ThreadPool::Job {
  int64_t n = 0;
  int64_t chunk = 1;
  int64_t num_chunks = 0;
  const RangeFn* fn = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
};

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_.reserve(threads - 1);
  for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(Job& job) {
  int64_t finished = 0;
  for (;;) {
    const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.num_chunks) break;
    const int64_t begin = c * job.chunk;
    (*job.fn)(begin, std::min(job.n, begin + job.chunk));
    ++finished;
  }
  if (finished > 0 &&
      job.done.fetch_add(finished, std::memory_order_acq_rel) + finished == job.num_chunks) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.cv.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    RunChunks(*job);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, const RangeFn& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  // A few chunks per thread balance uneven rows without much overhead.
  const int64_t want = std::min<int64_t>(max_chunks, static_cast<int64_t>(threads()) * 4);
  if (want <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  auto job = std::make_shared<Job>();
  job->n = n;
  job->chunk = (n + want - 1) / want;
  job->num_chunks = (n + job->chunk - 1) / job->chunk;
  job->fn = &fn;
  const int64_t helpers =
      std::min<int64_t>(static_cast<int64_t>(workers_.size()), job->num_chunks - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i = 0; i < helpers; ++i) queue_.push_back(job);
  }
  if (helpers == 1) {
    cv_.notify_one();
  } else {
    cv_.notify_all();
  }
  RunChunks(*job);
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done.load(std::memory_order_acquire) == job->num_chunks; });
}

void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain, const ThreadPool::RangeFn& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, grain, fn);
  } else if (n > 0) {
    fn(0, n);
  }
}

}  // namespace tokensel::kernels::cpu
