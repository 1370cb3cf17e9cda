// Sessions: leased client identities that own buffers.
//
// A session is created by Open() with a lease TTL and renewed by Touch()
// (every RPC that names it) or KeepAlive. When the lease expires, or on
// Close(), the session ends and `on_end(session_id)` runs (the server wires
// it to BufferRegistry::UnregisterAll). Expiry is detected by ReapExpired(),
// which the server calls periodically from its reaper thread, and lazily by
// Touch(). Ids are 128-bit random hex strings.
//
// Thread-safe. `on_end` runs outside the internal lock.
#ifndef TOKENSEL_SERVER_CORE_SESSION_MANAGER_H_
#define TOKENSEL_SERVER_CORE_SESSION_MANAGER_H_

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

struct SessionInfo {
  std::string id;
  std::string client_name;
  absl::Duration ttl;
};

class SessionManager {
 public:
  using Clock = std::function<absl::Time()>;
  using EndCallback = std::function<void(const std::string& session_id)>;

  // `default_ttl` when Open asks for 0; requests above `max_ttl` are capped.
  // `max_sessions` bounds concurrent sessions (RESOURCE_EXHAUSTED beyond).
  SessionManager(absl::Duration default_ttl, absl::Duration max_ttl, uint32_t max_sessions,
                 EndCallback on_end, ServiceMetrics* metrics, Clock clock = nullptr);

  absl::StatusOr<SessionInfo> Open(const std::string& client_name, absl::Duration requested_ttl);
  // Renews the lease. NOT_FOUND (unknown or expired) otherwise.
  absl::StatusOr<absl::Duration> Touch(const std::string& session_id);
  // NOT_FOUND if unknown.
  absl::Status Close(const std::string& session_id);
  // Ends every session whose lease has run out; returns how many.
  int ReapExpired();
  // Ends every session (shutdown).
  void CloseAll();
  size_t count() const;

 private:
  struct Entry {
    std::string client_name;
    absl::Duration ttl;
    absl::Time deadline;
  };
  void End(const std::string& id);
  void UpdateGaugeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration default_ttl_;
  const absl::Duration max_ttl_;
  const uint32_t max_sessions_;
  const EndCallback on_end_;
  ServiceMetrics* const metrics_;
  const Clock clock_;
  mutable tokensel::Mutex mu_;
  std::map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_SESSION_MANAGER_H_
