// FreeGate (contract: free_gate.h).
#include "server/core/free_gate.h"

#include <utility>

namespace tokensel::core {

FreeGate::FreeGate() { deferred_.reserve(kMaxDeferred); }

FreeGate& FreeGate::Process() {
  static FreeGate* const gate = new FreeGate();  // never destroyed (free_gate.h)
  return *gate;
}

void FreeGate::Enter() {
  absl::MutexLock lock(&mu_);
  ++waits_;
}

void FreeGate::Leave() {
  bool opened = false;
  {
    absl::MutexLock lock(&mu_);
    opened = --waits_ == 0;
  }
  if (opened) (void)DrainIfOpen();
}

bool FreeGate::BeginFree() {
  mu_.ReaderLock();
  if (waits_ == 0) return true;
  mu_.ReaderUnlock();
  return false;
}

void FreeGate::EndFree() { mu_.ReaderUnlock(); }

bool FreeGate::open() const {
  absl::ReaderMutexLock lock(&mu_);
  return waits_ == 0;
}

void FreeGate::FreeOrDefer(Deferred free) noexcept {
  if (free.run == nullptr) return;
  if (BeginFree()) {
    free.run(free.data, free.arg);
    EndFree();
    return;
  }
  {
    absl::MutexLock lock(&list_mu_);
    // Capacity reserved up front: push_back never reallocates (no throw).
    if (deferred_.size() == deferred_.capacity()) {
      ++dropped_;
      return;
    }
    deferred_.push_back(free);
    deferred_bytes_ += free.bytes;
  }
  // The gate may have opened between the check and the push, after its
  // Leave drained: drain again, or the entry would wait for the next one.
  (void)DrainIfOpen();
}

size_t FreeGate::DrainIfOpen() noexcept {
  while (true) {
    // One at a time, each holding the gate: a wait queued meanwhile stops
    // the drain (the rest stays for the next opening).
    if (!BeginFree()) break;
    Deferred next;
    {
      absl::MutexLock lock(&list_mu_);
      if (deferred_.empty()) {
        EndFree();
        return 0;
      }
      next = deferred_.back();
      deferred_.pop_back();
      deferred_bytes_ -= next.bytes;
      ++ran_;
    }
    next.run(next.data, next.arg);
    EndFree();
  }
  absl::MutexLock lock(&list_mu_);
  return deferred_.size();
}

size_t FreeGate::deferred() const {
  absl::MutexLock lock(&list_mu_);
  return deferred_.size();
}
uint64_t FreeGate::deferred_bytes() const {
  absl::MutexLock lock(&list_mu_);
  return deferred_bytes_;
}
int64_t FreeGate::dropped() const {
  absl::MutexLock lock(&list_mu_);
  return dropped_;
}
int64_t FreeGate::ran_deferred() const {
  absl::MutexLock lock(&list_mu_);
  return ran_;
}

}  // namespace tokensel::core
