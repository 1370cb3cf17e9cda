#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <exception>

#include "absl/status/status.h"
#include "kernels/cpu/stop.h"

namespace tokensel::kernels::cpu {

// One ParallelFor call; lives on the caller's stack until no worker uses it.
struct ThreadPool::Job {
  Job(int64_t n_, int64_t chunk_, const StopToken* token_, RangeFn fn_)
      : n(n_), chunk(chunk_), num_chunks((n_ + chunk_ - 1) / chunk_), token(token_), fn(fn_) {}

  const int64_t n;
  const int64_t chunk;
  const int64_t num_chunks;
  const StopToken* const token;  // null: nothing to check
  const RangeFn fn;
  std::atomic<int64_t> next{0};      // next chunk to claim
  std::atomic<bool> stopped{false};  // a check failed: claim but skip the rest
  std::mutex stop_mu;
  absl::Status stop_status;  // the first failed check (guarded by stop_mu)
  std::exception_ptr error;  // the first exception a chunk threw (guarded by stop_mu)
  // Guarded by the pool's mu_:
  int64_t helpers_wanted = 0;  // workers that may still join (while queued)
  int64_t active = 0;          // workers inside RunChunks for this job
  bool queued = false;
  Job* prev = nullptr;
  Job* next_job = nullptr;
  std::condition_variable idle;  // active dropped to 0

  void Stop(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(stop_mu);
    if (stop_status.ok()) stop_status = status;
    stopped.store(true, std::memory_order_relaxed);
  }

  // Runs one chunk; an exception (std::bad_alloc of a chunk's scratch) is
  // kept for the caller, who rethrows it once every worker is done with the
  // job: thrown on a worker thread it would terminate the process.
  void RunChunk(int64_t begin, int64_t end) {
    try {
      fn(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(stop_mu);
      if (error == nullptr) error = std::current_exception();
      stopped.store(true, std::memory_order_relaxed);
    }
  }

  // Claims and runs chunks until none is left. With a token, each chunk runs
  // in its own stop scope on this thread, after a check.
  void RunChunks() {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= num_chunks) return;
      const int64_t begin = c * chunk;
      const int64_t end = std::min(n, begin + chunk);
      if (stopped.load(std::memory_order_relaxed)) continue;
      if (token == nullptr) {
        RunChunk(begin, end);
        continue;
      }
      internal::StopScope scope{token, absl::OkStatus()};
      internal::StopScope* const outer = internal::SwapStopScope(&scope);
      if (internal::CheckStopIn(&scope).ok()) RunChunk(begin, end);
      internal::SwapStopScope(outer);
      if (!scope.stopped.ok()) Stop(scope.stopped);
    }
  }
};

namespace {

// The inline path: one call, or with a token, chunks of `chunk` with a check
// before each (the failure latches into `scope`, the caller's).
void RunInline(int64_t n, int64_t chunk, internal::StopScope* scope, ThreadPool::RangeFn fn) {
  if (scope == nullptr || scope->token == nullptr) {
    fn(0, n);
    return;
  }
  for (int64_t begin = 0; begin < n; begin += chunk) {
    if (!internal::CheckStopIn(scope).ok()) return;
    fn(begin, std::min(n, begin + chunk));
  }
}

// Chunk length for `want` chunks of at least `grain`.
int64_t ChunkFor(int64_t n, int64_t want) { return (n + want - 1) / std::max<int64_t>(want, 1); }

}  // namespace

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

void ThreadPool::Enqueue(Job* job) {
  job->queued = true;
  job->prev = tail_;
  job->next_job = nullptr;
  if (tail_ != nullptr) {
    tail_->next_job = job;
  } else {
    head_ = job;
  }
  tail_ = job;
}

void ThreadPool::Unlink(Job* job) {
  if (job->prev != nullptr) {
    job->prev->next_job = job->next_job;
  } else {
    head_ = job->next_job;
  }
  if (job->next_job != nullptr) {
    job->next_job->prev = job->prev;
  } else {
    tail_ = job->prev;
  }
  job->queued = false;
  job->prev = job->next_job = nullptr;
}

void ThreadPool::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || head_ != nullptr; });
    if (head_ == nullptr) return;  // stop_ and drained
    Job* job = head_;
    if (--job->helpers_wanted == 0) Unlink(job);
    ++job->active;
    lock.unlock();
    job->RunChunks();
    lock.lock();
    // Under mu_: the caller cannot see active == 0 (and free the job) before
    // this thread is done with it.
    if (--job->active == 0) job->idle.notify_all();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  internal::StopScope* const scope = internal::CurrentStopScope();
  const StopToken* const token = scope != nullptr ? scope->token : nullptr;
  const int64_t max_chunks = (n + grain - 1) / grain;
  // A few chunks per thread balance uneven rows without much overhead; with a
  // token, enough chunks that a stop is noticed soon.
  int64_t want = static_cast<int64_t>(threads()) * 4;
  if (token != nullptr) want = std::max(want, kStopChunks);
  want = std::min(max_chunks, want);
  if (want <= 1 || workers_.empty()) {
    RunInline(n, ChunkFor(n, want), scope, fn);
    return;
  }
  if (token != nullptr && !scope->stopped.ok()) return;  // already stopped
  Job job(n, ChunkFor(n, want), token, fn);
  const int64_t helpers =
      std::min<int64_t>(static_cast<int64_t>(workers_.size()), job.num_chunks - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job.helpers_wanted = helpers;
    Enqueue(&job);
  }
  if (helpers == 1) {
    cv_.notify_one();
  } else {
    cv_.notify_all();
  }
  job.RunChunks();
  {
    // Every chunk is claimed; wait for the workers still running some.
    std::unique_lock<std::mutex> lock(mu_);
    if (job.queued) Unlink(&job);
    job.idle.wait(lock, [&] { return job.active == 0; });
  }
  if (job.stopped.load(std::memory_order_relaxed)) {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(job.stop_mu);
      if (!job.stop_status.ok()) internal::LatchStop(scope, job.stop_status);
      error = job.error;
    }
    if (error != nullptr) std::rethrow_exception(error);
  }
}

void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain, ThreadPool::RangeFn fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, grain, fn);
    return;
  }
  if (n <= 0) return;
  internal::StopScope* const scope = internal::CurrentStopScope();
  const int64_t max_chunks = (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1);
  RunInline(n, ChunkFor(n, std::min(max_chunks, kStopChunks)), scope, fn);
}

}  // namespace tokensel::kernels::cpu
