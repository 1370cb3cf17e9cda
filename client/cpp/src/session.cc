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
  {
    absl::MutexLock lock(&session->mu_);
    absl::Status status = session->OpenLocked();
    if (!status.ok()) {
      session->closed_ = true;  // nothing to close
      return status;
    }
  }
  if (session->options_.keep_alive) {
    session->keep_alive_ = std::thread([s = session.get()] { s->KeepAliveLoop(); });
  }
  return session;
}

Session::~Session() { Close().IgnoreError(); }

absl::Status Session::OpenLocked() {
  v1::OpenSessionRequest request;
  request.set_client_name(options_.client_name);
  request.set_lease_ttl_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(options_.lease_ttl)));
  absl::StatusOr<v1::OpenSessionResponse> response = base_.OpenSession(request);
  if (!response.ok()) return response.status();
  id_ = response->session_id();
  lease_ttl_ = absl::Milliseconds(response->lease_ttl_ms());
  return absl::OkStatus();
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
  absl::StatusOr<v1::BufferInfo> info = client().RegisterBuffer(request);
  if (info.ok()) {
    absl::MutexLock lock(&mu_);
    registrations_.push_back(request);
  }
  return info;
}

absl::Status Session::UnregisterBuffer(absl::string_view name) {
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
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("Reopen: the session is closed");
  if (!id_.empty()) {
    // The old session may still live (e.g. a transient network error).
    base_.WithSession(id_).WithDeadline(kStaleCloseDeadline).CloseSession().IgnoreError();
    id_.clear();
  }
  absl::Status status = OpenLocked();
  if (!status.ok()) return status;
  const Client bound = base_.WithSession(id_);
  for (const v1::RegisterBufferRequest& request : registrations_) {
    absl::StatusOr<v1::BufferInfo> info = bound.RegisterBuffer(request);
    if (!info.ok()) {
      return absl::Status(info.status().code(),
                          absl::StrCat("Reopen: re-registering buffer \"", request.name(),
                                       "\": ", info.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Session::Close() {
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;  // wakes the keep-alive loop (it waits on this condition)
    id = id_;
  }
  if (keep_alive_.joinable()) keep_alive_.join();
  if (id.empty()) return absl::OkStatus();
  return base_.WithSession(id).CloseSession();
}

int64_t Session::keep_alive_count() const {
  absl::MutexLock lock(&mu_);
  return keep_alive_count_;
}

absl::Status Session::last_keep_alive_status() const {
  absl::MutexLock lock(&mu_);
  return last_keep_alive_;
}

void Session::KeepAliveLoop() {
  mu_.Lock();
  while (true) {
    absl::Duration interval = options_.keep_alive_interval;
    if (interval == absl::ZeroDuration()) interval = lease_ttl_ / 3;
    interval = std::max(interval, absl::Milliseconds(10));
    const absl::Time wake = absl::Now() + interval;
    // Sleeps until `wake`, returning early once Close() sets closed_.
    mu_.AwaitWithDeadline(absl::Condition(&closed_), wake);
    if (closed_) break;
    const Client bound = base_.WithSession(id_);
    mu_.Unlock();
    // A renewal is not worth more than one interval of waiting.
    absl::StatusOr<v1::KeepAliveResponse> response =
        bound.WithDeadline(std::min(bound.options().deadline, interval)).KeepAlive();
    mu_.Lock();
    last_keep_alive_ = response.status();
    if (response.ok()) {
      ++keep_alive_count_;
      if (bound.session_id() == id_ && response->lease_ttl_ms() > 0) {
        lease_ttl_ = absl::Milliseconds(response->lease_ttl_ms());
      }
    }
  }
  mu_.Unlock();
}

}  // namespace tokensel::client
