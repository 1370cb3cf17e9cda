// StreamChain (contract and order of the device calls: stream_chain.h).
#include "server/backends/stream_chain.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tokensel::backends {

StreamChain::StreamChain(StreamDevice* device, StreamPools pools, CompletionQueue* queue,
                         bool async)
    : device_(device), pools_(pools), queue_(queue), async_(async) {
  node_.emplace_back();  // the work item, allocated before any stream is taken
  // Room for the Holds that must not throw (RequestChain::Hold).
  // (Plus the client's two events, held by Begin.)
  node_.front().holds.reserve(core::RequestChain::kHoldsThatCannotThrow + 2);
}

absl::StatusOr<std::unique_ptr<StreamChain>> StreamChain::Begin(
    StreamDevice* device, StreamPools pools, CompletionQueue* queue, std::shared_ptr<IpcEvent> wait,
    std::shared_ptr<IpcEvent> record, bool async) {
  std::unique_ptr<StreamChain> chain(new StreamChain(device, pools, queue, async));
  chain->wait_ = std::move(wait);
  chain->record_ = std::move(record);
  CompletionWork& w = chain->work();
  // The client's opened events live as long as the work queued on them
  // (the chain itself ends at Commit): a session end or the cache's LRU
  // must not cudaEventDestroy an event a queued wait or record still uses.
  if (chain->wait_ != nullptr) w.holds.push_back(chain->wait_);
  if (chain->record_ != nullptr) w.holds.push_back(chain->record_);
  // The private events before the stream: the hand-off then never lacks
  // one, and a failure here leaves nothing queued. An async chain with a
  // wait has a second one, the wait's marker (a sync chain's marker is its
  // completion event, recorded again at the end).
  ASSIGN_OR_RETURN(w.done_event, device->CreateEvent());
  if (async && chain->wait_ != nullptr) {
    absl::StatusOr<StreamDevice::Event> marker = device->CreateEvent();
    if (!marker.ok()) {
      device->DestroyEvent(std::exchange(w.done_event, nullptr));
      return marker.status();
    }
    w.wait_marker = *marker;
  }
  absl::StatusOr<StreamDevice::Stream> stream = device->AcquireStream();
  if (!stream.ok()) {
    device->DestroyEvent(std::exchange(w.done_event, nullptr));
    if (w.wait_marker != nullptr) device->DestroyEvent(std::exchange(w.wait_marker, nullptr));
    return stream.status();
  }
  w.stream = *stream;
  // From here the chain owns the stream and the events (its destructor
  // returns them). Nothing is recorded on record_event before the ops (no
  // check of its device: stream_chain.h). The wait comes first on the
  // stream: every staging copy, fill and kernel of the request is ordered
  // after the client's work.
  if (chain->wait_ != nullptr) {
    // No pool frees while the stream may wait (block_pool.h, FreeGate):
    // entered before the wait is queued, left when the stream is released.
    if (pools.gate != nullptr) {
      pools.gate->Enter();
      w.gate = pools.gate;
    }
    chain->wait_began_ = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(device->WaitEvent(w.stream, chain->wait_->get(), "wait_event"));
    // The marker the host (sync: AwaitWait) or the completion queue (async:
    // the stuck rule) polls (stream_chain.h: not the client's event, which
    // the client may record again meanwhile).
    RETURN_IF_ERROR(
        device->RecordEvent(async ? w.wait_marker : w.done_event, w.stream, "the wait's marker"));
  }
  return chain;
}

StreamChain::~StreamChain() {
  if (committed_ || node_.empty()) return;
  // Not committed: the request failed on the way (an exception included);
  // whatever was launched is waited for, then everything is returned (no
  // deferred error: the request already answered one). Waited for here
  // only when that cannot block for ever; otherwise off-thread.
  CompletionWork& w = work();
  w.done = nullptr;
  if (w.stream == nullptr) {
    queue_->Complete(w, absl::CancelledError("not committed"));
    return;
  }
  if (!MaySynchronize()) {
    (void)HandOff();
    return;
  }
  (void)device_->Drain(w.stream, absl::OkStatus());
  queue_->Complete(w, absl::CancelledError("not committed"));
}

absl::StatusOr<std::unique_ptr<core::RequestLease>> StreamChain::BeginOp(std::string label) {
  if (committed_) return absl::FailedPreconditionError("cuda backend: an op after Commit");
  if (!MaySynchronize() && !async_) {
    return absl::FailedPreconditionError("cuda backend: an op before the wait completed");
  }
  return std::unique_ptr<core::RequestLease>(StreamLease::OnChain(
      device_, pools_, work().stream, static_cast<LeaseSink*>(this), async_, std::move(label)));
}

void StreamChain::Hold(std::shared_ptr<void> keep) { work().holds.push_back(std::move(keep)); }

void StreamChain::Reserve(size_t staging, size_t ops) {
  CompletionWork& w = work();
  w.staging.reserve(w.staging.size() + staging_promised_ + staging);
  staging_promised_ += staging;
  w.ops.reserve(w.ops.size() + ops_promised_ + ops);
  ops_promised_ += ops;
}

void StreamChain::AdoptStaging(BlockPool::Block pinned, BlockPool::Block device) noexcept {
  work().staging.emplace_back(pinned, device);  // reserved: no reallocation
  if (staging_promised_ > 0) --staging_promised_;
}

void StreamChain::AdoptOp(PendingOp op) noexcept {
  work().ops.push_back(std::move(op));  // reserved: no reallocation
  if (ops_promised_ > 0) --ops_promised_;
}

absl::Status StreamChain::AwaitWait(const kernels::StopToken* stop) {
  if (wait_ == nullptr || async_) return absl::OkStatus();
  auto backoff = std::chrono::microseconds(20);
  const auto give_up = std::chrono::steady_clock::now() + max_host_wait_;
  while (true) {
    // The marker recorded right behind the stream's wait: done exactly when
    // the record the stream waits on completed. A failed query leaves the
    // chain abandoned too (wait_passed_ stays false): no host sync follows.
    ASSIGN_OR_RETURN(const bool done, device_->EventDone(work().done_event));
    if (done) {
      wait_passed_ = true;
      return absl::OkStatus();
    }
    if (stop != nullptr) {
      if (absl::Status st = stop->Check(); !st.ok()) {
        return absl::Status(
            st.code(), absl::StrCat("wait_event: not completed by the client: ", st.message()));
      }
    }
    // A call without a deadline does not hold a thread for ever either.
    if (std::chrono::steady_clock::now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "wait_event: not completed by the client within the server's maximum wait of ",
          std::chrono::duration_cast<std::chrono::milliseconds>(max_host_wait_).count(), " ms"));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(2 * backoff, std::chrono::microseconds(1000));
  }
}

absl::Status StreamChain::HandOff() {
  CompletionWork& w = work();
  // The event exists (Begin); recording it cannot block. If the record
  // fails, the queue watches the stream itself (QueryStream) instead of
  // the event: still no host synchronization (the stream may be waiting on
  // a client's event that never completes).
  absl::Status marked = device_->RecordEvent(w.done_event, w.stream, "the completion event");
  w.query_stream = !marked.ok();
  // The request answers this error now: not again as a deferred one.
  if (!marked.ok()) w.report = false;
  queue_->Push(&node_);  // no allocation: the node moves
  return marked;
}

absl::Status StreamChain::Commit(DoneFn done, WaitFn on_wait) {
  if (committed_) return absl::FailedPreconditionError("cuda backend: a chain commits once");
  committed_ = true;
  CompletionWork& w = work();
  w.done = std::move(done);
  // A sync chain whose wait the host did not see complete (AwaitWait
  // stopped or failed): nothing ran; the stream may still wait on the
  // client's event, so it is not drained here (that could block for ever)
  // but completed off-thread; the client's record_event is not recorded
  // (the request failed; nothing of it was: stream_chain.h).
  if (!async_ && !MaySynchronize()) return HandOff();
  absl::Status recorded = absl::OkStatus();
  // After the last op (and its copies) on the stream: the client's wait on
  // this event orders its reads of the outputs after our writes.
  if (record_ != nullptr) recorded = device_->RecordEvent(record_->get(), w.stream, "record_event");
  if (async_) {
    if (!recorded.ok()) w.report = false;  // answered now, not deferred
    // The wait rule (stream_chain.h): the queue calls `on_wait` once: true
    // when it sees the wait's marker complete, false if it has not
    // completed kAsyncStuckAfter after the wait began.
    if (wait_ != nullptr && on_wait) {
      w.on_wait = std::move(on_wait);
      w.stuck_at = wait_began_ + stuck_after_;
    }
    const absl::Status marked = HandOff();
    return recorded.ok() ? marked : recorded;
  }
  // Sync: every op synchronized its stream; what is still queued is the
  // wait's marker or the record. Drained so the pooled stream carries
  // nothing of this client into the next request.
  const absl::Status drained = device_->Drain(w.stream, absl::OkStatus());
  queue_->Complete(w, drained);
  return recorded.ok() ? drained : recorded;
}

}  // namespace tokensel::backends
