#include "tokensel/client/session.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"

namespace tokensel::client {
namespace {

// Deadline of the best-effort CloseSession of a stale id in Reopen().
constexpr absl::Duration kStaleCloseDeadline = absl::Seconds(1);
// The shortest keep-alive interval.
constexpr absl::Duration kMinInterval = absl::Milliseconds(10);

}  // namespace

// The session's mutable state, its locks and the keep-alive thread. Its
// methods are Session's, with the same contracts (session.h).
class Session::State {
 public:
  State(Client client, SessionOptions options)
      : base_(client.WithSession("")), options_(std::move(options)) {}

  // Opens the first session and starts the keep-alive thread.
  absl::Status Start();
  std::string id() const;
  absl::Duration lease_ttl() const;
  Client client() const;
  absl::StatusOr<v1::BufferInfo> RegisterBuffer(const v1::RegisterBufferRequest& request);
  absl::Status UnregisterBuffer(absl::string_view name);
  std::vector<v1::RegisterBufferRequest> registrations() const;
  absl::Status Reopen();
  absl::Status WaitUntilOpen(absl::Duration timeout) const;
  absl::Status Close();
  int64_t keep_alive_count() const;
  absl::Status last_keep_alive_status() const;
  int64_t reopen_count() const;
  absl::Status last_reopen_status() const;

 private:
  // The OpenSession call (no lock needed: base_ and options_ are const).
  absl::StatusOr<v1::OpenSessionResponse> OpenNew() const;
  // Re-open for attempt `attempt`: closes the old id first if `close_old`;
  // with `only_if_lost`, does nothing (OK) unless the session is lost.
  absl::Status ReopenLocked(uint64_t attempt, bool close_old, bool only_if_lost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reopen_mu_);
  // Records that attempt `attempt` found the session open with `status`.
  void RecordOpenLocked(uint64_t attempt, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration IntervalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KeepAliveLoop();

  const Client base_;  // no session id
  const SessionOptions options_;

  // Serializes re-opens (manual and automatic) with RegisterBuffer and
  // UnregisterBuffer; held across their RPCs. Taken before mu_.
  Mutex reopen_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // The state below; never held across an RPC.
  mutable Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);
  absl::Duration lease_ttl_ ABSL_GUARDED_BY(mu_);
  // Changed only with reopen_mu_ held too.
  std::vector<v1::RegisterBufferRequest> registrations_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;  // id_ is known to be gone
  int64_t keep_alive_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_keep_alive_ ABSL_GUARDED_BY(mu_);
  int64_t reopen_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_reopen_ ABSL_GUARDED_BY(mu_);
  // Attempts (renewals, re-opens) are numbered as they begin; open_attempt_
  // is the latest one that found the session open, with open_status_.
  uint64_t attempts_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t open_attempt_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status open_status_ ABSL_GUARDED_BY(mu_);
  // Started by Start(), joined by Close() (only those two touch it, and
  // Close() is serialized by closed_).
  std::thread keep_alive_;
};

Session::Session(std::unique_ptr<State> state) : state_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(const Client& client,
                                                       SessionOptions options) {
  if (options.lease_ttl < absl::ZeroDuration() ||
      options.keep_alive_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl and keep_alive_interval must be >= 0");
  }
  auto state = std::make_unique<State>(client, std::move(options));
  if (absl::Status started = state->Start(); !started.ok()) return started;
  return std::unique_ptr<Session>(new Session(std::move(state)));
}

Session::~Session() { Close().IgnoreError(); }

std::string Session::id() const { return state_->id(); }
absl::Duration Session::lease_ttl() const { return state_->lease_ttl(); }
Client Session::client() const { return state_->client(); }
absl::StatusOr<v1::BufferInfo> Session::RegisterBuffer(const v1::RegisterBufferRequest& request) {
  return state_->RegisterBuffer(request);
}
absl::Status Session::UnregisterBuffer(absl::string_view name) {
  return state_->UnregisterBuffer(name);
}
std::vector<v1::RegisterBufferRequest> Session::registrations() const {
  return state_->registrations();
}
absl::Status Session::Reopen() { return state_->Reopen(); }
absl::Status Session::WaitUntilOpen(absl::Duration timeout) const {
  return state_->WaitUntilOpen(timeout);
}
absl::Status Session::Close() { return state_->Close(); }
int64_t Session::keep_alive_count() const { return state_->keep_alive_count(); }
absl::Status Session::last_keep_alive_status() const { return state_->last_keep_alive_status(); }
int64_t Session::reopen_count() const { return state_->reopen_count(); }
absl::Status Session::last_reopen_status() const { return state_->last_reopen_status(); }

absl::Status Session::State::Start() {
  absl::StatusOr<v1::OpenSessionResponse> opened = OpenNew();
  {
    MutexLock lock(&mu_);
    if (!opened.ok()) {
      closed_ = true;  // nothing to close
      return opened.status();
    }
    id_ = opened->session_id();
    lease_ttl_ = absl::Milliseconds(opened->lease_ttl_ms());
  }
  if (options_.keep_alive) keep_alive_ = std::thread([this] { KeepAliveLoop(); });
  return absl::OkStatus();
}

absl::StatusOr<v1::OpenSessionResponse> Session::State::OpenNew() const {
  v1::OpenSessionRequest request;
  request.set_client_name(options_.client_name);
  request.set_lease_ttl_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(options_.lease_ttl)));
  return base_.OpenSession(request);
}

std::string Session::State::id() const {
  MutexLock lock(&mu_);
  return id_;
}

absl::Duration Session::State::lease_ttl() const {
  MutexLock lock(&mu_);
  return lease_ttl_;
}

Client Session::State::client() const {
  MutexLock lock(&mu_);
  return base_.WithSession(id_);
}

absl::StatusOr<v1::BufferInfo> Session::State::RegisterBuffer(
    const v1::RegisterBufferRequest& request) {
  MutexLock reopen_lock(&reopen_mu_);
  absl::StatusOr<v1::BufferInfo> info = client().RegisterBuffer(request);
  if (info.ok()) {
    MutexLock lock(&mu_);
    registrations_.push_back(request);
  }
  return info;
}

absl::Status Session::State::UnregisterBuffer(absl::string_view name) {
  MutexLock reopen_lock(&reopen_mu_);
  absl::Status status = client().UnregisterBuffer(name);
  if (status.ok() || absl::IsNotFound(status)) {
    MutexLock lock(&mu_);
    registrations_.erase(
        std::remove_if(registrations_.begin(), registrations_.end(),
                       [&](const v1::RegisterBufferRequest& r) { return r.name() == name; }),
        registrations_.end());
  }
  return status;
}

std::vector<v1::RegisterBufferRequest> Session::State::registrations() const {
  MutexLock lock(&mu_);
  return registrations_;
}

absl::Status Session::State::Reopen() {
  MutexLock reopen_lock(&reopen_mu_);
  uint64_t attempt = 0;
  {
    MutexLock lock(&mu_);
    if (closed_) return absl::FailedPreconditionError("Reopen: the session is closed");
    attempt = ++attempts_;
  }
  return ReopenLocked(attempt, /*close_old=*/true, /*only_if_lost=*/false);
}

absl::Status Session::State::ReopenLocked(uint64_t attempt, bool close_old, bool only_if_lost) {
  std::string old_id;
  std::vector<v1::RegisterBufferRequest> registrations;
  {
    MutexLock lock(&mu_);
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
    MutexLock lock(&mu_);
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
  MutexLock lock(&mu_);
  id_ = opened->session_id();
  lease_ttl_ = absl::Milliseconds(opened->lease_ttl_ms());
  lost_ = false;
  ++reopen_count_;
  last_reopen_ = status;
  RecordOpenLocked(attempt, status);
  return status;
}

void Session::State::RecordOpenLocked(uint64_t attempt, const absl::Status& status) {
  if (attempt < open_attempt_) return;  // a later attempt already reported
  open_attempt_ = attempt;
  open_status_ = status;
}

absl::Status Session::State::WaitUntilOpen(absl::Duration timeout) const {
  if (!options_.keep_alive) {
    return absl::FailedPreconditionError(
        "WaitUntilOpen: needs the keep-alive thread (SessionOptions::keep_alive)");
  }
  MutexLock lock(&mu_);
  const uint64_t after = attempts_;
  auto done = [this, after]()
                  ABSL_NO_THREAD_SAFETY_ANALYSIS { return closed_ || open_attempt_ > after; };
  if (!mu_.AwaitWithTimeout(done, timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "WaitUntilOpen: the session was not confirmed open within ", absl::FormatDuration(timeout),
        "; last keep-alive: ", last_keep_alive_.ToString(),
        "; last re-open: ", last_reopen_.ToString()));
  }
  if (closed_) return absl::FailedPreconditionError("WaitUntilOpen: the session is closed");
  return open_status_;
}

absl::Status Session::State::Close() {
  {
    MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;  // wakes the keep-alive loop (it waits on this condition)
  }
  if (keep_alive_.joinable()) keep_alive_.join();
  std::string id;
  bool lost = false;
  {
    // A Reopen() in progress publishes its new id before releasing this.
    MutexLock reopen_lock(&reopen_mu_);
    MutexLock lock(&mu_);
    id = id_;
    lost = lost_;
  }
  if (id.empty()) return absl::OkStatus();
  absl::Status status = base_.WithSession(id).CloseSession();
  if (lost && absl::IsNotFound(status)) return absl::OkStatus();
  return status;
}

int64_t Session::State::keep_alive_count() const {
  MutexLock lock(&mu_);
  return keep_alive_count_;
}

absl::Status Session::State::last_keep_alive_status() const {
  MutexLock lock(&mu_);
  return last_keep_alive_;
}

int64_t Session::State::reopen_count() const {
  MutexLock lock(&mu_);
  return reopen_count_;
}

absl::Status Session::State::last_reopen_status() const {
  MutexLock lock(&mu_);
  return last_reopen_;
}

absl::Duration Session::State::IntervalLocked() const {
  absl::Duration interval = options_.keep_alive_interval;
  if (interval == absl::ZeroDuration()) interval = lease_ttl_ / 3;
  return std::max(interval, kMinInterval);
}

void Session::State::KeepAliveLoop() {
  const bool auto_reopen = options_.auto_reopen;
  bool retry_soon = false;
  mu_.Lock();
  while (true) {
    const absl::Duration interval = IntervalLocked();
    const absl::Duration delay = retry_soon ? std::min(interval, kRetryInterval) : interval;
    // Sleeps until the deadline, returning early once Close() sets closed_.
    mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return closed_; }, delay);
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
      MutexLock lock(&mu_);
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
      MutexLock reopen_lock(&reopen_mu_);
      retry_soon = !ReopenLocked(attempt, /*close_old=*/false, /*only_if_lost=*/true).ok();
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace tokensel::client
