// CompletionQueue (contract: completion_queue.h).
#include "server/backends/completion_queue.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"

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
    if (!closed_) {
      items_.splice(items_.end(), *node);
      cv_.notify_all();
      return;
    }
  }
  // Nothing polls any more (Shutdown returned): never left pending. Done
  // already (one query): completed as usual; else abandoned, its ticket
  // completed and what its device work may use leaked.
  CompletionWork& work = node->front();
  bool give_up = false;
  if (Ready(work, &give_up) && !give_up) {
    Complete(work, work.error);
  } else {
    Abandon(work, absl::UnavailableError(
                      "the server was shutting down: the request's device work had not completed "
                      "(its stream may wait on a client's wait_event) and was abandoned"));
  }
  node->clear();
}

size_t CompletionQueue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

size_t CompletionQueue::abandoned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abandoned_;
}

std::vector<StreamDevice::Stream> CompletionQueue::abandoned_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abandoned_streams_;
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
  if (work.wait_marker != nullptr) device_->DestroyEvent(std::exchange(work.wait_marker, nullptr));
  work.on_wait = nullptr;
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

bool CompletionQueue::Ready(CompletionWork& work, bool* give_up) {
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
  if (idle.ok()) {
    work.failed_queries = 0;
    return *idle;
  }
  if (work.error.ok()) work.error = idle.status();
  // A failed context (a sticky error) runs nothing more: the item's work
  // is over, it completes with the error and its resources go back.
  if (device_->ContextFailed()) return true;
  // Only marked out of service (MarkOutOfService, e.g. by another item's
  // failed queries): the context may still run this item's work (its
  // stream may still wait on a client's event). Completing it would return
  // blocks the kernels may still use, the stream to the idle list and the
  // gate (a Leave may open it, and the pools' frees synchronize behind the
  // stream): it is abandoned instead (the fourth review).
  if (!device_->CheckUsable().ok()) {
    *give_up = true;
    return false;
  }
  // A device still usable: queried again later, but not for ever (top of
  // completion_queue.h): a query that keeps failing without a sticky error
  // says nothing of the stream's work, which may still run; the device is
  // treated as failed and the item abandoned (nothing returned to a pool).
  const Clock::time_point now = Clock::now();
  if (work.failed_queries++ == 0) work.first_failure = now;
  if (work.failed_queries >= kMinFailedQueries && now - work.first_failure >= failed_query_limit_) {
    device_->MarkOutOfService(absl::StrCat(
        "a request's completion query failing ", work.failed_queries, " times in a row for ",
        std::chrono::duration_cast<std::chrono::milliseconds>(now - work.first_failure).count(),
        " ms without a sticky error (", idle.status().message(), ")"));
    *give_up = true;
  }
  return false;
}

void CompletionQueue::CheckWait(CompletionWork& work) {
  if (!work.on_wait) return;
  // The marker is done exactly when the stream got past the client's wait:
  // then the request is only slow, never stuck, and its wait slot goes
  // back now (a pipeline of waits that pass is never refused). A failed
  // query says nothing of the wait: asked again, and at stuck_at counted
  // as not passed (the safe side for the caps).
  bool passed = false;
  if (work.wait_marker != nullptr) {
    const absl::StatusOr<bool> done = device_->EventDone(work.wait_marker);
    passed = done.ok() && *done;
  }
  if (!passed && Clock::now() < work.stuck_at) return;
  try {
    std::exchange(work.on_wait, nullptr)(passed);
  } catch (...) {  // the completion thread goes on; the ticket still completes at the end
  }
}

void CompletionQueue::Abandon(CompletionWork& work, const absl::Status& error) {
  // Leaked on purpose (completion_queue.h): the stream and the event are
  // forgotten, the FreeGate stays entered, and the holds (buffer leases,
  // reservation, route, the client's events), the staging blocks and the
  // ops (their workspaces) are kept reachable for the rest of the process,
  // never destroyed: intentionally leaked, not lost (a leak checker does not
  // report them). Out of host memory for the list, they are dropped instead
  // (then a late kernel may write into unmapped memory: as unlikely as it is
  // unavoidable).
  struct Leaked {
    std::vector<std::shared_ptr<void>> holds;
    std::vector<std::pair<BlockPool::Block, BlockPool::Block>> staging;
    std::vector<LeaseSink::PendingOp> ops;
  };
  // The blocks are forgotten by their pools (never freed nor reused).
  for (const LeaseSink::PendingOp& op : work.ops) pools_.workspaces->Abandon(op.workspace);
  for (const auto& [pinned, device] : work.staging) {
    pools_.pinned->Abandon(pinned);
    pools_.staging->Abandon(device);
  }
  static std::mutex leaked_mu;
  static auto* const leaked = new std::list<Leaked>();
  try {
    std::lock_guard<std::mutex> lock(leaked_mu);
    leaked->push_back(Leaked{std::move(work.holds), std::move(work.staging), std::move(work.ops)});
  } catch (...) {
  }
  work.holds.clear();
  work.ops.clear();
  work.staging.clear();
  work.done_event = nullptr;
  work.wait_marker = nullptr;
  work.on_wait = nullptr;
  work.gate = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++abandoned_;
    try {  // out of memory: not listed (then its owner may synchronize it)
      if (work.stream != nullptr) abandoned_streams_.push_back(work.stream);
    } catch (...) {
    }
  }
  work.stream = nullptr;
  if (!work.done) return;
  try {
    std::exchange(work.done, nullptr)(work.report ? error : absl::OkStatus());
  } catch (...) {
  }
}

void CompletionQueue::AbandonPending() {
  std::list<CompletionWork> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;  // with the take: a later Push sees it (Push, closed)
    mine.splice(mine.end(), items_);
  }
  if (mine.empty()) return;
  TS_LOG(ERROR) << "completion queue: " << mine.size()
                << " request(s) still pending at shutdown (their streams wait, probably on client "
                   "events that never completed); abandoned: their tickets completed, their "
                   "streams, blocks and buffers leaked so that the process can exit";
  for (CompletionWork& work : mine) {
    Abandon(work, absl::UnavailableError(
                      "the server shut down before the request's device work completed (its "
                      "stream still waited, probably on a client's wait_event)"));
  }
}

int CompletionQueue::Poll() {
  std::list<CompletionWork> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine.splice(mine.end(), items_);
  }
  int completed = 0;
  for (auto it = mine.begin(); it != mine.end();) {
    bool give_up = false;
    const bool ready = Ready(*it, &give_up);
    if (give_up) {
      Abandon(*it, it->error);
    } else if (!ready) {
      CheckWait(*it);
      ++it;
      continue;
    } else {
      Complete(*it, it->error);
    }
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
      if (stop_) {
        closed_ = true;
        return;
      }
      cv_.wait(lock, [this] { return stop_ || !items_.empty(); });
      backoff = kMinBackoff;
      continue;
    }
    // Bounded shutdown: what has not completed by the deadline is
    // abandoned, so a stream stuck on a client's event cannot hold the
    // thread (and the process's exit) for ever.
    if (stop_ && Clock::now() >= deadline_) {
      lock.unlock();
      AbandonPending();
      return;
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

void CompletionQueue::Shutdown(Clock::time_point deadline) {
  std::lock_guard<std::mutex> once(shutdown_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    stop_ = true;
    deadline_ = deadline;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();  // returns once nothing is pending or the deadline passed
    return;
  }
  // No thread (tests): what is done completes; the rest is drained by the
  // host (the fake device does the work) until the deadline, then abandoned.
  while (pending() > 0 && Clock::now() < deadline) {
    if (Poll() > 0) continue;
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
  AbandonPending();
}

}  // namespace tokensel::backends
