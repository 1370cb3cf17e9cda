#include "server/grpc/work_queue.h"

#include <algorithm>
#include <utility>

namespace tokensel::server {

WorkQueue::WorkQueue(int threads) {
  const int n = std::max(threads, 1);
  workers_.reserve(n);
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

WorkQueue::~WorkQueue() { Stop(); }

void WorkQueue::Post(Task task) {
  {
    tokensel::MutexLock lock(&mu_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  std::move(task)();
}

void WorkQueue::Stop() {
  {
    tokensel::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

bool WorkQueue::ReadyLocked() const { return stopping_ || !tasks_.empty(); }

void WorkQueue::WorkerLoop() {
  for (;;) {
    Task task;
    {
      tokensel::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return ReadyLocked(); },
                           absl::InfiniteDuration());
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace tokensel::server
