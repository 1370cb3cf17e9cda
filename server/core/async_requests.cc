// AsyncRequests (contract: async_requests.h).
#include "server/core/async_requests.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {
namespace {

constexpr absl::Duration kWaitPoll = absl::Milliseconds(5);

}  // namespace

absl::Status AsyncLimits::CheckWaitCaps() const {
  // The names are the server's flags (server/main.cc), which set these.
  if (stuck_per_session == 0 || stuck_per_session > stuck_per_peer ||
      stuck_per_peer > stuck_total) {
    return absl::InvalidArgumentError(
        absl::StrCat("the wait caps must be 0 < --max_waits_per_session <= --max_waits_per_peer <= "
                     "--max_waits, not ",
                     stuck_per_session, ", ", stuck_per_peer, ", ", stuck_total));
  }
  return absl::OkStatus();
}

AsyncRequests::Ticket::Ticket(Ticket&& other) noexcept
    : owner_(other.owner_),
      session_(std::move(other.session_)),
      peer_(std::move(other.peer_)),
      number_(other.number_),
      waiting_(other.waiting_),
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
    waiting_ = other.waiting_;
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
  owner->Complete(session_, peer_, number_, waiting_, stuck_, status);
}

void AsyncRequests::Ticket::WaitPassed() {
  if (owner_ == nullptr || !waiting_) return;
  waiting_ = false;
  owner_->WaitPassed(session_, peer_);
}

void AsyncRequests::Ticket::Abandon() {
  // Only a request still waiting in its slot can turn stuck: one without a
  // slot (no wait_event, or its wait passed) waits on nothing of the
  // client's, and counting it stuck would exceed the caps (async_requests.h).
  if (owner_ == nullptr || !waiting_) return;
  waiting_ = false;
  stuck_ = true;
  owner_->Abandon(session_, peer_);
}

AsyncRequests::~AsyncRequests() { WaitAll(absl::InfiniteDuration()); }

absl::Status AsyncRequests::Refuse(uint32_t inflight, uint32_t stuck, uint32_t limit,
                                   const char* where) {
  ++rejected_;
  if (metrics_ != nullptr) metrics_->CountRefusedEventExecute();
  return absl::ResourceExhaustedError(absl::StrCat(
      "CUDA IPC events: ", inflight + stuck, " Executes with events outstanding (", inflight,
      " in flight: answered before completion, or waiting on a client event; ", stuck,
      " stuck: abandoned while waiting on a wait_event that has not completed) ", where,
      ", the limit is ", limit,
      "; wait on an earlier record_event (or send an Execute with no ops and no events), or "
      "complete (record) the events stuck requests wait on, first"));
}

absl::Status AsyncRequests::RefuseWait(uint32_t waiting, uint32_t stuck, uint32_t limit,
                                       const char* where) {
  ++rejected_;
  if (metrics_ != nullptr) metrics_->CountRefusedEventExecute();
  return absl::ResourceExhaustedError(absl::StrCat(
      "CUDA IPC events: ", waiting + stuck, " Executes with a wait_event that has not completed (",
      waiting, " waiting on it, ", stuck, " abandoned while waiting on a wait_event) ", where,
      ", the limit is ", limit,
      "; complete (record) those events before sending more Executes with a wait_event"));
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
  // complete is refused here, by its own wait count (the refusal names the
  // wait cap). A wait slot, counted with the stuck ones: what may turn
  // stuck later is bounded now (async_requests.h).
  if (may_stick) {
    if (s.waiting + s.stuck >= limits_.stuck_per_session) {
      return RefuseWait(s.waiting, s.stuck, limits_.stuck_per_session, "in this session");
    }
    if (p.waiting + p.stuck >= limits_.stuck_per_peer) {
      return RefuseWait(p.waiting, p.stuck, limits_.stuck_per_peer, peer_where.c_str());
    }
    if (waiting_ + stuck_ >= limits_.stuck_total) {
      return RefuseWait(waiting_, stuck_, limits_.stuck_total, "in the server");
    }
  }
  // The admission caps count the stuck requests too (the second read of
  // the seventh review, finding 3: a stuck request left them, so a peer
  // held per_peer in flight plus stuck_per_peer stuck, each with its
  // memory reservation, and "stuck requests pin no more than requests in
  // flight may" was false): in flight + stuck <= per_session, per_peer
  // and total. A peer's stuck requests thus take only its own admission
  // (and its sessions'), and the server's share of them (async_requests.h).
  if (s.inflight + s.stuck >= limits_.per_session) {
    return Refuse(s.inflight, s.stuck, limits_.per_session, "in this session");
  }
  if (p.inflight + p.stuck >= limits_.per_peer) {
    return Refuse(p.inflight, p.stuck, limits_.per_peer, peer_where.c_str());
  }
  if (inflight_ + stuck_ >= limits_.total) {
    return Refuse(inflight_, stuck_, limits_.total, "in the server");
  }
  Session& admitted = sessions_[session];
  Counts& counts = peers_[peer];
  ++admitted.inflight;
  ++counts.inflight;
  ++inflight_;
  if (may_stick) {
    ++admitted.waiting;
    ++counts.waiting;
    ++waiting_;
  }
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  return Ticket(this, session, peer, ++admitted.admitted, may_stick);
}

void AsyncRequests::WaitPassed(const std::string& session, const std::string& peer) {
  tokensel::MutexLock lock(&mu_);
  --waiting_;
  // Always found: a session and a peer with a ticket stay.
  if (auto p = peers_.find(peer); p != peers_.end()) --p->second.waiting;
  if (auto it = sessions_.find(session); it != sessions_.end()) --it->second.waiting;
}

// From its wait slot (the ticket was waiting): waiting -> stuck, in flight
// -> stuck (both still count against the admission caps, async_requests.h).
void AsyncRequests::Abandon(const std::string& session, const std::string& peer) {
  tokensel::MutexLock lock(&mu_);
  --inflight_;
  --waiting_;
  ++stuck_;
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  if (auto p = peers_.find(peer); p != peers_.end()) {  // always: a peer with a ticket stays
    --p->second.inflight;
    --p->second.waiting;
    ++p->second.stuck;
  }
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;  // unreachable: a session with a ticket stays
  --it->second.inflight;
  --it->second.waiting;
  ++it->second.stuck;
}

void AsyncRequests::Complete(const std::string& session, const std::string& peer, uint64_t number,
                             bool waiting, bool stuck, const absl::Status& status) {
  tokensel::MutexLock lock(&mu_);
  --(stuck ? stuck_ : inflight_);
  if (waiting) --waiting_;
  if (metrics_ != nullptr) metrics_->SetEventExecutes(inflight_ + stuck_);
  if (auto p = peers_.find(peer); p != peers_.end()) {
    --(stuck ? p->second.stuck : p->second.inflight);
    if (waiting) --p->second.waiting;
    if (p->second.inflight == 0 && p->second.stuck == 0) peers_.erase(p);
  }
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;  // unreachable: a session with a ticket stays
  --(stuck ? it->second.stuck : it->second.inflight);
  if (waiting) --it->second.waiting;
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

uint32_t AsyncRequests::waiting() const {
  tokensel::MutexLock lock(&mu_);
  return waiting_;
}

uint32_t AsyncRequests::waiting(const std::string& session) const {
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : it->second.waiting;
}

uint32_t AsyncRequests::peer_waiting(const std::string& peer) const {
  tokensel::MutexLock lock(&mu_);
  auto it = peers_.find(peer);
  return it == peers_.end() ? 0 : it->second.waiting;
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
