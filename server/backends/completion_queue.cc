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
  for (const LeaseSink::PendingOp& op : work.ops) pools_.workspaces->Release(op.workspace);
  for (const auto& [pinned, device] : work.staging) {
    pools_.pinned->Release(pinned);
    pools_.staging->Release(device);
  }
  work.ops.clear();
  work.staging.clear();
  if (work.done_event != nullptr) device_->DestroyEvent(std::exchange(work.done_event, nullptr));
  if (work.stream != nullptr) device_->ReleaseStream(std::exchange(work.stream, nullptr));
  work.holds.clear();
  if (work.done) std::exchange(work.done, nullptr)(deferred);
}

int CompletionQueue::Poll() {
  std::list<CompletionWork> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine.splice(mine.end(), items_);
  }
  int completed = 0;
  for (auto it = mine.begin(); it != mine.end();) {
    absl::StatusOr<bool> done =
        it->done_event != nullptr ? device_->EventDone(it->done_event) : absl::StatusOr<bool>(true);
    if (done.ok() && !*done) {
      ++it;
      continue;
    }
    absl::Status error = done.status();
    if (!error.ok()) error = device_->Drain(it->stream, std::move(error));
    Complete(*it, error);
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
