// Executor: resolves a request's tensors to views, runs the op on the
// backend, and collects inline outputs.
//
// Resolution, per tensor, before anything runs:
//  - kBuffer: lease the session's buffer (NOT_FOUND / PERMISSION_DENIED),
//    default row-major strides, then check — overflow-safe — that the view's
//    byte extent [byte_offset, byte_offset + extent) lies inside the buffer
//    (OUT_OF_RANGE naming the field, offset, extent and buffer size), and that
//    the backend can access the buffer's memory (FAILED_PRECONDITION).
//  - kInline: strides must be empty and the byte length must equal
//    product(shape) * element size (INVALID_ARGUMENT); copied to staging.
//  - kNone (outputs): the output is allocated in staging with the shape the
//    op derives and returned inline under the field's name.
// Then the kernels' own validation runs (inside Backend::Run), so bad
// indices etc. come back as INVALID_ARGUMENT with nothing written.
// Leases are held until the op finishes: unregistering a buffer during an op
// is deferred.
// Device: before anything is resolved, the backend routes the op
// (Backend::Route; MultiDeviceBackend picks the device of its by-reference
// tensors, FAILED_PRECONDITION when they are on different devices) and the
// whole op (staging, scratch, run, copies back) uses the routed backend; a
// buffer re-registered on another device meanwhile is FAILED_PRECONDITION at
// resolution (Backend::OnDevice). op_duration carries its device label.
// Lease: right after routing the op takes one RequestLease of the routed
// backend (Backend::BeginRequest: on CUDA one stream, pooled staging and the
// workspace) and holds it until the inline outputs are copied back; every
// staging copy and the op go through it, so on CUDA they are ordered on one
// stream (backend.h).
//
// Memory: every allocation an op causes is counted in the request's
// MemoryBudget reservation before it is made (RESOURCE_EXHAUSTED otherwise,
// before anything runs): staging for inline inputs and outputs, the
// backend's scratch (released when the op ends) and the inline results
// (held by the reservation until the caller drops it, i.e. until the
// response is handed to the transport).
// Stop: the op runs under `options.stop` (kernels/stop.h); a fired token
// ends it with CANCELLED / DEADLINE_EXCEEDED (outputs may be partly
// written), and RunAll does not start further ops.
// Lost memory: if a host buffer the op used was truncated under it by its
// owner (MappedRegion::faulted), the op fails FAILED_PRECONDITION naming the
// buffer, whatever it computed, and the buffer is unregistered.
//
// Thread-safe: any number of concurrent Run calls.
#ifndef TOKENSEL_SERVER_CORE_EXECUTOR_H_
#define TOKENSEL_SERVER_CORE_EXECUTOR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/stop.h"
#include "server/core/async_requests.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/memory_budget.h"
#include "server/core/request.h"

namespace tokensel::core {

class ServiceMetrics;

struct ExecutorLimits {
  // Inline output bytes of one op (RESOURCE_EXHAUSTED beyond, before
  // allocating).
  uint64_t max_inline_bytes = uint64_t{64} << 20;
  // Inline output bytes of all the ops of one RunAll (one response): checked
  // for the whole list before the first op runs.
  uint64_t max_response_bytes = uint64_t{64} << 20;
  // EstimateOpWork of one op (RESOURCE_EXHAUSTED before anything is
  // resolved); 0 = no limit.
  uint64_t max_op_work = 0;
};

struct RunOptions {
  const kernels::StopToken* stop = nullptr;     // null: never stops
  MemoryBudget::Reservation* memory = nullptr;  // null: a reservation of the call's own
  // RunAll with CUDA IPC events (RunChain, executor_chain.cc); null or
  // empty: none. `async` admits the requests answered before their device
  // work completed; null: every evented request is synchronous.
  const IpcEvents* events = nullptr;
  AsyncRequests* async = nullptr;
  // The caller's Peer::Principal() (the session's owner): `async` caps the
  // evented Executes per peer too. Empty: not known (tests).
  std::string peer;
};

class Executor {
 public:
  // `budget` and `metrics` may be null (nothing is counted / observed).
  Executor(Backend* backend, BufferRegistry* registry, ServiceMetrics* metrics,
           ExecutorLimits limits, MemoryBudget* budget = nullptr);

  absl::StatusOr<OpResult> Run(const std::string& session, const OpRequest& op,
                               const RunOptions& options = {});

  // Runs `ops` in order and stops at the first failure, returned with its
  // position prefixed ("ops[2] (GatherTokens): ..."). Effects of the ops
  // before it remain. First, RESOURCE_EXHAUSTED if their inline outputs
  // together exceed max_response_bytes (nothing runs).
  // With options.events (not empty): one route and one RequestChain for all
  // the ops (one device, one stream, in order; FAILED_PRECONDITION when
  // their buffers are on different devices). If a record_event is given,
  // no op returns an inline output and options.async admits it (its caps:
  // RESOURCE_EXHAUSTED, nothing runs), the request is asynchronous: the ops
  // are launched, not waited for; their staging, workspaces, buffer leases
  // and memory reservation stay held until the completion thread finished
  // them, and the first op that fails on the device becomes the session's
  // deferred error (AsyncRequests). Errors found before launch are
  // returned as usual (then no deferred error is kept for the request).
  // Otherwise (inline outputs, or no record_event) every op completes
  // before RunAll returns and record_event is recorded after the last.
  absl::StatusOr<std::vector<OpResult>> RunAll(const std::string& session,
                                               absl::Span<const OpRequest> ops,
                                               const RunOptions& options = {});

  // The inline output bytes `op` would return, from its metadata alone (0
  // when its specs are invalid: running it reports that). No lease, no
  // allocation.
  uint64_t InlineOutputBytes(const OpRequest& op) const;

  Backend& backend() const { return *backend_; }
  MemoryBudget* budget() const { return budget_; }

 private:
  // The backend that serves `ops` (Backend::Route), from the devices of the
  // buffers their by-reference tensors name; `on_device` (optional)
  // receives how many of those are on a device (when the backend asked).
  absl::StatusOr<BackendRoute> Route(const std::string& session, absl::Span<const OpRequest> ops,
                                     size_t* on_device = nullptr) const;
  // RESOURCE_EXHAUSTED when the op's work is above max_op_work.
  absl::Status CheckWork(const OpRequest& op) const;
  // RESOURCE_EXHAUSTED when the inline outputs of `ops` exceed one response.
  absl::Status CheckResponse(absl::Span<const OpRequest> ops) const;
  // How many tensors `op` returns inline (0 for invalid specs).
  size_t InlineOutputs(const OpRequest& op) const;
  // Both, from one resolution in measure mode.
  void MeasureInline(const OpRequest& op, uint64_t* bytes, size_t* count) const;
  // Resolves and runs `op` on `backend` under `lease` into `result`;
  // `staged` receives the staging bytes reserved (the caller gives them
  // back after ending the lease). The op's buffer leases go to `keep` as
  // they are taken, which the caller declares BEFORE `lease` (or the
  // chain): destroyed after it, on every path (an exception included), so
  // a buffer is never unmapped while device work of the op may still use
  // it. `async` (an async chain): the op's scratch stays reserved.
  absl::Status RunLeased(const std::string& session, const OpRequest& op, Backend& backend,
                         RequestLease* lease, MemoryBudget::Reservation* memory,
                         const RunOptions& options, std::vector<BufferLease>* keep, bool async,
                         OpResult* result, uint64_t* staged);
  absl::StatusOr<std::vector<OpResult>> RunChain(const std::string& session,
                                                 absl::Span<const OpRequest> ops,
                                                 const RunOptions& options);

  Backend* const backend_;
  BufferRegistry* const registry_;
  ServiceMetrics* const metrics_;
  const ExecutorLimits limits_;
  MemoryBudget* const budget_;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_EXECUTOR_H_
