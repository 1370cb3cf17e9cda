// FreeGate (contract: free_gate.h).
#include "server/core/free_gate.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <new>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tokensel::core {

FreeGate::~FreeGate() {
  std::thread drainer;
  {
    tokensel::MutexLock lock(&list_mu_);
    stop_ = true;
    drainer = std::move(drainer_);
  }
  if (drainer.joinable()) drainer.join();
}

FreeGate& FreeGate::ForDevice(int ordinal) {
  // One per ordinal, the last slot shared by the ordinals beyond: never
  // destroyed (free_gate.h).
  static std::mutex made_mu;
  static std::array<FreeGate*, kMaxDevices + 1> gates{};
  const size_t slot = ordinal >= 0 && ordinal < kMaxDevices ? static_cast<size_t>(ordinal)
                                                            : static_cast<size_t>(kMaxDevices);
  std::lock_guard<std::mutex> lock(made_mu);
  if (gates[slot] == nullptr) gates[slot] = new FreeGate();
  return *gates[slot];
}

void FreeGate::Enter() {
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

bool FreeGate::Drained() const { return deferred_.empty() && running_ == 0; }

absl::Status FreeGate::Reserve(absl::string_view what) {
  tokensel::MutexLock lock(&list_mu_);
  if (reserved_ >= kMaxPending) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": this device has ", reserved_,
        " mappings or allocations live or waiting for their deferred teardown, the limit "
        "(FreeGate::kMaxPending; teardowns wait while a stream of the device waits on a "
        "client's wait_event); retry once they ran"));
  }
  try {
    // The list can take every reserved entry: FreeOrDefer never allocates.
    if (deferred_.capacity() < reserved_ + 1) {
      deferred_.reserve(std::min(kMaxPending, std::max<size_t>(16, 2 * (reserved_ + 1))));
    }
    if (!drainer_.joinable()) drainer_ = std::thread([this] { DrainLoop(); });
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of host memory for the deferred-free list"));
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": cannot start the deferred-free thread: ", e.what()));
  }
  ++reserved_;
  return absl::OkStatus();
}

void FreeGate::Unreserve() noexcept {
  tokensel::MutexLock lock(&list_mu_);
  if (reserved_ > 0) --reserved_;
}

void FreeGate::Run(const Deferred& free) noexcept {
  if (free.run(free.data, free.arg)) Unreserve();
}

void FreeGate::FreeOrDefer(Deferred free) noexcept {
  if (free.run == nullptr) return;
  if (BeginFree()) {
    Run(free);
    EndFree();
    return;
  }
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
      // The gate may have opened between the check and the push: the
      // drainer looks again (it waits for wake_ with a non-empty list).
      wake_ = true;
    }
  }
  if (dropped) {
    TS_LOG(ERROR) << "free gate: a deferred teardown without reserved room was dropped "
                     "(its resource is leaked)";
  }
}

size_t FreeGate::DrainIfOpen() noexcept {
  while (true) {
    // One at a time, each holding the gate: a wait queued meanwhile stops
    // the drain (the rest stays for the next opening).
    if (!BeginFree()) break;
    Deferred next;
    {
      tokensel::MutexLock lock(&list_mu_);
      if (deferred_.empty()) {
        EndFree();
        return 0;
      }
      next = deferred_.back();
      deferred_.pop_back();
      deferred_bytes_ -= next.bytes;
      ++running_;
    }
    Run(next);
    EndFree();
    tokensel::MutexLock lock(&list_mu_);
    --running_;
    ++ran_;
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
    (void)DrainIfOpen();
    RunOpenedHooks();
  }
}

uint64_t FreeGate::AddOpenedHook(std::function<void()> hook) {
  tokensel::MutexLock lock(&hooks_mu_);
  hooks_.emplace_back(next_hook_, std::move(hook));
  {
    tokensel::MutexLock list_lock(&list_mu_);
    try {
      if (!drainer_.joinable()) drainer_ = std::thread([this] { DrainLoop(); });
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

void FreeGate::RunOpenedHooks() noexcept {
  {
    tokensel::MutexLock lock(&list_mu_);
    if (!opened_) return;
    opened_ = false;
  }
  tokensel::MutexLock lock(&hooks_mu_);
  for (const auto& [id, hook] : hooks_) {
    try {
      hook();
    } catch (...) {  // a hook must not end the drainer (BlockPool's do not throw)
    }
  }
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

}  // namespace tokensel::core
