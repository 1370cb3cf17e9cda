// CompletionQueue (contract: completion_queue.h).
#include "server/backends/completion_queue.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <new>

#include "absl/strings/str_cat.h"

namespace tokensel::backends {
namespace {

constexpr auto kMinBackoff = std::chrono::microseconds(50);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1);

// Finish of one op, on the completion thread: an exception (Finish formats
// messages on the host) must not end the thread.
absl::Status FinishOp(StreamDevice* device, const LeaseSink::PendingOp& op,
                      StreamDevice::Stream stream) {
  try {
    return device->Finish(core::ArgsOf(op.args), {op.workspace.data, op.workspace.bytes}, stream);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of host memory reading the op's status");
  } catch (...) {
    return absl::InternalError("an exception reading the op's status");
  }
}

}  // namespace

CompletionQueue::CompletionQueue(StreamDevice* device, StreamPools pools, bool own_thread)
    : device_(device), pools_(pools) {
  if (own_thread) thread_ = std::thread([this] { Loop(); });
}

CompletionQueue::~CompletionQueue() { Shutdown(); }

void CompletionQueue::Push(std::list<CompletionWork>* node) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.splice(items_.end(), *node);
  }
  cv_.notify_all();
}

size_t CompletionQueue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

void CompletionQueue::Complete(CompletionWork& work, const absl::Status& error) {
  try {
    absl::Status deferred = error;
    if (!error.ok()) {
      deferred = absl::Status(error.code(),
                              absl::StrCat("the request's device work failed: ", error.message()));
    } else {
      for (const LeaseSink::PendingOp& op : work.ops) {
        if (!op.finish) continue;
        const absl::Status st = FinishOp(device_, op, work.stream);
        if (!st.ok() && deferred.ok()) {
          deferred = absl::Status(st.code(), absl::StrCat(op.label, ": ", st.message()));
        }
      }
    }
    Release(work);
    if (!work.report) deferred = absl::OkStatus();
    if (work.done) std::exchange(work.done, nullptr)(deferred);
  } catch (...) {
    // Whatever threw (a message's allocation, a hold's destructor): the
    // rest is still returned, and the request's ticket still completed.
    try {
      Release(work);
    } catch (...) {
    }
    if (work.done) {
      try {
        std::exchange(work.done, nullptr)(
            work.report ? absl::InternalError("an exception completing the request's device work")
                        : absl::OkStatus());
      } catch (...) {
      }
    }
  }
}

void CompletionQueue::Release(CompletionWork& work) {
  for (const LeaseSink::PendingOp& op : work.ops) pools_.workspaces->Release(op.workspace);
  for (const auto& [pinned, device] : work.staging) {
    pools_.pinned->Release(pinned);
    pools_.staging->Release(device);
  }
  work.ops.clear();
  work.staging.clear();
  if (work.done_event != nullptr) device_->DestroyEvent(std::exchange(work.done_event, nullptr));
  if (work.stream != nullptr) device_->ReleaseStream(std::exchange(work.stream, nullptr));
  // The stream no longer waits on a client's event: the pools may free again.
  if (work.gate != nullptr) std::exchange(work.gate, nullptr)->Leave();
  // Dropped one at a time: if a destructor throws, the others still go.
  while (!work.holds.empty()) {
    std::shared_ptr<void> hold = std::move(work.holds.back());
    work.holds.pop_back();
    hold.reset();
  }
}

bool CompletionQueue::Ready(CompletionWork& work) {
  if (!work.query_stream && work.done_event != nullptr) {
    absl::StatusOr<bool> done = device_->EventDone(work.done_event);
    if (done.ok()) return *done;
    // Watched by the stream from now on (never drained: it may wait on a
    // client's event); the error is what the request reports.
    work.query_stream = true;
    work.error = done.status();
  }
  if (!work.query_stream) return true;
  absl::StatusOr<bool> idle = device_->QueryStream(work.stream);
  if (idle.ok()) return *idle;
  if (work.error.ok()) work.error = idle.status();
  // A failed device runs nothing more: the item completes with the error.
  // A device still usable: queried again later.
  return !device_->CheckUsable().ok();
}

int CompletionQueue::Poll() {
  std::list<CompletionWork> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine.splice(mine.end(), items_);
  }
  int completed = 0;
  for (auto it = mine.begin(); it != mine.end();) {
    if (!Ready(*it)) {
      ++it;
      continue;
    }
    Complete(*it, it->error);
    it = mine.erase(it);
    ++completed;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.splice(items_.begin(), mine);  // still pending, oldest first
  }
  return completed;
}

void CompletionQueue::Loop() {
  auto backoff = std::chrono::microseconds(kMinBackoff);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (items_.empty()) {
      if (stop_) return;
      cv_.wait(lock, [this] { return stop_ || !items_.empty(); });
      backoff = kMinBackoff;
      continue;
    }
    lock.unlock();
    const int completed = Poll();
    lock.lock();
    if (completed > 0) {
      backoff = kMinBackoff;
      continue;
    }
    cv_.wait_for(lock, backoff);
    backoff = std::min<std::chrono::microseconds>(2 * backoff, kMaxBackoff);
  }
}

void CompletionQueue::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();  // the loop returns only once nothing is pending
    return;
  }
  // No thread (tests): complete what is left by waiting for each stream.
  while (pending() > 0) {
    std::list<CompletionWork> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine.splice(mine.end(), items_);
    }
    for (CompletionWork& w : mine) {
      const absl::Status drained = device_->Drain(w.stream, absl::OkStatus());
      Complete(w, drained);
    }
  }
}

}  // namespace tokensel::backends
