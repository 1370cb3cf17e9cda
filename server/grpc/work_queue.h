// WorkQueue: the server's op worker threads. gRPC callback threads Post()
// work here (never blocking) and the worker finishes the RPC.
//
// FIFO; Post never waits (the queue is bounded by admission control, which
// caps the requests in flight). Stop() runs every task already posted, then
// joins the workers; Post after Stop runs the task inline on the caller so
// that no RPC is left unfinished. Thread-safe.
#ifndef TOKENSEL_SERVER_GRPC_WORK_QUEUE_H_
#define TOKENSEL_SERVER_GRPC_WORK_QUEUE_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "common/mutex.h"

namespace tokensel::server {

class WorkQueue {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  // `threads` >= 1 workers.
  explicit WorkQueue(int threads);
  ~WorkQueue();  // Stop()
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Post(Task task);
  void Stop();
  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  tokensel::Mutex mu_;  // pthread-based: visible to TSan (common/mutex.h)
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_WORK_QUEUE_H_
