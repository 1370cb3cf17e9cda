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
}

absl::StatusOr<std::unique_ptr<StreamChain>> StreamChain::Begin(
    StreamDevice* device, StreamPools pools, CompletionQueue* queue, std::shared_ptr<IpcEvent> wait,
    std::shared_ptr<IpcEvent> record, bool async) {
  std::unique_ptr<StreamChain> chain(new StreamChain(device, pools, queue, async));
  chain->wait_ = std::move(wait);
  chain->record_ = std::move(record);
  ASSIGN_OR_RETURN(chain->work().stream, device->AcquireStream());
  // From here the chain owns the stream (its destructor drains and returns
  // it). The wait comes first on the stream: every staging copy, fill and
  // kernel of the request is ordered after the client's work.
  if (chain->wait_ != nullptr) {
    RETURN_IF_ERROR(device->WaitEvent(chain->work().stream, chain->wait_->get(), "wait_event"));
  }
  return chain;
}

StreamChain::~StreamChain() {
  if (committed_ || node_.empty()) return;
  // Not committed: the request failed on the way; whatever was launched is
  // waited for here, then everything is returned (no deferred error: the
  // request already answered one).
  CompletionWork& w = work();
  if (w.stream == nullptr) return;
  (void)device_->Drain(w.stream, absl::OkStatus());
  w.done = nullptr;
  queue_->Complete(w, absl::CancelledError("not committed"));
}

absl::StatusOr<std::unique_ptr<core::RequestLease>> StreamChain::BeginOp(std::string label) {
  if (committed_) return absl::FailedPreconditionError("cuda backend: an op after Commit");
  return std::unique_ptr<core::RequestLease>(StreamLease::OnChain(
      device_, pools_, work().stream, static_cast<LeaseSink*>(this), async_, std::move(label)));
}

void StreamChain::Hold(std::shared_ptr<void> keep) { work().holds.push_back(std::move(keep)); }

void StreamChain::AdoptStaging(BlockPool::Block pinned, BlockPool::Block device) {
  work().staging.emplace_back(pinned, device);
}

void StreamChain::AdoptOp(PendingOp op) { work().ops.push_back(std::move(op)); }

absl::Status StreamChain::AwaitWait(const kernels::StopToken* stop) {
  if (wait_ == nullptr || async_) return absl::OkStatus();
  auto backoff = std::chrono::microseconds(20);
  while (true) {
    // The client's latest record of the event: the one the stream waits on,
    // or a later one (then this waits longer than the stream would, never
    // shorter in the usual case of records in stream order).
    ASSIGN_OR_RETURN(const bool done, device_->EventDone(wait_->get()));
    if (done) return absl::OkStatus();
    if (stop != nullptr) {
      if (absl::Status st = stop->Check(); !st.ok()) {
        abandoned_ = true;
        return absl::Status(
            st.code(), absl::StrCat("wait_event: not completed by the client: ", st.message()));
      }
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(2 * backoff, std::chrono::microseconds(1000));
  }
}

absl::Status StreamChain::HandOff() {
  CompletionWork& w = work();
  absl::StatusOr<StreamDevice::Event> event = device_->CreateEvent();
  absl::Status marked = event.status();
  if (event.ok()) {
    w.done_event = *event;
    marked = device_->RecordEvent(*event, w.stream, "the completion event");
  }
  if (marked.ok()) {
    queue_->Push(&node_);  // no allocation: the node moves
    return marked;
  }
  // No completion event: wait here instead (correct, only synchronous).
  const absl::Status drained = device_->Drain(w.stream, absl::OkStatus());
  queue_->Complete(w, drained);
  return marked;
}

absl::Status StreamChain::Commit(DoneFn done) {
  if (committed_) return absl::FailedPreconditionError("cuda backend: a chain commits once");
  committed_ = true;
  CompletionWork& w = work();
  w.done = std::move(done);
  // Abandoned while waiting for the client: nothing ran; the stream still
  // waits on the client's event, so it is not drained here (that could
  // block for ever) but completed off-thread; the client's record_event is
  // not recorded (the request failed).
  if (abandoned_) return HandOff();
  absl::Status recorded = absl::OkStatus();
  // After the last op (and its copies) on the stream: the client's wait on
  // this event orders its reads of the outputs after our writes.
  if (record_ != nullptr) recorded = device_->RecordEvent(record_->get(), w.stream, "record_event");
  if (async_) {
    const absl::Status marked = HandOff();
    return recorded.ok() ? marked : recorded;
  }
  // Sync: every op synchronized its stream; what is still queued is the
  // wait (no op ran) or the record. Drained so the pooled stream carries
  // nothing of this client into the next request.
  const absl::Status drained = device_->Drain(w.stream, absl::OkStatus());
  queue_->Complete(w, drained);
  return recorded.ok() ? drained : recorded;
}

}  // namespace tokensel::backends
