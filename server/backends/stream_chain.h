// StreamChain: the core::RequestChain (backend.h) of a device backend, over
// StreamDevice, so its ordering, holding and cleanup are tested without a
// device (tests/server/backends/stream_chain_test.cc).
//
// One stream (from the device's pool) for every op of the Execute:
//   Begin:   the stream waits on the client's wait_event (WaitEvent), before
//            any op stages anything;
//   BeginOp: a StreamLease on that stream (StreamLease::OnChain);
//   Commit:  the client's record_event is recorded on the stream after the
//            last op; then
//            - sync mode: the stream is drained (already idle when an op
//              ran: its Finish synchronized) and goes back to the pool;
//            - async mode: a private completion event is recorded and the
//              work item (stream, the staging and ops the leases handed over,
//              the Hold()s) goes to the CompletionQueue; the request thread
//              returns without waiting. If the private event cannot be made
//              or recorded, the stream is drained here and the item
//              completed at once (correct, only not asynchronous).
// AwaitWait (sync chains): polls the client's wait event on the host
// (EventDone, back-off 20 us doubling to 1 ms) until it completed, or until
// the stop token fires: then the chain is abandoned, and Commit hands the
// stream (whose only work is the wait) to the CompletionQueue without
// recording the client's event, instead of draining it: a client event
// that never completes costs a stream, not a thread.
// A chain destroyed without Commit (the request failed before it got
// there) drains its stream and returns everything, calling no `done`.
// The chain keeps its two events (IpcEvent, shared with the session's
// cache) until it ends, so a concurrent eviction cannot destroy an event
// between its open and its use.
// Used by one thread; the device, the pools and the queue outlive it.
#ifndef TOKENSEL_SERVER_BACKENDS_STREAM_CHAIN_H_
#define TOKENSEL_SERVER_BACKENDS_STREAM_CHAIN_H_

#include <list>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/backends/completion_queue.h"
#include "server/backends/ipc_event_cache.h"
#include "server/backends/stream_lease.h"
#include "server/core/backend.h"

namespace tokensel::backends {

class StreamChain final : public core::RequestChain, private LeaseSink {
 public:
  // Takes a stream and, with `wait`, makes it wait on the client's event.
  static absl::StatusOr<std::unique_ptr<StreamChain>> Begin(StreamDevice* device, StreamPools pools,
                                                            CompletionQueue* queue,
                                                            std::shared_ptr<IpcEvent> wait,
                                                            std::shared_ptr<IpcEvent> record,
                                                            bool async);
  ~StreamChain() override;

  bool async() const override { return async_; }
  absl::StatusOr<std::unique_ptr<core::RequestLease>> BeginOp(std::string label) override;
  void Hold(std::shared_ptr<void> keep) override;
  absl::Status AwaitWait(const kernels::StopToken* stop) override;
  absl::Status Commit(DoneFn done) override;

  StreamDevice::Stream stream() const { return work().stream; }

 private:
  StreamChain(StreamDevice* device, StreamPools pools, CompletionQueue* queue, bool async);
  CompletionWork& work() { return node_.front(); }
  const CompletionWork& work() const { return node_.front(); }
  // Records the private completion event and splices the work into the
  // queue; if the event cannot be made or recorded, drains and completes
  // here. The event's error, if any.
  absl::Status HandOff();
  // LeaseSink.
  void AdoptStaging(BlockPool::Block pinned, BlockPool::Block device) override;
  void AdoptOp(PendingOp op) override;

  StreamDevice* const device_;
  const StreamPools pools_;
  CompletionQueue* const queue_;
  const bool async_;
  std::shared_ptr<IpcEvent> wait_;
  std::shared_ptr<IpcEvent> record_;
  std::list<CompletionWork> node_;  // one item; spliced into the queue by Commit
  bool committed_ = false;
  bool abandoned_ = false;  // AwaitWait stopped: Commit hands off, records nothing
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_STREAM_CHAIN_H_
