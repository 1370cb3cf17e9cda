// Executor::RunChain: the ops of an Execute that carries CUDA IPC events
// (contract: executor.h, RunAll; the device side: RequestChain in backend.h).
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/core/executor.h"

namespace tokensel::core {

absl::StatusOr<std::vector<OpResult>> Executor::RunChain(const std::string& session,
                                                         absl::Span<const OpRequest> ops,
                                                         const RunOptions& options) {
  const IpcEvents& events = *options.events;
  RETURN_IF_ERROR(CheckResponse(ops));
  // Everything that can be refused from metadata is refused before the
  // stream waits on the client's event, so that nothing is queued for it.
  bool inline_outputs = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (absl::Status work = CheckWork(ops[i]); !work.ok()) {
      return absl::Status(work.code(), absl::StrCat("ops[", i, "] ", work.message()));
    }
    inline_outputs = inline_outputs || InlineOutputs(ops[i]) > 0;
  }
  // Asynchronous only when the reply needs nothing from the device: inline
  // outputs are in the reply, so their request completes first (the event
  // is still recorded after the last op).
  const bool async = !events.record.empty() && !inline_outputs && options.async != nullptr;
  // One device for the whole request (its by-reference tensors decide), so
  // that every op runs on the one stream of the chain.
  size_t on_device = 0;
  ASSIGN_OR_RETURN(BackendRoute route, Route(session, ops, &on_device));
  // The client's events belong to one device, which the server cannot
  // learn from their handles: on a server of several devices the request's
  // buffers must name it (else the least loaded device would open and
  // record another device's events, after its ops were launched).
  if (const size_t devices = backend_->devices().size(); devices > 1 && on_device == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "an Execute with wait_event or record_event on a server of ", devices,
        " devices must name a buffer on the event's device (its by-reference tensors choose the "
        "device that opens the events); none does"));
  }
  // What the device work of the request uses besides its stream, staging
  // and workspaces: the buffers its views point into (`keep`: an
  // UnregisterBuffer or a session end meanwhile is deferred), the memory
  // reservation (async: the request's own; nothing of it goes into the
  // reply), the route (the device counts the request in flight) and the
  // admission ticket. Allocated before the chain begins and given to it
  // whole, with one Hold that cannot throw (RequestChain::Hold), on every
  // path once anything may be queued: an exception included, since the
  // chain's destructor may then hand its stream to the completion thread
  // (it may still wait on the client's event) rather than drain it.
  struct Held {
    std::vector<BufferLease> keep;
    MemoryBudget::Reservation own;
    std::optional<BackendRoute> route;
    std::optional<AsyncRequests::Ticket> ticket;
  };
  auto held = std::make_shared<Held>();
  // Counted (and capped) too: a sync request that waits on a client event,
  // which may leave its stream behind waiting (RequestChain::AwaitWait).
  if (options.async != nullptr && (async || !events.wait.empty())) {
    ASSIGN_OR_RETURN(held->ticket,
                     options.async->Admit(session, options.peer, !events.wait.empty()));
  }
  Backend& backend = route.backend();
  held->route.emplace(std::move(route));
  if (budget_ != nullptr) held->own = budget_->Open();
  ASSIGN_OR_RETURN(std::unique_ptr<RequestChain> chain, backend.BeginChain(session, events, async));
  MemoryBudget::Reservation* memory =
      (!async && options.memory != nullptr) ? options.memory : &held->own;
  std::vector<OpResult> results;
  absl::Status status;
  RequestChain::DoneFn done;
  RequestChain::WaitFn on_wait;
  try {
    results.reserve(ops.size());
    // Sync: the host waits for the client's event first, within the call's
    // deadline (Finish's synchronization could not be interrupted).
    status = chain->AwaitWait(options.stop);
    // Abandoned (sync, the client's event not seen complete): the stream is
    // left waiting on it, maybe for ever. The request stops taking
    // admission from others and counts as stuck, under its own caps
    // (async_requests.h), until the event completes.
    if (!status.ok() && held->ticket.has_value()) held->ticket->Abandon();
    // Sync, the host saw the wait pass: the request's wait slot goes back
    // now (async_requests.h); it stays in flight until it completes. (An
    // async chain's AwaitWait waits for nothing: the completion thread
    // reports its wait, through `on_wait` below.)
    if (status.ok() && !async && held->ticket.has_value()) held->ticket->WaitPassed();
    for (size_t i = 0; i < ops.size() && status.ok(); ++i) {
      const std::string label = absl::StrCat("ops[", i, "] (", OpName(ops[i]), ")");
      absl::StatusOr<std::unique_ptr<RequestLease>> lease = chain->BeginOp(label);
      OpResult result;
      uint64_t staged = 0;
      if (lease.ok()) {
        status = RunLeased(session, ops[i], backend, lease->get(), memory, options, &held->keep,
                           async, &result, &staged);
        // Sync: the lease drains and returns its staging. Async: it hands
        // its staging and op to the chain (nothing waits).
        lease->reset();
      } else {
        status = lease.status();
      }
      if (!async) memory->Shrink(staged);
      if (!status.ok()) {
        status = absl::Status(status.code(), absl::StrCat(label, ": ", status.message()));
      } else {
        results.push_back(std::move(result));
      }
    }
    if (held->ticket.has_value()) {
      auto shared = std::make_shared<AsyncRequests::Ticket>(std::move(*held->ticket));
      held->ticket.reset();
      // Only an async request that answered OK can have a deferred error;
      // the others answered their error themselves (a failed Commit too:
      // the chain then completes the work with no deferred error).
      const bool report = async && status.ok();
      done = [shared, report](const absl::Status& deferred) {
        shared->Complete(report ? deferred : absl::OkStatus());
      };
      // Async with a wait_event: the completion thread gives the ticket's
      // wait slot back once it sees the stream's wait pass, or abandons it
      // (in flight -> stuck) if it has not passed after
      // StreamChain::kAsyncStuckAfter; every call comes from that thread.
      if (async && !events.wait.empty()) {
        on_wait = [shared](bool passed) { passed ? shared->WaitPassed() : shared->Abandon(); };
      }
    }
  } catch (...) {
    chain->Hold(held);  // cannot throw; ~chain then waits for or hands off the work
    throw;
  }
  // Async: whatever was launched keeps what it uses until it completed.
  // Sync: every op completed; `held` goes with the chain or after it.
  if (async) chain->Hold(held);
  const absl::Status committed = chain->Commit(std::move(done), std::move(on_wait));
  chain.reset();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(committed);
  return results;
}

}  // namespace tokensel::core
