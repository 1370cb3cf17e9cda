// StreamChain: the core::RequestChain (backend.h) of a device backend, over
// StreamDevice, so its ordering, holding and cleanup are tested without a
// device (tests/server/backends/stream_chain_test.cc).
//
// One stream (from the device's pool) for every op of the Execute:
//   Begin:   the private completion event is created first (so that the
//            hand-off below cannot fail for want of one; an async chain
//            with a wait creates its wait's marker too); then the stream
//            waits on the client's wait_event (WaitEvent), before any op
//            stages anything, and records the wait's marker right after
//            the wait (below);
//   BeginOp: a StreamLease on that stream (StreamLease::OnChain);
//   Commit:  the client's record_event is recorded on the stream after the
//            last op (the only record of it a request makes); then
//            - sync mode, the host saw the wait complete: the stream is
//              drained (already idle when an op ran: its Finish
//              synchronized) and goes back to the pool;
//            - async mode, or a sync chain whose wait the host did not see
//              complete (abandoned): the private event is recorded and the
//              work item (stream, the staging and ops the leases handed
//              over, the Hold()s) goes to the CompletionQueue; the request
//              thread returns without waiting. If the record fails, the
//              item goes to the queue all the same, watched by QueryStream.
// The rule: a stream that was given a client wait is NEVER synchronized by
// the host unless the host saw that wait complete (the marker's record is
// done): a client event that never completes (or a client that destroyed
// it, or recorded it again) would block the synchronizing thread for ever.
// AwaitWait (sync chains): polls the wait's marker (EventDone, back-off 20
// us doubling to 1 ms) until it completed, or until the stop token fires or
// the poll fails: then the chain is abandoned, and Commit hands the stream
// (whose only work is the wait) to the CompletionQueue without recording
// the client's event. Why the marker and not the client's event itself:
// cudaEventQuery of the client's event reports its LATEST record, which the
// client may have re-recorded (on an idle stream: done at once) after the
// stream captured the previous one; the marker is the server's own and is
// recorded behind exactly the wait the stream holds. The host waits at most
// kMaxHostWait (60 s) even when the call has no deadline.
// Async chains with a wait (the fourth and fifth reviews): the completion
// queue polls the wait's marker with the item's event; seen complete, the
// request's `on_wait(true)` runs at once (AsyncRequests: its wait slot goes
// back, so a pipeline of waits that pass is never refused); still not
// complete kAsyncStuckAfter (the same 60 s; set_max_host_wait sets both)
// after the wait was queued, `on_wait(false)` runs (it moves from in flight
// to stuck, in its wait slot), so async requests whose client never records
// its event cannot hold the admission caps for ever either, nor exceed the
// stuck caps (async_requests.h).
// No record_event check (the fourth review): an earlier version recorded
// record_event once in Begin, on the idle stream, to learn before any op
// ran whether the driver refused an event of another device. Dropped: (1)
// cudaIpcOpenEventHandle creates the event in OUR context, and a record
// needs only event and stream of one context, so the driver most likely
// records such an event without complaint (unverified: no two-GPU device
// here); (2) it broke the event's meaning: between Begin and Commit the
// event's latest record was one already complete, so a consumer that
// waited on record_event then (e.g. after the reply of an earlier request
// with the same record_event) read that request's outputs before its
// kernels ran, and a request failing after Begin left the event complete.
// So an event of another device is NOT detected before the ops run: if the
// driver refuses it at Commit, the request fails with that error
// (classified as any client event's: client_event_error.h) after its ops
// ran; if it accepts it, it is recorded. The client must pass events
// created on the device of the request's buffers (docs/server.md).
// A chain destroyed without Commit (the request failed before it got
// there, an exception included) drains its stream if that is safe (above),
// or else hands it to the queue, and returns everything, calling no `done`.
// The chain keeps its two events (IpcEvent, shared with the session's
// cache) until it ends, so a concurrent eviction cannot destroy an event
// between its open and its use.
// Used by one thread; the device, the pools and the queue outlive it.
#ifndef TOKENSEL_SERVER_BACKENDS_STREAM_CHAIN_H_
#define TOKENSEL_SERVER_BACKENDS_STREAM_CHAIN_H_

#include <chrono>
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
  absl::Status Commit(DoneFn done, WaitFn on_wait) override;

  // The longest a sync request's host waits for the client's event
  // (AwaitWait) when its call has no earlier deadline: then
  // DEADLINE_EXCEEDED naming wait_event, and the chain is abandoned.
  static constexpr std::chrono::milliseconds kMaxHostWait{60000};
  // How long an async chain's wait may stay unpassed before the request
  // counts as stuck (top of this file): the same bound.
  static constexpr std::chrono::milliseconds kAsyncStuckAfter = kMaxHostWait;
  // Sets both (tests).
  void set_max_host_wait(std::chrono::milliseconds wait) {
    max_host_wait_ = wait;
    stuck_after_ = wait;
  }

  // The chain's stream; null after Commit (the item went to the queue).
  StreamDevice::Stream stream() const { return node_.empty() ? nullptr : work().stream; }

 private:
  StreamChain(StreamDevice* device, StreamPools pools, CompletionQueue* queue, bool async);
  CompletionWork& work() { return node_.front(); }
  const CompletionWork& work() const { return node_.front(); }
  // Records the private completion event and splices the work into the
  // queue (watched by QueryStream if the record failed). Never blocks. The
  // record's error, if any.
  absl::Status HandOff();
  // Whether the host may synchronize the stream: it was given no client
  // wait, or the host saw that wait complete.
  bool MaySynchronize() const { return wait_ == nullptr || wait_passed_; }
  // LeaseSink.
  void Reserve(size_t staging, size_t ops) override;
  void AdoptStaging(BlockPool::Block pinned, BlockPool::Block device) noexcept override;
  void AdoptOp(PendingOp op) noexcept override;

  StreamDevice* const device_;
  const StreamPools pools_;
  CompletionQueue* const queue_;
  const bool async_;
  std::shared_ptr<IpcEvent> wait_;
  std::shared_ptr<IpcEvent> record_;
  std::list<CompletionWork> node_;  // one item; spliced into the queue by Commit
  std::chrono::milliseconds max_host_wait_ = kMaxHostWait;
  std::chrono::milliseconds stuck_after_ = kAsyncStuckAfter;
  std::chrono::steady_clock::time_point wait_began_;  // the wait was queued
  bool committed_ = false;
  bool wait_passed_ = false;     // AwaitWait saw the wait's marker complete
  size_t staging_promised_ = 0;  // reserved, not adopted yet
  size_t ops_promised_ = 0;
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_STREAM_CHAIN_H_
