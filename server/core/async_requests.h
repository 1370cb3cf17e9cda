// AsyncRequests: the Executes the server answered before their device work
// completed (a record_event and no inline output: RequestChain's async
// mode), per session: how many are in flight (bounded), and the first error
// their device work reported after the reply (the deferred error). Sync
// Executes that wait on a client event are admitted too (their stream may
// be left waiting on it: RequestChain::AwaitWait), never with an error.
//
//   ASSIGN_OR_RETURN(AsyncRequests::Ticket t, async.Admit(session));
//   ... chain->Commit([t = std::move(t)](absl::Status s) mutable { t.Complete(s); });
//
// Caps: Admit answers RESOURCE_EXHAUSTED (counted in rejected()) when the
// session already has `per_session` in flight or the server `total`; nothing
// of the request runs. Each in-flight request holds a stream, its staging,
// its workspaces and its memory reservation until the completion thread is
// done with it, so the caps bound what clients that never wait can pin.
//
// Deferred errors: Complete(error) keeps the first one per session until
// TakeDeferred returns it (and forgets it): with the op's own code, its
// message prefixed "deferred from async Execute #N of this session: ops[k]
// (Name): ...", N counting the session's async Executes from 1 (the number
// is the ticket's). Later errors while one is kept are dropped (counted in
// dropped_errors()): the first one names the request the client must redo.
//
// Abandoned requests (Ticket::Abandon): a sync Execute whose host wait on
// the client's wait_event ended (its deadline, the server's maximum wait)
// leaves its stream waiting on that event until the event completes, which
// a client may never let happen. Such a request stops counting against the
// admission caps above (per_session, total: those are for requests that
// will complete) and counts as *stuck* instead, under caps of its own:
// stuck_per_session (4) and stuck_total (64). Admit of a request that may
// be left stuck (it has a wait_event: `may_stick`) is RESOURCE_EXHAUSTED
// when its session already has stuck_per_session stuck requests, or the
// server stuck_total. So one session's events that never complete can pin
// at most stuck_per_session streams and cannot take the server-wide
// admission (or the stuck cap: stuck_per_session < stuck_total) from other
// sessions; requests without a wait_event are never refused for stuck ones.
// A stuck request completes (its ticket) when its event finally completes.
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
  uint32_t per_session = 16;       // async Executes in flight per session
  uint32_t total = 256;            // ... in the whole server
  uint32_t stuck_per_session = 4;  // abandoned on a client's wait_event, per session
  uint32_t stuck_total = 64;       // ... in the whole server
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
    // The request was abandoned while its stream may still wait on the
    // client's event: from now on it counts as stuck, not in flight (top
    // of this file). Once; after Complete it does nothing.
    void Abandon();
    uint64_t number() const { return number_; }

   private:
    friend class AsyncRequests;
    Ticket(AsyncRequests* owner, std::string session, uint64_t number)
        : owner_(owner), session_(std::move(session)), number_(number) {}
    AsyncRequests* owner_ = nullptr;
    std::string session_;
    uint64_t number_ = 0;
    bool stuck_ = false;
  };

  // `metrics` (may be null): tokensel_event_executes and the refusals.
  explicit AsyncRequests(AsyncLimits limits, ServiceMetrics* metrics = nullptr)
      : limits_(limits), metrics_(metrics) {}
  ~AsyncRequests();  // waits for every ticket (none may outlive this)

  // `may_stick`: the request has a wait_event (it may be abandoned and
  // left stuck); then the stuck caps apply too.
  absl::StatusOr<Ticket> Admit(const std::string& session, bool may_stick = false);
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
  uint64_t rejected() const;
  uint64_t dropped_errors() const;

 private:
  struct Session {
    uint32_t inflight = 0;
    uint32_t stuck = 0;
    uint64_t admitted = 0;  // numbers the async Executes
    absl::Status deferred;
    bool ended = false;
  };
  void Complete(const std::string& session, uint64_t number, bool stuck,
                const absl::Status& status);
  void Abandon(const std::string& session);
  // Erases an ended, idle, error-free session. Requires mu_.
  void MaybeErase(std::map<std::string, Session>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AsyncLimits limits_;
  ServiceMetrics* const metrics_;
  mutable tokensel::Mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  uint32_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t stuck_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_ASYNC_REQUESTS_H_
