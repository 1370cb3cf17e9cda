// Session: an RAII tokensel session with a background keep-alive.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Open(client));
//   ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::Create(name, bytes));
//   RETURN_IF_ERROR(session->RegisterBuffer(region.RegisterRequest("acts")).status());
//   ASSIGN_OR_RETURN(v1::OpResponse r, session->client().GatherTokens(request));
//   // ~Session: keep-alive stops, CloseSession (the server unregisters all).
//
// Open() calls OpenSession; a thread then calls KeepAlive every
// keep_alive_interval (default: a third of the granted lease) until Close()
// or destruction. Every call made through client() carries the session id.
//
// After a server restart the session is gone: calls fail with NOT_FOUND
// (unknown session) or UNAVAILABLE. Reopen() opens a new session on the same
// client and re-registers every buffer registered through RegisterBuffer()
// (and not unregistered through UnregisterBuffer()), in registration order;
// the shm objects / CUDA allocations must still exist.
//
// Thread-safety: all methods may be called concurrently. client() returns a
// snapshot, so a call racing with Reopen() may still use the old id; id(),
// client() and the registration methods wait while Reopen() runs (it holds
// the session's lock across its RPCs, each bounded by the client deadline).
#ifndef TOKENSEL_CLIENT_SESSION_H_
#define TOKENSEL_CLIENT_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
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
};

class Session {
 public:
  // OpenSession through `client` (its session id, if any, is ignored).
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

  // RegisterBuffer in this session, remembered for Reopen() on success.
  absl::StatusOr<v1::BufferInfo> RegisterBuffer(const v1::RegisterBufferRequest& request);
  // UnregisterBuffer, forgotten for Reopen() (also when the server answers
  // NOT_FOUND).
  absl::Status UnregisterBuffer(absl::string_view name);
  // The registrations Reopen() would replay.
  std::vector<v1::RegisterBufferRequest> registrations() const;

  // Best-effort CloseSession of the old id (short deadline, errors ignored),
  // then OpenSession and the re-registrations. On error the session keeps
  // the new id (if one was opened) and the error names the failing buffer;
  // Reopen() may be called again.
  absl::Status Reopen();

  // Stops the keep-alive and calls CloseSession. Idempotent; later calls
  // through client() fail with NOT_FOUND.
  absl::Status Close();

  // Keep-alive bookkeeping (for monitoring and tests): renewals that
  // succeeded, and the status of the most recent attempt.
  int64_t keep_alive_count() const;
  absl::Status last_keep_alive_status() const;

 private:
  Session(Client client, SessionOptions options);
  absl::Status OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KeepAliveLoop();

  const Client base_;  // no session id
  const SessionOptions options_;

  mutable absl::Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);
  absl::Duration lease_ttl_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisterBufferRequest> registrations_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t keep_alive_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_keep_alive_ ABSL_GUARDED_BY(mu_);
  std::thread keep_alive_;
};

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_SESSION_H_
