// StreamChain: the core::RequestChain (backend.h) of a device backend, over
// StreamDevice, so its ordering, holding and cleanup are tested without a
// device (tests/server/backends/stream_chain_test.cc).
//
// One stream (from the device's pool) for every op of the Execute:
//   Begin:   the private completion event is created first (so that the
//            hand-off below cannot fail for want of one); then the client's
//            record_event is checked (below); then the stream waits on the
//            client's wait_event (WaitEvent), before any op stages
//            anything; a sync chain then records its private event right
//            after the wait (the wait's marker, below);
//   BeginOp: a StreamLease on that stream (StreamLease::OnChain);
//   Commit:  the client's record_event is recorded on the stream after the
//            last op; then
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
// the client's event again (only the record_event check below). Why the marker and not the client's
// event itself: cudaEventQuery of the client's event reports its LATEST record, which the client
// may have re-recorded (on an idle stream: done at once) after the stream captured the previous
// one; the marker is the server's own and is recorded behind exactly the wait the stream holds. The
// host waits at most kMaxHostWait (60 s) even when the call has no deadline. The record_event
// check: an event the driver will not record on this device (an event created on another device, or
// one the client destroyed) would otherwise fail only at Commit, after every op was launched
// (writing the outputs the client never learns are ready). CUDA has no query for an event's device,
// so Begin records the client's record_event once on the chain's stream BEFORE its wait (the stream
// is idle: the record completes at once): the driver accepts or refuses it there, before anything
// of the request runs. A refusal (the client's code, or another code the device probe does not
// confirm) is FAILED_PRECONDITION naming record_event and this device; nothing ran. Why before the
// wait: behind it, the check's record would stay pending as long as the client's wait_event (for
// ever on a request abandoned at its deadline), and a client waiting on record_event after such an
// error would hang. Harmless for the client: until Commit's record (after the ops) the event is not
// the request's to wait on (a wait taken before the reply may see any earlier record); the event
// shows complete, as an event the server never recorded does. Except when record_event IS the
// wait_event (one event, ping-pong): recorded before the wait, the check
// would replace the record the wait must capture (the stream would not
// wait for the client's work), so then the check comes right after the
// wait (the wait succeeded there, so the device accepts the event; a
// record can still fail, and then only behind the wait).
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
#include "absl/strings/string_view.h"
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
                                                            bool async,
                                                            absl::string_view device_name);
  ~StreamChain() override;

  bool async() const override { return async_; }
  absl::StatusOr<std::unique_ptr<core::RequestLease>> BeginOp(std::string label) override;
  void Hold(std::shared_ptr<void> keep) override;
  absl::Status AwaitWait(const kernels::StopToken* stop) override;
  absl::Status Commit(DoneFn done) override;

  // The longest a sync request's host waits for the client's event
  // (AwaitWait) when its call has no earlier deadline: then
  // DEADLINE_EXCEEDED naming wait_event, and the chain is abandoned.
  static constexpr std::chrono::milliseconds kMaxHostWait{60000};
  void set_max_host_wait(std::chrono::milliseconds wait) { max_host_wait_ = wait; }

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
  bool committed_ = false;
  bool wait_passed_ = false;     // AwaitWait saw the wait's marker complete
  size_t staging_promised_ = 0;  // reserved, not adopted yet
  size_t ops_promised_ = 0;
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_STREAM_CHAIN_H_
