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
// the device's context failed (StreamDevice::ContextFailed: a sticky
// error; it runs nothing more); if the device is merely marked out of
// service (MarkOutOfService: its context may still run the item's work)
// the item is ABANDONED (below), never completed and released; otherwise
// the item stays and is queried again. An exception while
// completing an item (std::bad_alloc formatting a message, a hold's
// destructor) is caught: `done` still runs (with INTERNAL if it had not),
// so the request's ticket is never lost.
//
// Waits and stuck items (the fourth and fifth reviews): an item with an
// `on_wait` callback (an async request with a client wait) that is not
// complete has its wait's marker queried at every poll (one EventDone per
// such item, bounded by the stuck caps of AsyncRequests): seen complete,
// on_wait(true) runs (the request's wait slot goes back at once, not when
// the work completes); not complete at its stuck_at, on_wait(false) runs
// (its ticket then counts as stuck, not in flight); either once, then the
// callback is cleared; the item stays pending as before. A failed query
// says nothing: before stuck_at it is asked again, at stuck_at it counts
// as not passed (the safe side for the caps). An item that completes
// first never gets the callback (`done` gives the slot back).
//
// Failed queries: a query that fails without a sticky error is asked
// again (the device may recover), but not for ever: once an item's queries
// failed kMinFailedQueries times in a row AND for at least
// failed_query_limit (5 s by default; any successful query resets both),
// the device is treated as failed for it: the device is marked out of
// service (StreamDevice::MarkOutOfService: health NOT_SERVING, every later
// request UNAVAILABLE, the orchestrator restarts the server), and the item
// is abandoned (below) with that error as its deferred error.
//
// Abandoning an item: its `done` runs (the request's ticket completes;
// UNAVAILABLE for a request that had answered OK), and everything its
// device work may still use is LEAKED, never returned: the stream (not
// back in the pool; the backend's destructor may still destroy it, which
// is legal with work pending), the blocks (not back in their pools), the
// event, the FreeGate entry (the pools stay closed: a free could
// synchronize behind the stuck stream), and the holds (buffer leases: the
// mapped memory a kernel may still write), kept in a process-wide list.
// Counted in abandoned().
//
// Shutdown(deadline) stops the queue: the thread keeps completing items
// until none is pending or `deadline` passed; then it abandons what is
// left (an ERROR in the log with how many) and returns. Bounded, so a
// stream stuck on a client's event that never completes cannot keep the
// process from exiting. The destructor shuts down with kShutdownWait.
// Push after Shutdown (the thread gone): the item is completed at once if
// its work is done (one query), else abandoned; it is never left pending.
// With own_thread = false nothing polls but Poll() (tests); then Shutdown
// polls until the deadline and abandons what is left.
// Push never allocates: the item comes in a one-node list (spliced), made
// when the chain began. Thread-safe.
#ifndef TOKENSEL_SERVER_BACKENDS_COMPLETION_QUEUE_H_
#define TOKENSEL_SERVER_BACKENDS_COMPLETION_QUEUE_H_

#include <chrono>
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
  // Async chains with a wait (stream_chain.h): the wait's marker, and the
  // wait rule: `on_wait(true)` once the marker is seen done, or
  // `on_wait(false)` if it has not completed at stuck_at (then cleared).
  StreamDevice::Event wait_marker = nullptr;  // private; destroyed at release
  std::function<void(bool passed)> on_wait;
  std::chrono::steady_clock::time_point stuck_at;
  FreeGate* gate = nullptr;   // entered for a client wait on the stream; left at release
  bool query_stream = false;  // watched by QueryStream (no event recorded, or it failed)
  bool report = true;         // false: the request answered an error; `done` gets OK
  absl::Status error;         // the first failed query, for the deferred error
  int failed_queries = 0;     // in a row (reset by a query that succeeds)
  std::chrono::steady_clock::time_point first_failure;  // of that run
};

class CompletionQueue {
 public:
  using Clock = std::chrono::steady_clock;
  // How long the destructor lets pending items complete.
  static constexpr std::chrono::milliseconds kShutdownWait{10000};
  // The failed-query rule (top of this file).
  static constexpr int kMinFailedQueries = 3;
  static constexpr std::chrono::milliseconds kFailedQueryLimit{5000};

  CompletionQueue(StreamDevice* device, StreamPools pools, bool own_thread = true);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Takes the one item of `node` (a list of one). After Shutdown: completed
  // or abandoned at once (top of this file).
  void Push(std::list<CompletionWork>* node);
  // Completes every pending item whose event is done; how many.
  int Poll();
  // Completes `work` now: its stream must have no work queued (drained by
  // the caller). `error` (not OK) replaces the ops' Finish.
  void Complete(CompletionWork& work, const absl::Status& error);
  // Stops the queue, waiting for pending items at most until `deadline`
  // (top of this file). Later calls return at once.
  void Shutdown(Clock::time_point deadline);
  void Shutdown() { Shutdown(Clock::now() + kShutdownWait); }
  size_t pending() const;
  size_t abandoned() const;
  // The streams of the abandoned items (their work may never complete):
  // whoever destroys the streams must not synchronize these.
  std::vector<StreamDevice::Stream> abandoned_streams() const;
  void set_failed_query_limit(std::chrono::milliseconds limit) { failed_query_limit_ = limit; }

 private:
  void Loop();
  // Whether `work` completed (EventDone, or QueryStream: see the top);
  // sets *give_up when its queries failed for too long, or failed on a
  // device marked out of service (the item is then abandoned with
  // work.error).
  bool Ready(CompletionWork& work, bool* give_up);
  // The wait rule for a pending `work` (top of this file).
  void CheckWait(CompletionWork& work);
  // Returns the blocks, event, stream and holds of `work`.
  void Release(CompletionWork& work);
  // Runs `done` with `error` and leaks the rest (top of this file).
  void Abandon(CompletionWork& work, const absl::Status& error);
  // Abandons every pending item (the deadline of Shutdown passed).
  void AbandonPending();

  StreamDevice* const device_;
  const StreamPools pools_;
  std::chrono::milliseconds failed_query_limit_ = kFailedQueryLimit;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<CompletionWork> items_;                      // guarded by mu_
  bool stop_ = false;                                    // guarded by mu_
  bool closed_ = false;                                  // guarded by mu_: nothing polls any more
  Clock::time_point deadline_;                           // guarded by mu_: of Shutdown
  size_t abandoned_ = 0;                                 // guarded by mu_
  std::vector<StreamDevice::Stream> abandoned_streams_;  // guarded by mu_
  std::mutex shutdown_mu_;                               // one Shutdown at a time
  std::thread thread_;
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_COMPLETION_QUEUE_H_
