#include "tokensel/client/session.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tokensel::client {
namespace {

// Deadline of the best-effort CloseSession of a stale id in Reopen().
constexpr absl::Duration kStaleCloseDeadline = absl::Seconds(1);
// The shortest keep-alive interval.
constexpr absl::Duration kMinInterval = absl::Milliseconds(10);

}  // namespace

Session::Session(Client client, SessionOptions options)
    : base_(client.WithSession("")), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(const Client& client,
                                                       SessionOptions options) {
  if (options.lease_ttl < absl::ZeroDuration() ||
      options.keep_alive_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl and keep_alive_interval must be >= 0");
  }
  std::unique_ptr<Session> session(new Session(client, std::move(options)));
  absl::StatusOr<v1::OpenSessionResponse> opened = session->OpenNew();
  {
    absl::MutexLock lock(&session->mu_);
    if (!opened.ok()) {
      session->closed_ = true;  // nothing to close
      return opened.status();
    }
    session->id_ = opened->session_id();
    session->lease_ttl_ = absl::Milliseconds(opened->lease_ttl_ms());
  }
  if (session->options_.keep_alive) {
    session->keep_alive_ = std::thread([s = session.get()] { s->KeepAliveLoop(); });
  }
  return session;
}

Session::~Session() { Close().IgnoreError(); }

absl::StatusOr<v1::OpenSessionResponse> Session::OpenNew() const {
  v1::OpenSessionRequest request;
  request.set_client_name(options_.client_name);
  request.set_lease_ttl_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(options_.lease_ttl)));
  return base_.OpenSession(request);
}

std::string Session::id() const {
  absl::MutexLock lock(&mu_);
  return id_;
}

absl::Duration Session::lease_ttl() const {
  absl::MutexLock lock(&mu_);
  return lease_ttl_;
}

Client Session::client() const {
  absl::MutexLock lock(&mu_);
  return base_.WithSession(id_);
}

absl::StatusOr<v1::BufferInfo> Session::RegisterBuffer(const v1::RegisterBufferRequest& request) {
  absl::MutexLock reopen_lock(&reopen_mu_);
  absl::StatusOr<v1::BufferInfo> info = client().RegisterBuffer(request);
  if (info.ok()) {
    absl::MutexLock lock(&mu_);
    registrations_.push_back(request);
  }
  return info;
}

absl::Status Session::UnregisterBuffer(absl::string_view name) {
  absl::MutexLock reopen_lock(&reopen_mu_);
  absl::Status status = client().UnregisterBuffer(name);
  if (status.ok() || absl::IsNotFound(status)) {
    absl::MutexLock lock(&mu_);
    registrations_.erase(
        std::remove_if(registrations_.begin(), registrations_.end(),
                       [&](const v1::RegisterBufferRequest& r) { return r.name() == name; }),
        registrations_.end());
  }
  return status;
}

std::vector<v1::RegisterBufferRequest> Session::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

absl::Status Session::Reopen() {
  absl::MutexLock reopen_lock(&reopen_mu_);
  uint64_t attempt = 0;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::FailedPreconditionError("Reopen: the session is closed");
    attempt = ++attempts_;
  }
  return ReopenLocked(attempt, /*close_old=*/true, /*only_if_lost=*/false);
}

absl::Status Session::ReopenLocked(uint64_t attempt, bool close_old, bool only_if_lost) {
  std::string old_id;
  std::vector<v1::RegisterBufferRequest> registrations;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::FailedPreconditionError("Reopen: the session is closed");
    if (only_if_lost && !lost_) return absl::OkStatus();  // re-opened meanwhile
    old_id = id_;
    registrations = registrations_;  // stable: changes need reopen_mu_
  }
  if (close_old && !old_id.empty()) {
    // The old session may still live (e.g. a transient network error).
    base_.WithSession(old_id).WithDeadline(kStaleCloseDeadline).CloseSession().IgnoreError();
  }
  absl::StatusOr<v1::OpenSessionResponse> opened = OpenNew();
  if (!opened.ok()) {
    const absl::Status status(opened.status().code(),
                              absl::StrCat("Reopen: OpenSession: ", opened.status().message()));
    absl::MutexLock lock(&mu_);
    if (close_old) lost_ = true;  // the old id was closed (or is gone)
    last_reopen_ = status;
    return status;
  }
  const Client bound = base_.WithSession(opened->session_id());
  absl::Status status;
  for (const v1::RegisterBufferRequest& request : registrations) {
    absl::StatusOr<v1::BufferInfo> info = bound.RegisterBuffer(request);
    if (!info.ok()) {
      status = absl::Status(info.status().code(),
                            absl::StrCat("Reopen: re-registering buffer \"", request.name(),
                                         "\": ", info.status().message()));
      break;
    }
  }
  absl::MutexLock lock(&mu_);
  id_ = opened->session_id();
  lease_ttl_ = absl::Milliseconds(opened->lease_ttl_ms());
  lost_ = false;
  ++reopen_count_;
  last_reopen_ = status;
  RecordOpenLocked(attempt, status);
  return status;
}

void Session::RecordOpenLocked(uint64_t attempt, const absl::Status& status) {
  if (attempt < open_attempt_) return;  // a later attempt already reported
  open_attempt_ = attempt;
  open_status_ = status;
}

absl::Status Session::WaitUntilOpen(absl::Duration timeout) const {
  if (!options_.keep_alive) {
    return absl::FailedPreconditionError(
        "WaitUntilOpen: needs the keep-alive thread (SessionOptions::keep_alive)");
  }
  absl::MutexLock lock(&mu_);
  const uint64_t after = attempts_;
  auto done = [this, after]()
                  ABSL_NO_THREAD_SAFETY_ANALYSIS { return closed_ || open_attempt_ > after; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "WaitUntilOpen: the session was not confirmed open within ", absl::FormatDuration(timeout),
        "; last keep-alive: ", last_keep_alive_.ToString(),
        "; last re-open: ", last_reopen_.ToString()));
  }
  if (closed_) return absl::FailedPreconditionError("WaitUntilOpen: the session is closed");
  return open_status_;
}

absl::Status Session::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;  // wakes the keep-alive loop (it waits on this condition)
  }
  if (keep_alive_.joinable()) keep_alive_.join();
  std::string id;
  bool lost = false;
  {
    // A Reopen() in progress publishes its new id before releasing this.
    absl::MutexLock reopen_lock(&reopen_mu_);
    absl::MutexLock lock(&mu_);
    id = id_;
    lost = lost_;
  }
  if (id.empty()) return absl::OkStatus();
  absl::Status status = base_.WithSession(id).CloseSession();
  if (lost && absl::IsNotFound(status)) return absl::OkStatus();
  return status;
}

int64_t Session::keep_alive_count() const {
  absl::MutexLock lock(&mu_);
  return keep_alive_count_;
}

absl::Status Session::last_keep_alive_status() const {
  absl::MutexLock lock(&mu_);
  return last_keep_alive_;
}

int64_t Session::reopen_count() const {
  absl::MutexLock lock(&mu_);
  return reopen_count_;
}

absl::Status Session::last_reopen_status() const {
  absl::MutexLock lock(&mu_);
  return last_reopen_;
}

absl::Duration Session::IntervalLocked() const {
  absl::Duration interval = options_.keep_alive_interval;
  if (interval == absl::ZeroDuration()) interval = lease_ttl_ / 3;
  return std::max(interval, kMinInterval);
}

void Session::KeepAliveLoop() {
  const bool auto_reopen = options_.auto_reopen;
  bool retry_soon = false;
  mu_.Lock();
  while (true) {
    const absl::Duration interval = IntervalLocked();
    const absl::Duration delay = retry_soon ? std::min(interval, kRetryInterval) : interval;
    // Sleeps until the deadline, returning early once Close() sets closed_.
    mu_.AwaitWithDeadline(absl::Condition(&closed_), absl::Now() + delay);
    if (closed_) break;
    const uint64_t attempt = ++attempts_;
    const Client bound = base_.WithSession(id_);
    mu_.Unlock();
    // Renew first, also when the session is known to be lost: a NOT_FOUND
    // answer shows that a server is up, so the re-open that follows does not
    // wait for an unreachable one. A renewal is not worth more than one
    // interval of waiting.
    absl::StatusOr<v1::KeepAliveResponse> response =
        bound.WithDeadline(std::min(bound.options().deadline, interval)).KeepAlive();
    bool reopen = false;
    {
      absl::MutexLock lock(&mu_);
      last_keep_alive_ = response.status();
      const bool current = bound.session_id() == id_;
      if (response.ok()) {
        ++keep_alive_count_;
        if (current) {
          lost_ = false;
          if (response->lease_ttl_ms() > 0) {
            lease_ttl_ = absl::Milliseconds(response->lease_ttl_ms());
          }
          RecordOpenLocked(attempt, absl::OkStatus());
        }
      } else if (absl::IsNotFound(response.status()) && current) {
        lost_ = true;  // the server restarted or the lease ran out
      }
      reopen = auto_reopen && lost_ && absl::IsNotFound(response.status());
      retry_soon = auto_reopen && !response.ok();
    }
    if (reopen) {
      // The old id is gone and needs no CloseSession.
      absl::MutexLock reopen_lock(&reopen_mu_);
      retry_soon = !ReopenLocked(attempt, /*close_old=*/false, /*only_if_lost=*/true).ok();
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace tokensel::client
