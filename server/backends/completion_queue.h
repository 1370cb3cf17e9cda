// CompletionQueue: where the async requests of one device backend (an
// Execute with a record_event and no inline output: stream_chain.h) go
// after their reply, until their device work completed.
//
// A work item is everything the request's queued device work still uses:
// its stream, its staging blocks, each op's workspace (Finish reads the
// op's DeviceStatus word there) with a copy of its args, and opaque holds
// (the buffer leases of its by-reference tensors, its MemoryBudget
// reservation, its route). A private event recorded after the last op
// (and after the client's record_event) marks the end of that work.
//
// The completion thread polls EventDone of every pending item (never a
// host synchronization, so one item whose stream waits on a slow client
// event does not hold back the others; backoff 50 us doubling to 1 ms
// while nothing completes). For a completed item, in this order: each op's
// Finish (the stream is idle, so its synchronization returns at once; the
// first error, "ops[k] (Name): ...", is the request's deferred error; later
// ops of the request ran all the same: the device does not stop a stream
// at a failed op, whose kernels wrote nothing), then every block goes back
// to its pool, the event is destroyed, the stream goes back, the holds are
// dropped, and last `done(deferred error)` runs, so that a client told its
// request is done finds everything released. An item whose event could not
// be recorded (query_stream), or whose EventDone failed, is watched with
// QueryStream instead: the queue NEVER synchronizes a stream on the host
// (it may wait on a client's event that never completes). A failed query
// completes the item with that error (instead of the ops' outcomes) once
// the device is out of service (a failed context runs nothing more);
// otherwise the item stays and is queried again. An exception while
// completing an item (std::bad_alloc formatting a message, a hold's
// destructor) is caught: `done` still runs (with INTERNAL if it had not),
// so the request's ticket is never lost.
//
// Shutdown (and the destructor) waits until every item completed, then
// stops the thread: whoever owns the pools and the device destroys the
// queue first (a server whose async work is stuck past its shutdown grace
// leaks the backend, and so this queue, instead: server/app/server.h).
// With own_thread = false nothing polls but Poll() (tests).
// Push never allocates: the item comes in a one-node list (spliced), made
// when the chain began. Thread-safe.
#ifndef TOKENSEL_SERVER_BACKENDS_COMPLETION_QUEUE_H_
#define TOKENSEL_SERVER_BACKENDS_COMPLETION_QUEUE_H_

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/backends/stream_lease.h"

namespace tokensel::backends {

struct CompletionWork {
  StreamDevice::Stream stream = nullptr;     // returned to the device at the end
  StreamDevice::Event done_event = nullptr;  // private; null: none recorded
  std::vector<std::pair<BlockPool::Block, BlockPool::Block>> staging;  // pinned, device
  std::vector<LeaseSink::PendingOp> ops;
  std::vector<std::shared_ptr<void>> holds;
  std::function<void(absl::Status)> done;  // may be empty
  FreeGate* gate = nullptr;   // entered for a client wait on the stream; left at release
  bool query_stream = false;  // watched by QueryStream (no event recorded, or it failed)
  bool report = true;         // false: the request answered an error; `done` gets OK
  absl::Status error;         // the first failed query, for the deferred error
};

class CompletionQueue {
 public:
  CompletionQueue(StreamDevice* device, StreamPools pools, bool own_thread = true);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Takes the one item of `node` (a list of one).
  void Push(std::list<CompletionWork>* node);
  // Completes every pending item whose event is done; how many.
  int Poll();
  // Completes `work` now: its stream must have no work queued (drained by
  // the caller). `error` (not OK) replaces the ops' Finish.
  void Complete(CompletionWork& work, const absl::Status& error);
  void Shutdown();
  size_t pending() const;

 private:
  void Loop();
  // Whether `work` completed (EventDone, or QueryStream: see the top).
  bool Ready(CompletionWork& work);
  // Returns the blocks, event, stream and holds of `work`.
  void Release(CompletionWork& work);

  StreamDevice* const device_;
  const StreamPools pools_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<CompletionWork> items_;  // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  std::thread thread_;
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_COMPLETION_QUEUE_H_
