// Sessions: leased client identities that own buffers.
//
// A session is created by Open() with a lease TTL and renewed by Touch()
// (every RPC that names it) or KeepAlive. When the lease expires, or on
// Close(), the session ends and `on_end(session_id)` runs (the server wires
// it to BufferRegistry::UnregisterAll). Expiry is detected by ReapExpired(),
// which the server calls periodically from its reaper thread, and lazily by
// Touch(). A pinned session (Pin: an open Stream uses it) does not expire;
// its lease restarts when the last pin goes.
//
// Ownership and quotas. A session belongs to the principal of the peer that
// opened it (peer.h: the unix uid, or the TCP address). Touch() by another
// principal is PERMISSION_DENIED: the session id is a bearer capability, but
// only for its owner. One principal may hold at most max_sessions_per_peer
// sessions, so no caller can lock others out of the max_sessions slots.
// Ids are 128 random bits from the kernel's CSPRNG, as 32 hex characters.
//
// Begin: set_on_begin(f) makes Open run f(session_id) for each session it
// opens, before the id is returned (so before any request can name it) and
// before the session is in the table (so before anything can end it): a
// session's on_end always follows its on_begin (the server wires both to
// the backend, whose IpcEventCache caches only for live sessions). f runs
// outside the internal lock (the seventh review: under it, a slow f, or
// one waiting for a lock held across a driver call, stalled every Open and
// Touch); Open reserves the session's room first, so a refused Open begins
// nothing and an Open whose f ran is not refused after it. If f throws,
// on_end runs for the id (f may have begun part of it) and Open fails
// (below): no slot, no session is left. f runs without the lock.
//
// Thread-safe. `on_end` runs outside the internal lock.
#ifndef TOKENSEL_SERVER_CORE_SESSION_MANAGER_H_
#define TOKENSEL_SERVER_CORE_SESSION_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "server/core/peer.h"

namespace tokensel::core {

class ServiceMetrics;

struct SessionInfo {
  std::string id;
  std::string client_name;
  absl::Duration ttl;
  std::string owner;  // Peer::Principal() of the opener
};

struct SessionLimits {
  absl::Duration default_ttl = absl::Seconds(60);  // when Open asks for 0
  absl::Duration max_ttl = absl::Hours(1);         // longer requests are capped
  uint32_t max_sessions = 1024;                    // concurrent sessions in all
  uint32_t max_sessions_per_peer = 256;            // ... of one principal
};

class SessionManager {
 public:
  using Clock = std::function<absl::Time()>;
  using EndCallback = std::function<void(const std::string& session_id)>;

  SessionManager(SessionLimits limits, EndCallback on_end, ServiceMetrics* metrics,
                 Clock clock = nullptr);
  // The begin callback (top of this file); set before serving.
  void set_on_begin(EndCallback on_begin);

  // INVALID_ARGUMENT for a negative ttl; RESOURCE_EXHAUSTED beyond
  // max_sessions or the peer's max_sessions_per_peer (expired sessions are
  // reaped first to make room). Never throws: std::bad_alloc (of the begin
  // callback too) is RESOURCE_EXHAUSTED, any other exception INTERNAL, with
  // no session left (OpenSession's handler answers what Open returns); the
  // expired sessions it reaped end all the same, whatever it returns.
  absl::StatusOr<SessionInfo> Open(const std::string& client_name, absl::Duration requested_ttl,
                                   const Peer& peer = Peer());
  // Renews the lease and returns it. NOT_FOUND (unknown or expired);
  // PERMISSION_DENIED when `caller` is not the owner's principal.
  absl::StatusOr<absl::Duration> Touch(const std::string& session_id, const Peer& caller = Peer());
  // NOT_FOUND if unknown.
  absl::Status Close(const std::string& session_id);
  // Keeps the session from expiring until the matching Unpin (counted);
  // NOT_FOUND if unknown or expired. Unpin of the last pin restarts the lease.
  absl::Status Pin(const std::string& session_id);
  void Unpin(const std::string& session_id);
  // Ends every session whose lease has run out; returns how many.
  int ReapExpired();
  // Ends every session (shutdown).
  void CloseAll();
  size_t count() const;

 private:
  struct Entry {
    std::string client_name;
    std::string owner;
    absl::Duration ttl;
    absl::Time deadline;
    uint32_t pins = 0;
  };
  void End(const std::string& id);
  void EndAll(const std::vector<std::string>& ids);  // End of each, in order
  // Open, which may throw (Open turns that into a status).
  absl::StatusOr<SessionInfo> OpenOrThrow(const std::string& client_name,
                                          absl::Duration requested_ttl, const Peer& peer);
  // Removes every expired, unpinned session; their ids go to `expired`.
  void EraseExpiredLocked(absl::Time now, std::vector<std::string>* expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases `it`, keeping the per-owner counts.
  void EraseLocked(std::map<std::string, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when `owner` may open one more session (expired ones are erased into
  // `expired` first if needed); RESOURCE_EXHAUSTED naming the limit.
  absl::Status CheckRoomLocked(const std::string& owner, absl::Time now,
                               std::vector<std::string>* expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back an Open's reservation (its id in opening_, its owner's count).
  void UnreserveLocked(const std::string& id, const std::string& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SessionLimits limits_;
  const EndCallback on_end_;
  ServiceMetrics* const metrics_;
  const Clock clock_;
  mutable tokensel::Mutex mu_;
  std::map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  // Open sessions and reserved ones (opening_) of each owner.
  std::map<std::string, uint32_t> per_owner_ ABSL_GUARDED_BY(mu_);
  // Ids of Opens between their reservation and their insertion (their
  // on_begin runs meanwhile): counted against the caps like open ones.
  std::set<std::string> opening_ ABSL_GUARDED_BY(mu_);
  EndCallback on_begin_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_SESSION_MANAGER_H_
