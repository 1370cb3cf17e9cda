#include "server/core/session_manager.h"

#include <algorithm>
#include <exception>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "server/core/secure_random.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {

SessionManager::SessionManager(SessionLimits limits, EndCallback on_end, ServiceMetrics* metrics,
                               Clock clock)
    : limits_([&] {
        limits.default_ttl = std::min(limits.default_ttl, limits.max_ttl);
        return limits;
      }()),
      on_end_(std::move(on_end)),
      metrics_(metrics),
      clock_(clock ? std::move(clock) : Clock([] { return absl::Now(); })) {}

void SessionManager::set_on_begin(EndCallback on_begin) {
  tokensel::MutexLock lock(&mu_);
  on_begin_ = std::move(on_begin);
}

void SessionManager::EraseLocked(std::map<std::string, Entry>::iterator it) {
  auto owner = per_owner_.find(it->second.owner);
  if (owner != per_owner_.end() && --owner->second == 0) per_owner_.erase(owner);
  sessions_.erase(it);
}

void SessionManager::EraseExpiredLocked(absl::Time now, std::vector<std::string>* expired) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (it->second.pins == 0 && it->second.deadline <= now) {
      expired->push_back(it->first);
      EraseLocked(it);
    }
    it = next;
  }
}

absl::Status SessionManager::CheckRoomLocked(const std::string& owner, absl::Time now,
                                             std::vector<std::string>* expired) {
  // Both counts include the Opens between their reservation and their
  // insertion (opening_), so an Open that passed here is never refused
  // after its begin.
  auto owned = [&] {
    auto it = per_owner_.find(owner);
    return it == per_owner_.end() ? uint32_t{0} : it->second;
  };
  const auto total = [&] { return sessions_.size() + opening_.size(); };
  // Make room from sessions whose lease has run out before refusing.
  if (total() >= limits_.max_sessions || owned() >= limits_.max_sessions_per_peer) {
    EraseExpiredLocked(now, expired);
  }
  if (owned() >= limits_.max_sessions_per_peer) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session: ", owner, " already has ", owned(),
                     " open sessions, the limit per peer (max_sessions_per_peer) is ",
                     limits_.max_sessions_per_peer, "; close some or let their leases expire"));
  }
  if (total() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session: ", total(), " sessions are open, the limit is ", limits_.max_sessions));
  }
  return absl::OkStatus();
}

void SessionManager::UnreserveLocked(const std::string& id, const std::string& owner) {
  opening_.erase(id);
  auto it = per_owner_.find(owner);
  if (it != per_owner_.end() && --it->second == 0) per_owner_.erase(it);
}

absl::StatusOr<SessionInfo> SessionManager::Open(const std::string& client_name,
                                                 absl::Duration requested_ttl, const Peer& peer) {
  // OpenSession's handler does not catch: gRPC would answer an exception
  // escaping its callback with UNIMPLEMENTED, which misleads the client.
  // What OpenOrThrow took is given back before its exception gets here.
  try {
    return OpenOrThrow(client_name, requested_ttl, peer);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("session: out of memory opening a session; retry later");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("session: opening a session failed: ", e.what()));
  } catch (...) {
    return absl::InternalError("session: opening a session failed (an unknown exception)");
  }
}

absl::StatusOr<SessionInfo> SessionManager::OpenOrThrow(const std::string& client_name,
                                                        absl::Duration requested_ttl,
                                                        const Peer& peer) {
  if (requested_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl_ms: must not be negative");
  }
  const absl::Duration ttl = requested_ttl == absl::ZeroDuration()
                                 ? limits_.default_ttl
                                 : std::min(requested_ttl, limits_.max_ttl);
  const std::string owner = peer.Principal();
  std::vector<std::string> expired;
  std::string id;
  EndCallback begin;
  absl::Status status;
  // 1. Under the lock: the room is checked and reserved (counted for the
  // owner and in all, as an open session is), and a fresh id drawn. A
  // refusal begins nothing. The sessions CheckRoomLocked reaped to make
  // room are out of the table: they end here on every path, also when a
  // later step of this one throws (std::bad_alloc drawing the id, copying
  // the begin, counting the owner: the second read of the seventh review,
  // NIT 5; their registrations, tickets and events were held until exit).
  try {
    tokensel::MutexLock lock(&mu_);
    status = CheckRoomLocked(owner, clock_(), &expired);
    if (status.ok()) {
      id = SecureRandomHex128();
      // 2^-128; for form's sake.
      while (sessions_.count(id) != 0 || opening_.count(id) != 0) id = SecureRandomHex128();
      begin = on_begin_;
      opening_.insert(id);
      try {
        ++per_owner_[owner];
      } catch (...) {
        opening_.erase(id);
        throw;
      }
    }
    UpdateGaugeLocked();
  } catch (...) {
    EndAll(expired);  // outside the lock (the lock guard is gone)
    throw;
  }
  EndAll(expired);
  if (!status.ok()) return status;
  // 2. The begin, outside the lock (the seventh review: it ran under it, and
  // the backend's BeginSession takes every device's event cache lock, so a
  // driver call under one of those stalled every Open and, behind it, every
  // request's Touch; and a throw there, after the insertion, left a session
  // whose id nobody learnt holding a slot until its lease ran out). No
  // request can name the id yet: nobody knows it. If it throws, the
  // reservation goes back, the id ends (the begin may have got part way:
  // some devices' caches begun, not others; an end of what was not begun
  // does nothing) and the exception goes to Open (a status): nothing is
  // left taken.
  try {
    if (begin) begin(id);
  } catch (...) {
    {
      tokensel::MutexLock lock(&mu_);
      UnreserveLocked(id, owner);
    }
    End(id);
    throw;
  }
  // 3. The reservation becomes the session (no refusal is possible here:
  // the room was reserved). Only an allocation failure can stop it: then
  // the begun id ends at once (its end follows its begin, as always). The
  // answer is built first: nothing after the insertion may throw (a
  // session whose id the client never learns would hold a slot).
  SessionInfo info;
  try {
    info = SessionInfo{id, client_name, ttl, owner};
    tokensel::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    sessions_.emplace(id, Entry{client_name, owner, ttl, now + ttl, 0});
    opening_.erase(id);
    UpdateGaugeLocked();
  } catch (...) {
    {
      tokensel::MutexLock lock(&mu_);
      UnreserveLocked(id, owner);
    }
    End(id);
    throw;
  }
  TS_LOG(DEBUG) << "session opened by " << owner << " for client '" << client_name << "', ttl "
                << ttl;
  return info;
}

absl::StatusOr<absl::Duration> SessionManager::Touch(const std::string& session_id,
                                                     const Peer& caller) {
  absl::Duration ttl;
  {
    tokensel::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError("session: unknown session (closed, expired or never opened)");
    }
    if (it->second.owner != caller.Principal()) {
      // Logged with both principals; the caller learns only that it is not
      // the owner.
      TS_LOG(WARNING) << "session of " << it->second.owner << " presented by " << caller.Principal()
                      << ": refused";
      return absl::PermissionDeniedError(
          "session: belongs to another peer (a session is usable only by the uid or address "
          "that opened it)");
    }
    const absl::Time now = clock_();
    if (it->second.pins > 0 || it->second.deadline > now) {
      it->second.deadline = now + it->second.ttl;
      return it->second.ttl;
    }
    ttl = it->second.ttl;
    EraseLocked(it);
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
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError("session: unknown session (closed, expired or never opened)");
    }
    EraseLocked(it);
    UpdateGaugeLocked();
  }
  End(session_id);
  return absl::OkStatus();
}

absl::Status SessionManager::Pin(const std::string& session_id) {
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || (it->second.pins == 0 && it->second.deadline <= clock_())) {
    return absl::NotFoundError("session: unknown or expired");
  }
  ++it->second.pins;
  return absl::OkStatus();
}

void SessionManager::Unpin(const std::string& session_id) {
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.pins == 0) return;
  if (--it->second.pins == 0) it->second.deadline = clock_() + it->second.ttl;
}

int SessionManager::ReapExpired() {
  std::vector<std::string> expired;
  {
    tokensel::MutexLock lock(&mu_);
    EraseExpiredLocked(clock_(), &expired);
    if (!expired.empty()) UpdateGaugeLocked();
  }
  EndAll(expired);
  if (!expired.empty()) {
    TS_LOG(INFO) << "reaped " << expired.size() << " expired sessions";
  }
  return static_cast<int>(expired.size());
}

void SessionManager::CloseAll() {
  std::vector<std::string> ids;
  {
    tokensel::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      ids.push_back(it->first);
      EraseLocked(it++);  // keeps the counts of Opens still reserving
    }
    UpdateGaugeLocked();
  }
  EndAll(ids);
}

size_t SessionManager::count() const {
  tokensel::MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionManager::End(const std::string& id) {
  if (on_end_) on_end_(id);
}

void SessionManager::EndAll(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) End(id);
}

void SessionManager::UpdateGaugeLocked() {
  if (metrics_ != nullptr) metrics_->SetSessions(static_cast<double>(sessions_.size()));
}

}  // namespace tokensel::core
