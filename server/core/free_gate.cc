// FreeGate (contract: free_gate.h).
#include "server/core/free_gate.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <new>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tokensel::core {

namespace {

// The tail of Reserve's refusals.
constexpr absl::string_view kWhy =
    "; teardowns wait while a stream of the device waits on a client's wait_event); retry once "
    "they ran";

// The gates ForDevice and ForHost made: never destroyed (free_gate.h).
struct MadeGates {
  std::mutex mu;
  std::array<FreeGate*, FreeGate::kMaxDevices + 1> devices{};
  FreeGate* host = nullptr;
};

MadeGates& Made() {
  static auto* const made = new MadeGates();
  return *made;
}

}  // namespace

FreeGate::FreeGate(FreeGate* host, std::string name) : host_(host), name_(std::move(name)) {}

FreeGate::~FreeGate() { (void)Stop(/*leak=*/false); }

size_t FreeGate::Stop(bool leak) {
  std::thread drainer;
  {
    tokensel::MutexLock lock(&list_mu_);
    stop_ = true;
    // What is left stays in the list, reachable: leaked to the exit (the
    // entries queued once stopped count as they come, FreeOrDefer).
    if (leak && !stopped_) leaked_ += static_cast<int64_t>(deferred_.size());
    if (leak) stopped_ = true;
    drainer = std::move(drainer_);
  }
  // The drainer ends after the free it runs (if any): bounded device work.
  if (drainer.joinable()) drainer.join();
  tokensel::MutexLock lock(&list_mu_);
  return deferred_.size();
}

FreeGate& FreeGate::ForHost() {
  MadeGates& made = Made();
  std::lock_guard<std::mutex> lock(made.mu);
  if (made.host == nullptr) made.host = new FreeGate(nullptr, "the host (pinned memory)");
  return *made.host;
}

FreeGate& FreeGate::ForDevice(int ordinal) {
  // One per ordinal, the last slot shared by the ordinals beyond: never
  // destroyed (free_gate.h).
  FreeGate& host = ForHost();
  MadeGates& made = Made();
  const size_t slot = ordinal >= 0 && ordinal < kMaxDevices ? static_cast<size_t>(ordinal)
                                                            : static_cast<size_t>(kMaxDevices);
  std::lock_guard<std::mutex> lock(made.mu);
  if (made.devices[slot] == nullptr) {
    made.devices[slot] = new FreeGate(
        &host, slot < kMaxDevices ? absl::StrCat("device ", ordinal)
                                  : absl::StrCat("the devices beyond ", kMaxDevices - 1));
  }
  return *made.devices[slot];
}

size_t FreeGate::StopAll(absl::Duration bound) {
  std::vector<FreeGate*> gates;
  {
    MadeGates& made = Made();
    std::lock_guard<std::mutex> lock(made.mu);
    for (FreeGate* g : made.devices) {
      if (g != nullptr) gates.push_back(g);
    }
    if (made.host != nullptr) gates.push_back(made.host);
  }
  // What can run within the bound: entries of open gates (a closed gate's
  // wait is stuck work leaked at shutdown; it would not open).
  const absl::Time deadline = absl::Now() + bound;
  for (FreeGate* g : gates) {
    while (g->Draining() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  }
  size_t left = 0;
  for (FreeGate* g : gates) left += g->Stop(/*leak=*/true);
  if (left > 0) {
    TS_LOG(WARNING) << "free gate: " << left
                    << " deferred teardown(s) left to the process's exit (their gates stayed "
                       "closed or the bound passed)";
  }
  return left;
}

bool FreeGate::Draining() const {
  if (!open()) return false;
  tokensel::MutexLock lock(&list_mu_);
  // Entries no drainer will run (stopped before, not started since) are
  // not waited for.
  return drainer_.joinable() && !Drained();
}

void FreeGate::Enter() {
  // The host gate first: it is closed whenever a device gate is (a pinned
  // free running now ends before this wait is registered).
  if (host_ != nullptr) host_->Enter();
  tokensel::MutexLock lock(&mu_);
  ++waits_;
}

void FreeGate::Leave() {
  bool opened = false;
  {
    tokensel::MutexLock lock(&mu_);
    opened = --waits_ == 0;
  }
  // The drainer runs the deferred frees, not this thread (free_gate.h).
  if (opened) Wake();
  if (host_ != nullptr) host_->Leave();
}

bool FreeGate::BeginFree() {
  mu_.ReaderLock();
  if (waits_ == 0) return true;
  mu_.ReaderUnlock();
  return false;
}

void FreeGate::EndFree() { mu_.ReaderUnlock(); }

bool FreeGate::open() const {
  tokensel::ReaderMutexLock lock(&mu_);
  return waits_ == 0;
}

void FreeGate::Wake() noexcept {
  tokensel::MutexLock lock(&list_mu_);
  wake_ = true;
  opened_ = true;  // called when the gate opens: the hooks run too
}

bool FreeGate::DrainerHasWork() const { return stop_ || (wake_ && !deferred_.empty()) || opened_; }

bool FreeGate::Drained() const {
  // The hooks count only while a drainer runs them (else nothing would).
  return deferred_.empty() && running_ == 0 &&
         (!drainer_.joinable() || (!opened_ && !hooks_running_));
}

absl::Status FreeGate::CheckRoomLocked(absl::string_view what) const {
  // Each peer's queued bytes count here only up to its share (the review2
  // of the seventh session, finding 1): a peer that queues more (several
  // live mappings dropped at once behind its own stuck wait, or one mapping
  // larger than the room) is refused by its own check (ReserveFor), never
  // the other peers through this one.
  const uint64_t counted = unowned_bytes_ + owned_counted_bytes_;
  if (counted > max_deferred_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", name_, " has ", counted,
        " bytes waiting for their deferred teardown, more than the limit of ", max_deferred_bytes_,
        " (FreeGate max_deferred_bytes, each peer's bytes counted up to ", ByteShareLocked(),
        kWhy));
  }
  if (reserved_ >= kMaxPending) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", name_, " has ", reserved_,
        " mappings or allocations live or waiting for their deferred teardown, the limit "
        "(FreeGate::kMaxPending",
        kWhy));
  }
  return absl::OkStatus();
}

absl::Status FreeGate::Reserve(absl::string_view what) { return ReserveFor(what, "").status(); }

absl::StatusOr<uint64_t> FreeGate::ReserveFor(absl::string_view what, absl::string_view owner) {
  tokensel::MutexLock lock(&list_mu_);
  RETURN_IF_ERROR(CheckRoomLocked(what));
  uint64_t id = 0;
  if (!owner.empty()) {
    auto known = share_ids_.find(owner);
    if (known != share_ids_.end()) {
      id = known->second;
      const Share& share = shares_.at(id);
      const uint64_t byte_share = ByteShareLocked();
      if (share.deferred_bytes > byte_share) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what, ": peer ", owner, " has ", share.deferred_bytes, " bytes on ", name_,
            " waiting for their deferred teardown, more than its share of ", byte_share,
            " (FreeGate max_deferred_bytes / ", kOwnerShareDivisor, " per peer", kWhy));
      }
      if (share.rooms >= kMaxPendingPerOwner) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what, ": peer ", owner, " has ", share.rooms, " mappings on ", name_,
            " live or waiting for their deferred teardown, its share of ", kMaxPendingPerOwner,
            " (FreeGate::kMaxPending / ", kMaxPending / kMaxPendingPerOwner, " per peer", kWhy));
      }
    }
  }
  try {
    // The list can take every reserved entry: FreeOrDefer never allocates.
    if (deferred_.capacity() < reserved_ + 1) {
      deferred_.reserve(std::min(kMaxPending, std::max<size_t>(16, 2 * (reserved_ + 1))));
    }
    StartDrainerLocked();
    if (!owner.empty() && id == 0) {
      id = next_share_;
      Share& share = shares_[id];
      share.owner = std::string(owner);
      try {
        share_ids_.emplace(share.owner, id);
      } catch (...) {
        shares_.erase(id);
        throw;
      }
      ++next_share_;
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of host memory for the deferred-free list"));
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": cannot start the deferred-free thread: ", e.what()));
  }
  ++reserved_;
  if (id != 0) ++shares_.at(id).rooms;
  return id;
}

uint64_t FreeGate::ByteShareLocked() const { return max_deferred_bytes_ / kOwnerShareDivisor; }

void FreeGate::DropShareLocked(uint64_t id, size_t rooms, uint64_t bytes) noexcept {
  auto it = id == 0 ? shares_.end() : shares_.find(id);
  if (it == shares_.end()) {  // no share (or a caller bug): counted as unowned
    unowned_bytes_ -= std::min(bytes, unowned_bytes_);
    return;
  }
  Share& share = it->second;
  share.rooms -= std::min(rooms, share.rooms);
  SetShareBytesLocked(share, share.deferred_bytes - std::min(bytes, share.deferred_bytes));
  if (share.rooms == 0 && share.deferred_bytes == 0) {
    share_ids_.erase(share.owner);
    shares_.erase(it);
  }
}

void FreeGate::AddShareBytesLocked(uint64_t id, uint64_t bytes) {
  auto it = id == 0 ? shares_.end() : shares_.find(id);
  if (it == shares_.end()) {
    unowned_bytes_ += bytes;
    return;
  }
  SetShareBytesLocked(it->second, it->second.deferred_bytes + bytes);
}

void FreeGate::SetShareBytesLocked(Share& share, uint64_t bytes) {
  // Counted toward the gate's limit only up to the owner's share.
  const uint64_t byte_share = ByteShareLocked();
  owned_counted_bytes_ -= std::min(share.deferred_bytes, byte_share);
  share.deferred_bytes = bytes;
  owned_counted_bytes_ += std::min(share.deferred_bytes, byte_share);
}

size_t FreeGate::reserved_by(absl::string_view owner) const {
  tokensel::MutexLock lock(&list_mu_);
  auto known = share_ids_.find(owner);
  return known == share_ids_.end() ? 0 : shares_.at(known->second).rooms;
}

uint64_t FreeGate::deferred_bytes_by(absl::string_view owner) const {
  tokensel::MutexLock lock(&list_mu_);
  auto known = share_ids_.find(owner);
  return known == share_ids_.end() ? 0 : shares_.at(known->second).deferred_bytes;
}

void FreeGate::StartDrainerLocked() {
  if (drainer_.joinable()) return;
  // First use, or after StopAll (a new server in this process): running
  // again; what was left runs once the gate is open.
  stop_ = false;
  stopped_ = false;
  wake_ = !deferred_.empty();
  drainer_ = std::thread([this] { DrainLoop(); });
}

void FreeGate::Unreserve(uint64_t owner) noexcept {
  tokensel::MutexLock lock(&list_mu_);
  if (reserved_ > 0) --reserved_;
  DropShareLocked(owner, 1, 0);
}

void FreeGate::Run(const Deferred& free) noexcept {
  if (free.run(free.data, free.arg)) Unreserve(free.owner);
}

void FreeGate::FreeOrDefer(Deferred free) noexcept {
  if (free.run == nullptr) return;
  // Never run here, even while the gate is open: this thread may be the
  // completion thread or hold a lock (free_gate.h). Queued for the drainer.
  bool dropped = false;
  {
    tokensel::MutexLock lock(&list_mu_);
    // Room was reserved for it (capacity >= reserved_): no reallocation.
    if (deferred_.size() >= reserved_ || deferred_.size() == deferred_.capacity()) {
      dropped = true;
      ++dropped_;
    } else {
      deferred_.push_back(free);
      deferred_bytes_ += free.bytes;
      AddShareBytesLocked(free.owner, free.bytes);
      if (stopped_) {
        ++leaked_;  // after StopAll: kept (reachable), never run
      } else {
        wake_ = true;  // the drainer runs it once the gate is open
      }
    }
  }
  if (dropped) {
    TS_LOG(ERROR) << "free gate: a deferred teardown without reserved room was dropped "
                     "(its resource is leaked)";
  }
}

size_t FreeGate::DrainIfOpen() noexcept { return Drain(/*drainer=*/false); }

size_t FreeGate::Drain(bool drainer) noexcept {
  while (true) {
    // One at a time, each holding the gate: a wait queued meanwhile stops
    // the drain (the rest stays for the next opening).
    if (!BeginFree()) break;
    Deferred next;
    {
      tokensel::MutexLock lock(&list_mu_);
      if (deferred_.empty() || (drainer && stop_)) {
        EndFree();
        return deferred_.size();
      }
      next = deferred_.back();
      deferred_.pop_back();
      deferred_bytes_ -= next.bytes;
      // Its room stays the owner's until it ran (Run).
      DropShareLocked(next.owner, 0, next.bytes);
      ++running_;
    }
    Run(next);
    EndFree();
    bool hooks = false;
    {
      tokensel::MutexLock lock(&list_mu_);
      --running_;
      ++ran_;
      hooks = drainer && opened_;
    }
    // Between teardowns, not only after the last: a pool over its cap asks
    // for its trim with the gate open and is not charged until it ran
    // (block_pool.h), so a long queue (each close waiting on the device)
    // must not hold the trim back (the CUDA read of the eighth session,
    // RISK 1).
    if (hooks) RunOpenedHooks();
  }
  tokensel::MutexLock lock(&list_mu_);
  return deferred_.size();
}

void FreeGate::DrainLoop() {
  while (true) {
    {
      tokensel::MutexLock lock(&list_mu_);
      list_mu_.AwaitWithTimeout([this]()
                                    ABSL_NO_THREAD_SAFETY_ANALYSIS { return DrainerHasWork(); },
                                absl::InfiniteDuration());
      if (stop_) return;
      wake_ = false;
    }
    (void)Drain(/*drainer=*/true);
    RunOpenedHooks();
  }
}

uint64_t FreeGate::AddOpenedHook(std::function<void()> hook) {
  tokensel::MutexLock lock(&hooks_mu_);
  hooks_.emplace_back(next_hook_, std::move(hook));
  {
    tokensel::MutexLock list_lock(&list_mu_);
    try {
      StartDrainerLocked();
    } catch (...) {
      hooks_.pop_back();
      throw;
    }
  }
  return next_hook_++;
}

void FreeGate::RemoveOpenedHook(uint64_t id) noexcept {
  tokensel::MutexLock lock(&hooks_mu_);  // a call in progress holds it
  for (auto it = hooks_.begin(); it != hooks_.end(); ++it) {
    if (it->first == id) {
      hooks_.erase(it);
      return;
    }
  }
}

void FreeGate::RunOpenedHooksSoon() noexcept {
  tokensel::MutexLock lock(&list_mu_);
  opened_ = true;  // the drainer's predicate: it wakes and runs the hooks
}

void FreeGate::RunOpenedHooks() noexcept {
  {
    tokensel::MutexLock lock(&hooks_mu_);
    {
      tokensel::MutexLock list_lock(&list_mu_);
      if (!opened_) return;
      opened_ = false;
      hooks_running_ = true;
    }
    for (const auto& [id, hook] : hooks_) {
      try {
        hook();
      } catch (...) {  // a hook must not end the drainer (BlockPool's do not throw)
      }
    }
  }
  tokensel::MutexLock lock(&list_mu_);
  hooks_running_ = false;
}

size_t FreeGate::AwaitDrained(absl::Duration timeout) {
  tokensel::MutexLock lock(&list_mu_);
  list_mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return Drained(); }, timeout);
  return deferred_.size();
}

size_t FreeGate::deferred() const {
  tokensel::MutexLock lock(&list_mu_);
  return deferred_.size();
}
uint64_t FreeGate::deferred_bytes() const {
  tokensel::MutexLock lock(&list_mu_);
  return deferred_bytes_;
}
size_t FreeGate::reserved() const {
  tokensel::MutexLock lock(&list_mu_);
  return reserved_;
}
int64_t FreeGate::dropped() const {
  tokensel::MutexLock lock(&list_mu_);
  return dropped_;
}
int64_t FreeGate::ran_deferred() const {
  tokensel::MutexLock lock(&list_mu_);
  return ran_;
}
int64_t FreeGate::leaked() const {
  tokensel::MutexLock lock(&list_mu_);
  return leaked_;
}
uint64_t FreeGate::max_deferred_bytes() const {
  tokensel::MutexLock lock(&list_mu_);
  return max_deferred_bytes_;
}
void FreeGate::set_max_deferred_bytes(uint64_t bytes) {
  tokensel::MutexLock lock(&list_mu_);
  max_deferred_bytes_ = bytes;
  // The shares changed: each owner's counted bytes again.
  owned_counted_bytes_ = 0;
  for (const auto& [id, share] : shares_) {
    owned_counted_bytes_ += std::min(share.deferred_bytes, ByteShareLocked());
  }
}

}  // namespace tokensel::core
