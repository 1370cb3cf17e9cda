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
      peer_(std::move(other.peer_)),
      number_(other.number_),
      stuck_(other.stuck_) {
  other.owner_ = nullptr;
}

AsyncRequests::Ticket& AsyncRequests::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Complete(absl::OkStatus());
    owner_ = other.owner_;
    session_ = std::move(other.session_);
    peer_ = std::move(other.peer_);
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
  owner->Complete(session_, peer_, number_, stuck_, status);
}

void AsyncRequests::Ticket::Abandon() {
  if (owner_ == nullptr || stuck_) return;
  stuck_ = true;
  owner_->Abandon(session_, peer_);
}

AsyncRequests::~AsyncRequests() { WaitAll(absl::InfiniteDuration()); }

absl::Status AsyncRequests::Refuse(bool stuck, uint32_t count, uint32_t limit, const char* where) {
  ++rejected_;
  if (metrics_ != nullptr) metrics_->CountRefusedEventExecute();
  if (stuck) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "CUDA IPC events: ", count,
        " Executes abandoned while waiting on a wait_event that has not completed ", where,
        ", the limit is ", limit,
        "; complete (record) those events before sending more Executes with a wait_event"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "CUDA IPC events: ", count,
      " Executes with events in flight (answered before completion, or waiting on a client "
      "event) ",
      where, ", the limit is ", limit,
      "; wait on an earlier record_event (or send an Execute with no ops and no events) first"));
}

absl::StatusOr<AsyncRequests::Ticket> AsyncRequests::Admit(const std::string& session,
                                                           const std::string& peer,
                                                           bool may_stick) {
  tokensel::MutexLock lock(&mu_);
  // Looked up, not inserted, until admitted: a refusal leaves no entry.
  auto found_session = sessions_.find(session);
  auto found_peer = peers_.find(peer);
  const Session no_session;
  const Counts no_peer;
  const Session& s = found_session != sessions_.end() ? found_session->second : no_session;
  const Counts& p = found_peer != peers_.end() ? found_peer->second : no_peer;
  // The caller's own principal, named so that a client sees which of its
  // identities the cap counts.
  const std::string peer_where =
      absl::StrCat("for peer ", peer.empty() ? "(unnamed)" : peer, " (all its sessions)");
  // Before the admission caps: a session (or peer) whose events never
  // complete is refused here, by its own count, and its stuck requests no
  // longer take admission from anyone (async_requests.h).
  if (may_stick) {
    if (s.stuck >= limits_.stuck_per_session) {
      return Refuse(true, s.stuck, limits_.stuck_per_session, "in this session");
    }
    if (p.stuck >= limits_.stuck_per_peer) {
      return Refuse(true, p.stuck, limits_.stuck_per_peer, peer_where.c_str());
    }
    if (stuck_ >= limits_.stuck_total) {
      return Refuse(true, stuck_, limits_.stuck_total, "in the server");
    }
  }
  if (s.inflight >= limits_.per_session) {
    return Refuse(false, s.inflight, limits_.per_session, "in this session");
  }
  if (p.inflight >= limits_.per_peer) {
    return Refuse(false, p.inflight, limits_.per_peer, peer_where.c_str());
  }
  if (inflight_ >= limits_.total) return Refuse(false, inflight_, limits_.total, "in the server");
  Session& admitted = sessions_[session];
  ++admitted.inflight;
  ++peers_[peer].inflight;
  ++inflight_;
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  return Ticket(this, session, peer, ++admitted.admitted);
}

void AsyncRequests::Abandon(const std::string& session, const std::string& peer) {
  tokensel::MutexLock lock(&mu_);
  --inflight_;
  ++stuck_;
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  if (auto p = peers_.find(peer); p != peers_.end()) {  // always: a peer with a ticket stays
    --p->second.inflight;
    ++p->second.stuck;
  }
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;  // unreachable: a session with a ticket stays
  --it->second.inflight;
  ++it->second.stuck;
}

void AsyncRequests::Complete(const std::string& session, const std::string& peer, uint64_t number,
                             bool stuck, const absl::Status& status) {
  tokensel::MutexLock lock(&mu_);
  --(stuck ? stuck_ : inflight_);
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  if (auto p = peers_.find(peer); p != peers_.end()) {
    --(stuck ? p->second.stuck : p->second.inflight);
    if (p->second.inflight == 0 && p->second.stuck == 0) peers_.erase(p);
  }
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

uint32_t AsyncRequests::peer_inflight(const std::string& peer) const {
  tokensel::MutexLock lock(&mu_);
  auto it = peers_.find(peer);
  return it == peers_.end() ? 0 : it->second.inflight;
}

uint32_t AsyncRequests::peer_stuck(const std::string& peer) const {
  tokensel::MutexLock lock(&mu_);
  auto it = peers_.find(peer);
  return it == peers_.end() ? 0 : it->second.stuck;
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
