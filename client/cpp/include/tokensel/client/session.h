// Session: an RAII tokensel session with a background keep-alive that
// re-opens the session by itself after a server restart.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Open(client));
//   ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::Create(name, bytes));
//   RETURN_IF_ERROR(session->RegisterBuffer(region.RegisterRequest("acts")).status());
//   absl::StatusOr<v1::OpResponse> r = session->client().GatherTokens(request);
//   if (absl::IsNotFound(r.status()) || absl::IsUnavailable(r.status())) {
//     RETURN_IF_ERROR(session->WaitUntilOpen(absl::Seconds(30)));  // then retry
//   }
//   // ~Session: keep-alive stops, CloseSession (the server unregisters all).
//
// Open() calls OpenSession; a thread then calls KeepAlive every
// keep_alive_interval (default: a third of the granted lease) until Close()
// or destruction. Every call made through client() carries the session id.
//
// Recovery. A server restart (or a lease that ran out) loses the session:
// calls fail with NOT_FOUND (unknown session), or UNAVAILABLE /
// DEADLINE_EXCEEDED while no server answers. With auto_reopen (the default;
// needs keep_alive) the keep-alive thread recovers by itself:
//  - while the server is unreachable its renewals fail (with wait_for_ready
//    each KeepAlive waits for the channel, bounded by min(client deadline,
//    interval)) and it retries every min(interval, kRetryInterval);
//  - as soon as a server answers the renewal with NOT_FOUND, the thread
//    re-opens at once: OpenSession, then every buffer registered through
//    RegisterBuffer() (and not unregistered through UnregisterBuffer()) is
//    re-registered in registration order; the shm objects / CUDA allocations
//    must still exist. The new id is published (id(), client()) only after
//    the re-registrations, so a call through client() sees either the old id
//    (NOT_FOUND) or the new one with its buffers. If OpenSession fails the
//    thread retries after the next renewal that answers NOT_FOUND (so a
//    re-open never waits for an unreachable server); if a re-registration
//    fails the new session is kept
//    without that buffer (and those after it), the error is kept in
//    last_reopen_status(), and no retry follows until the session is lost
//    again (a Reopen() call retries).
// Reopen() does the same on demand (it first closes the old id, best
// effort). reopen_count() counts the re-opens that opened a new session.
// Streams (client().OpenStream()) are bound to the id they were opened with
// and are not re-opened.
//
// Thread-safety: all methods may be called concurrently. id(), lease_ttl(),
// client() and the counters never wait for an RPC; client() returns a
// snapshot. Reopen() (manual or automatic), RegisterBuffer() and
// UnregisterBuffer() are serialized with one another and hold that lock
// across their RPCs (each bounded by the client deadline), so no
// registration is lost by a concurrent re-open. Close() stops the
// keep-alive thread first and so may wait for a re-open in progress.
#ifndef TOKENSEL_CLIENT_SESSION_H_
#define TOKENSEL_CLIENT_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tokensel/client/client.h"

namespace tokensel::client {

struct SessionOptions {
  std::string client_name = "tokensel-cpp";  // the server logs it
  // Requested lease; ZeroDuration = the server default (--session_ttl).
  absl::Duration lease_ttl = absl::ZeroDuration();
  bool keep_alive = true;
  // ZeroDuration = a third of the lease the server granted.
  absl::Duration keep_alive_interval = absl::ZeroDuration();
  // With keep_alive: re-open and re-register automatically when a renewal
  // finds the session gone (see the header comment).
  bool auto_reopen = true;
};

class Session {
 public:
  // After a failed renewal or re-open (with auto_reopen) the next attempt
  // comes after min(keep-alive interval, kRetryInterval).
  static constexpr absl::Duration kRetryInterval = absl::Milliseconds(250);

  // OpenSession through `client` (its session id, if any, is ignored).
  // INVALID_ARGUMENT for negative durations; OpenSession's errors.
  static absl::StatusOr<std::unique_ptr<Session>> Open(const Client& client,
                                                       SessionOptions options = {});
  // Close(), ignoring its status.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  std::string id() const;
  absl::Duration lease_ttl() const;
  // A client bound to the current session id.
  Client client() const;

  // RegisterBuffer in this session, remembered for re-opening on success.
  absl::StatusOr<v1::BufferInfo> RegisterBuffer(const v1::RegisterBufferRequest& request);
  // UnregisterBuffer, forgotten for re-opening (also when the server answers
  // NOT_FOUND).
  absl::Status UnregisterBuffer(absl::string_view name);
  // The registrations a re-open would replay.
  std::vector<v1::RegisterBufferRequest> registrations() const;

  // Best-effort CloseSession of the old id (short deadline, errors ignored),
  // then OpenSession and the re-registrations. On a re-registration error
  // the session keeps the new id and the error names the failing buffer; on
  // an OpenSession error the old id stays (and, with auto_reopen, the
  // keep-alive thread keeps trying). Reopen() may be called again.
  // FAILED_PRECONDITION after Close().
  absl::Status Reopen();

  // Waits until an attempt that begins after this call finds the session
  // open: a keep-alive renewal that succeeds (OK) or a re-open, automatic or
  // Reopen(), that opens a new session (OK, or its re-registration error).
  // The next renewal comes within one keep-alive interval (sooner after a
  // failure, see kRetryInterval). DEADLINE_EXCEEDED (naming the last renewal
  // and re-open statuses) if none does within `timeout`; FAILED_PRECONDITION
  // without keep_alive or once closed.
  absl::Status WaitUntilOpen(absl::Duration timeout) const;

  // Stops the keep-alive (waiting for a re-open in progress) and calls
  // CloseSession (NOT_FOUND is ignored when the session is known to be
  // lost). Idempotent; later calls through client() fail with NOT_FOUND.
  absl::Status Close();

  // Bookkeeping (for monitoring and tests): renewals that succeeded, the
  // status of the most recent renewal, re-opens that opened a new session
  // (automatic or Reopen()), and the status of the most recent re-open
  // attempt (OK before the first).
  int64_t keep_alive_count() const;
  absl::Status last_keep_alive_status() const;
  int64_t reopen_count() const;
  absl::Status last_reopen_status() const;

 private:
  // Everything mutable, with its locks and the keep-alive thread, lives in
  // session.cc: the locks are tokensel::Mutex (pthread-based, so
  // ThreadSanitizer sees them, unlike Debian's absl::Mutex) and that type is
  // not part of the installed headers.
  class State;
  explicit Session(std::unique_ptr<State> state);

  std::unique_ptr<State> state_;
};

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_SESSION_H_
