#include "server/core/session_manager.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {
namespace {

// 128 random bits as 32 lower-case hex characters.
std::string NewSessionId() {
  thread_local absl::BitGen gen;
  const uint64_t hi = absl::Uniform<uint64_t>(gen);
  const uint64_t lo = absl::Uniform<uint64_t>(gen);
  return absl::StrFormat("%016x%016x", hi, lo);
}

}  // namespace

SessionManager::SessionManager(absl::Duration default_ttl, absl::Duration max_ttl,
                               uint32_t max_sessions, EndCallback on_end, ServiceMetrics* metrics,
                               Clock clock)
    : default_ttl_(std::min(default_ttl, max_ttl)),
      max_ttl_(max_ttl),
      max_sessions_(max_sessions),
      on_end_(std::move(on_end)),
      metrics_(metrics),
      clock_(clock ? std::move(clock) : Clock([] { return absl::Now(); })) {}

absl::StatusOr<SessionInfo> SessionManager::Open(const std::string& client_name,
                                                 absl::Duration requested_ttl) {
  if (requested_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl_ms: must not be negative");
  }
  const absl::Duration ttl =
      requested_ttl == absl::ZeroDuration() ? default_ttl_ : std::min(requested_ttl, max_ttl_);
  std::vector<std::string> expired;
  SessionInfo info;
  absl::Status status;
  {
    tokensel::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    if (sessions_.size() >= max_sessions_) {
      // Make room from sessions whose lease has run out before refusing.
      for (auto it = sessions_.begin(); it != sessions_.end();) {
        if (it->second.deadline <= now) {
          expired.push_back(it->first);
          it = sessions_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (sessions_.size() >= max_sessions_) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "session: ", sessions_.size(), " sessions are open, the limit is ", max_sessions_));
    } else {
      std::string id = NewSessionId();
      while (sessions_.count(id) != 0) id = NewSessionId();  // 2^-128; for form's sake
      sessions_.emplace(id, Entry{client_name, ttl, now + ttl});
      info = SessionInfo{id, client_name, ttl};
    }
    UpdateGaugeLocked();
  }
  for (const std::string& id : expired) End(id);
  if (!status.ok()) return status;
  TS_LOG(DEBUG) << "session opened for client '" << client_name << "', ttl " << ttl;
  return info;
}

absl::StatusOr<absl::Duration> SessionManager::Touch(const std::string& session_id) {
  absl::Duration ttl;
  {
    tokensel::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError("session: unknown session (closed, expired or never opened)");
    }
    const absl::Time now = clock_();
    if (it->second.deadline > now) {
      it->second.deadline = now + it->second.ttl;
      return it->second.ttl;
    }
    ttl = it->second.ttl;
    sessions_.erase(it);
    UpdateGaugeLocked();
  }
  End(session_id);
  return absl::NotFoundError(absl::StrCat("session: expired (its lease of ",
                                          absl::FormatDuration(ttl),
                                          " ran out); open a new session"));
}

absl::Status SessionManager::Close(const std::string& session_id) {
  {
    tokensel::MutexLock lock(&mu_);
    if (sessions_.erase(session_id) == 0) {
      return absl::NotFoundError("session: unknown session (closed, expired or never opened)");
    }
    UpdateGaugeLocked();
  }
  End(session_id);
  return absl::OkStatus();
}

int SessionManager::ReapExpired() {
  std::vector<std::string> expired;
  {
    tokensel::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second.deadline <= now) {
        expired.push_back(it->first);
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
    if (!expired.empty()) UpdateGaugeLocked();
  }
  for (const std::string& id : expired) End(id);
  if (!expired.empty()) {
    TS_LOG(INFO) << "reaped " << expired.size() << " expired sessions";
  }
  return static_cast<int>(expired.size());
}

void SessionManager::CloseAll() {
  std::vector<std::string> ids;
  {
    tokensel::MutexLock lock(&mu_);
    for (const auto& [id, entry] : sessions_) ids.push_back(id);
    sessions_.clear();
    UpdateGaugeLocked();
  }
  for (const std::string& id : ids) End(id);
}

size_t SessionManager::count() const {
  tokensel::MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionManager::End(const std::string& id) {
  if (on_end_) on_end_(id);
}

void SessionManager::UpdateGaugeLocked() {
  if (metrics_ != nullptr) metrics_->SetSessions(static_cast<double>(sessions_.size()));
}

}  // namespace tokensel::core
