// AsyncRequests: the Executes the server answered before their device work
// completed (a record_event and no inline output: RequestChain's async
// mode), per session: how many are in flight (bounded), and the first error
// their device work reported after the reply (the deferred error). Sync
// Executes that wait on a client event are admitted too (their stream may
// be left waiting on it: RequestChain::AwaitWait), never with an error.
//
//   ASSIGN_OR_RETURN(AsyncRequests::Ticket t, async.Admit(session, peer, may_stick));
//   ... chain->Commit([t = std::move(t)](absl::Status s) mutable { t.Complete(s); });
//
// Caps: Admit answers RESOURCE_EXHAUSTED (counted in rejected()) when the
// session already has `per_session` outstanding (in flight, or stuck:
// below), its peer `per_peer` or the server `total`; nothing of the
// request runs. Each in-flight request holds a stream, its staging, its
// workspaces and its memory reservation until the completion thread is
// done with it, and a stuck one for as long as its event does not
// complete, so the caps bound what clients that never wait can pin.
//
// Deferred errors: Complete(error) keeps the first one per session until
// TakeDeferred returns it (and forgets it): with the op's own code, its
// message prefixed "deferred from async Execute #N of this session: ops[k]
// (Name): ...", N counting the session's async Executes from 1 (the number
// is the ticket's). Later errors while one is kept are dropped (counted in
// dropped_errors()): the first one names the request the client must redo.
//
// Abandoned requests (Ticket::Abandon): a request whose stream may wait on
// the client's wait_event for ever: a sync Execute whose host wait ended
// (its deadline, the server's maximum wait), and an async one whose wait
// had not passed 60 s after it began (StreamChain::kAsyncStuckAfter, the
// bound of a sync host wait; the completion queue watches the wait's
// marker and calls Ticket::Abandon: stream_chain.h). Such a request counts
// as *stuck* instead of in flight, under the wait caps: stuck_per_session,
// stuck_per_peer and stuck_total (the server's flags
// --max_waits_per_session, --max_waits_per_peer, --max_waits; 8, 64, 256 by
// default), and still against the admission caps above: in flight + stuck
// <= per_session, per_peer and total (the second read of the seventh
// review, finding 3: it left them, so one peer held per_peer requests in
// flight plus stuck_per_peer stuck, each with its memory reservation). A
// stuck request completes (its ticket) when its event finally completes.
//
// Wait slots (the fifth review: the stuck caps held only at admission, and
// requests admitted below them turned stuck later unchecked: one uid with 4
// sessions x 16 async waits never recorded held all 64 server-wide stuck
// places after 60 s). The bound now holds by construction: a request with a
// wait_event (`may_stick`, async or sync) takes a *wait slot* at Admit,
// counted per session, per peer and in the server against the wait caps:
// Admit is RESOURCE_EXHAUSTED when waiting + stuck already reached a cap
// (naming the cap, both counts and the scope; nothing is counted). The
// slot is given back as soon as the wait is known to have passed
// (Ticket::WaitPassed: the host saw the wait's marker complete for a sync
// request, the completion queue for an async one), or when the request
// completes; a request that turns stuck (Abandon) keeps its slot, as a stuck
// one. Only a request holding a wait slot can turn stuck (Abandon of a
// ticket without one does nothing: its stream waits on nothing of the
// client's). So at every moment waiting + stuck <= the caps, whatever the
// timing, and a client whose events never complete can stick at most what
// it was admitted to wait for: the caps bound the waits *outstanding*
// (waiting or stuck), not only the stuck ones. What a stuck request holds:
// its stream, its memory reservation (within --memory_budget_bytes), its
// buffers' leases, and its device's FreeGate stays closed (deferred frees
// of that device wait: server/core/free_gate.h).
//
// The numbers (the seventh review: 16 per peer and 64 per server, sized for
// requests *stuck* 60 s, refused well-behaved pipelining once they counted
// every pending wait: one uid is usually every worker of one job, 8
// workers x 2-3 steps queued ahead are 16-24 pending waits, and 4 such
// uids took the server's 64). 8 per session: a client may queue a few steps
// ahead of its events. 64 per peer = per_peer and 256 per server = total,
// the admission caps: a wait slot is taken only by a request admitted, and
// a stuck request keeps counting against the admission caps, so what stuck
// requests pin is no more than what admission lets requests in flight pin
// at once (a peer's in flight + stuck <= per_peer), and one peer at most a
// quarter of the server's requests. In memory, one peer's stuck requests
// pin at most stuck_per_peer x the per-request bound
// (--max_request_memory_bytes, min(total, 1 GiB) by default), within the
// budget's total (--memory_budget_bytes, a quarter of RAM): with the
// defaults 64 x 1 GiB, the whole budget of any host up to 256 GiB of RAM,
// for as long as the peer leaves its events unrecorded (the other peers'
// requests that need server memory are then RESOURCE_EXHAUSTED). An
// operator who serves mutually distrusting peers keeps
// --max_waits_per_peer x --max_request_memory_bytes below the budget's
// total. Flags, since the right numbers depend on the jobs
// (AsyncLimits::CheckWaitCaps: 0 < per session <= per peer <= total); a
// wait cap above its admission cap never applies (every wait is in flight
// or stuck: the admission cap refuses first).
//
// Per peer (the fourth review): every cap counts per session, per peer
// (`peer`: core::Peer::Principal() of the caller, the identity
// max_sessions_per_peer counts; "" in tests) and in the server, and by
// default per_peer < total, stuck_per_peer < stuck_total. So one peer,
// however many sessions it opens (up to max_sessions_per_peer, 256), holds
// at most per_peer (64) in flight or stuck, of them stuck_per_peer (64)
// waiting or stuck: it cannot take the server-wide admission (256) or wait
// cap (256) from other peers. Its stuck requests refuse only its own (and
// its sessions') Executes with events, with or without a wait_event, and
// take their share of the server's total; four peers at their caps (or one
// principal behind four uids or addresses) fill the server's, which the
// per-peer caps do not prevent.
//
// WaitSession / WaitAll block until nothing is in flight or stuck (for the session /
// anywhere), polling `check` (a stop token) every few milliseconds: its
// error ends the wait. EndSession forgets the session's deferred error; its
// requests still in flight complete normally (they hold what they use).
// A Ticket destroyed without Complete completes with no deferred error
// (the request that held it answered its error itself).
// Thread-safe.
#ifndef TOKENSEL_SERVER_CORE_ASYNC_REQUESTS_H_
#define TOKENSEL_SERVER_CORE_ASYNC_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace tokensel::core {

class ServiceMetrics;

struct AsyncLimits {
  uint32_t per_session = 16;  // async Executes in flight per session
  uint32_t total = 256;       // ... in the whole server
  // The wait caps: Executes with a wait_event outstanding (waiting on it,
  // or abandoned while waiting: stuck), per session (--max_waits_per_session)
  uint32_t stuck_per_session = 8;
  uint32_t stuck_total = 256;    // ... in the whole server (--max_waits)
  uint32_t per_peer = 64;        // in flight, all the sessions of one peer together
  uint32_t stuck_per_peer = 64;  // waiting or stuck, ... of one peer (--max_waits_per_peer)

  // OK when 0 < stuck_per_session <= stuck_per_peer <= stuck_total;
  // INVALID_ARGUMENT naming the flags and their values otherwise (a
  // session's cap above its peer's, or a peer's above the server's, would
  // be a cap that never applies).
  absl::Status CheckWaitCaps() const;
};

class AsyncRequests {
 public:
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();
    // The request's device work is done; `status` is its deferred error
    // (OK when none). Once; later calls do nothing.
    void Complete(const absl::Status& status);
    // The request's wait on the client's event passed: its wait slot is
    // given back (top of this file). Once; without a slot (none taken, or
    // stuck already) or after Complete it does nothing.
    void WaitPassed();
    // The request was abandoned while its stream may still wait on the
    // client's event: from now on it counts as stuck, not in flight, in
    // the wait slot it holds (top of this file). Once; without a wait slot
    // or after Complete it does nothing.
    void Abandon();
    uint64_t number() const { return number_; }

   private:
    friend class AsyncRequests;
    Ticket(AsyncRequests* owner, std::string session, std::string peer, uint64_t number,
           bool waiting)
        : owner_(owner),
          session_(std::move(session)),
          peer_(std::move(peer)),
          number_(number),
          waiting_(waiting) {}
    AsyncRequests* owner_ = nullptr;
    std::string session_;
    std::string peer_;
    uint64_t number_ = 0;
    bool waiting_ = false;  // holds a wait slot, not stuck
    bool stuck_ = false;    // holds a wait slot, stuck
  };

  // `metrics` (may be null): tokensel_event_executes and the refusals.
  explicit AsyncRequests(AsyncLimits limits, ServiceMetrics* metrics = nullptr)
      : limits_(limits), metrics_(metrics) {}
  ~AsyncRequests();  // waits for every ticket (none may outlive this)

  // For `session` of `peer` (Peer::Principal()). `may_stick`: the request
  // has a wait_event (it may be abandoned and left stuck); then it takes a
  // wait slot, under the stuck caps (top of this file).
  absl::StatusOr<Ticket> Admit(const std::string& session, const std::string& peer, bool may_stick);
  absl::Status TakeDeferred(const std::string& session);
  absl::Status WaitSession(const std::string& session, const std::function<absl::Status()>& check);
  bool WaitAll(absl::Duration timeout);
  void EndSession(const std::string& session);

  const AsyncLimits& limits() const { return limits_; }
  uint32_t inflight() const;
  uint32_t inflight(const std::string& session) const;
  // Abandoned requests whose event has not completed yet.
  uint32_t stuck() const;
  uint32_t stuck(const std::string& session) const;
  // Wait slots held by requests whose wait has not passed (not stuck yet).
  uint32_t waiting() const;
  uint32_t waiting(const std::string& session) const;
  uint32_t peer_inflight(const std::string& peer) const;
  uint32_t peer_stuck(const std::string& peer) const;
  uint32_t peer_waiting(const std::string& peer) const;
  uint64_t rejected() const;
  uint64_t dropped_errors() const;

 private:
  struct Session {
    uint32_t inflight = 0;
    uint32_t stuck = 0;
    uint32_t waiting = 0;   // wait slots not stuck (also counted in inflight)
    uint64_t admitted = 0;  // numbers the async Executes
    absl::Status deferred;
    bool ended = false;
  };
  struct Counts {
    uint32_t inflight = 0;
    uint32_t stuck = 0;
    uint32_t waiting = 0;
  };
  void Complete(const std::string& session, const std::string& peer, uint64_t number, bool waiting,
                bool stuck, const absl::Status& status);
  void WaitPassed(const std::string& session, const std::string& peer);
  void Abandon(const std::string& session, const std::string& peer);
  // RESOURCE_EXHAUSTED naming `where` ("in this session", ...), the limit
  // and the counts (in flight and stuck; or waiting and stuck). Requires
  // mu_ (counts the refusal).
  absl::Status Refuse(uint32_t inflight, uint32_t stuck, uint32_t limit, const char* where)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RefuseWait(uint32_t waiting, uint32_t stuck, uint32_t limit, const char* where)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases an ended, idle, error-free session. Requires mu_.
  void MaybeErase(std::map<std::string, Session>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AsyncLimits limits_;
  ServiceMetrics* const metrics_;
  mutable tokensel::Mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Counts> peers_ ABSL_GUARDED_BY(mu_);  // erased at zero
  uint32_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t stuck_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_ASYNC_REQUESTS_H_
