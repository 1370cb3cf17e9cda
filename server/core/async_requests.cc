// AsyncRequests (contract: async_requests.h).
#include "server/core/async_requests.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {
namespace {

constexpr absl::Duration kWaitPoll = absl::Milliseconds(5);

}  // namespace

AsyncRequests::Ticket::Ticket(Ticket&& other) noexcept
    : owner_(other.owner_),
      session_(std::move(other.session_)),
      number_(other.number_),
      stuck_(other.stuck_) {
  other.owner_ = nullptr;
}

AsyncRequests::Ticket& AsyncRequests::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Complete(absl::OkStatus());
    owner_ = other.owner_;
    session_ = std::move(other.session_);
    number_ = other.number_;
    stuck_ = other.stuck_;
    other.owner_ = nullptr;
  }
  return *this;
}

AsyncRequests::Ticket::~Ticket() { Complete(absl::OkStatus()); }

void AsyncRequests::Ticket::Complete(const absl::Status& status) {
  if (owner_ == nullptr) return;
  AsyncRequests* const owner = owner_;
  owner_ = nullptr;
  owner->Complete(session_, number_, stuck_, status);
}

void AsyncRequests::Ticket::Abandon() {
  if (owner_ == nullptr || stuck_) return;
  stuck_ = true;
  owner_->Abandon(session_);
}

AsyncRequests::~AsyncRequests() { WaitAll(absl::InfiniteDuration()); }

absl::StatusOr<AsyncRequests::Ticket> AsyncRequests::Admit(const std::string& session,
                                                           bool may_stick) {
  tokensel::MutexLock lock(&mu_);
  Session& s = sessions_[session];
  // Before the admission caps: a session whose events never complete is
  // refused here, by its own count, and its stuck requests no longer take
  // admission from anyone (async_requests.h).
  if (may_stick && (s.stuck >= limits_.stuck_per_session || stuck_ >= limits_.stuck_total)) {
    ++rejected_;
    if (metrics_ != nullptr) metrics_->CountRefusedEventExecute();
    const bool mine = s.stuck >= limits_.stuck_per_session;
    return absl::ResourceExhaustedError(absl::StrCat(
        "CUDA IPC events: ", mine ? s.stuck : stuck_,
        " Executes abandoned while waiting on a wait_event that has not completed ",
        mine ? "in this session" : "in the server", ", the limit is ",
        mine ? limits_.stuck_per_session : limits_.stuck_total,
        "; complete (record) those events before sending more Executes with a wait_event"));
  }
  if (s.inflight >= limits_.per_session || inflight_ >= limits_.total) {
    ++rejected_;
    if (metrics_ != nullptr) metrics_->CountRefusedEventExecute();
    const bool mine = s.inflight >= limits_.per_session;
    return absl::ResourceExhaustedError(absl::StrCat(
        "CUDA IPC events: ", mine ? s.inflight : inflight_,
        " Executes with events in flight (answered before completion, or waiting on a client "
        "event) ",
        mine ? "in this session" : "in the server", ", the limit is ",
        mine ? limits_.per_session : limits_.total,
        "; wait on an earlier record_event (or send an Execute with no ops and no events) first"));
  }
  ++s.inflight;
  ++inflight_;
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  return Ticket(this, session, ++s.admitted);
}

void AsyncRequests::Abandon(const std::string& session) {
  tokensel::MutexLock lock(&mu_);
  --inflight_;
  ++stuck_;
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;  // unreachable: a session with a ticket stays
  --it->second.inflight;
  ++it->second.stuck;
}

void AsyncRequests::Complete(const std::string& session, uint64_t number, bool stuck,
                             const absl::Status& status) {
  tokensel::MutexLock lock(&mu_);
  --(stuck ? stuck_ : inflight_);
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;  // unreachable: a session with a ticket stays
  --(stuck ? it->second.stuck : it->second.inflight);
  if (!status.ok()) {
    if (it->second.deferred.ok() && !it->second.ended) {
      it->second.deferred =
          absl::Status(status.code(), absl::StrCat("deferred from async Execute #", number,
                                                   " of this session: ", status.message()));
    } else {
      ++dropped_;
    }
  }
  MaybeErase(it);
}

void AsyncRequests::MaybeErase(std::map<std::string, Session>::iterator it) {
  if (it->second.ended && it->second.inflight == 0 && it->second.stuck == 0) sessions_.erase(it);
}

absl::Status AsyncRequests::TakeDeferred(const std::string& session) {
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return absl::OkStatus();
  return std::exchange(it->second.deferred, absl::OkStatus());
}

absl::Status AsyncRequests::WaitSession(const std::string& session,
                                        const std::function<absl::Status()>& check) {
  tokensel::MutexLock lock(&mu_);
  auto idle = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto it = sessions_.find(session);
    return it == sessions_.end() || (it->second.inflight == 0 && it->second.stuck == 0);
  };
  while (!mu_.AwaitWithTimeout(idle, kWaitPoll)) {
    if (check) {
      mu_.Unlock();
      absl::Status st = check();
      mu_.Lock();
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

bool AsyncRequests::WaitAll(absl::Duration timeout) {
  tokensel::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return inflight_ == 0 && stuck_ == 0; };
  return mu_.AwaitWithTimeout(idle, timeout);
}

void AsyncRequests::EndSession(const std::string& session) {
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  it->second.ended = true;
  it->second.deferred = absl::OkStatus();
  MaybeErase(it);
}

uint32_t AsyncRequests::inflight() const {
  tokensel::MutexLock lock(&mu_);
  return inflight_;
}

uint32_t AsyncRequests::inflight(const std::string& session) const {
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : it->second.inflight;
}

uint32_t AsyncRequests::stuck() const {
  tokensel::MutexLock lock(&mu_);
  return stuck_;
}

uint32_t AsyncRequests::stuck(const std::string& session) const {
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : it->second.stuck;
}

uint64_t AsyncRequests::rejected() const {
  tokensel::MutexLock lock(&mu_);
  return rejected_;
}

uint64_t AsyncRequests::dropped_errors() const {
  tokensel::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace tokensel::core
