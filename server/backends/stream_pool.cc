// StreamPool (contract: stream_pool.h).
#include "server/backends/stream_pool.h"

#include <algorithm>
#include <utility>

namespace tokensel::backends {

StreamPool::StreamPool(size_t max_idle, CreateFn create, DestroyFn destroy, intptr_t destroy_arg)
    : max_idle_(std::max<size_t>(max_idle, 1)),
      create_(std::move(create)),
      destroy_(destroy),
      destroy_arg_(destroy_arg) {}

absl::Status StreamPool::Init(int n) {
  std::vector<Stream> made;
  made.reserve(static_cast<size_t>(std::max(n, 0)));
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<Stream> s = Acquire();
    if (!s.ok()) {
      // None of them stays: each was counted in live_ and would be neither
      // idle nor ever released (the review's item 15).
      for (Stream m : made) {
        {
          tokensel::MutexLock lock(&mu_);
          --live_;
          ++destroyed_;
        }
        destroy_(m, destroy_arg_);
      }
      return s.status();
    }
    made.push_back(*s);  // reserved: no allocation
  }
  for (Stream s : made) Release(s);
  return absl::OkStatus();
}

absl::StatusOr<StreamPool::Stream> StreamPool::Acquire() {
  {
    tokensel::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      const Stream s = idle_.back();
      idle_.pop_back();
      return s;
    }
    // Room in the idle list for the stream about to be made, before it is
    // made: Release then never reallocates. If this throws nothing is held.
    if (idle_.capacity() < live_ + 1) idle_.reserve(std::max<size_t>(8, 2 * (live_ + 1)));
    ++live_;  // counted before it exists: the reserve above covers it
  }
  absl::StatusOr<Stream> s = create_();
  tokensel::MutexLock lock(&mu_);
  if (!s.ok()) {
    --live_;
    return s.status();
  }
  ++created_;
  return *s;
}

void StreamPool::Release(Stream stream) noexcept {
  {
    tokensel::MutexLock lock(&mu_);
    if (idle_.size() < max_idle_) {
      idle_.push_back(stream);  // capacity >= live_ > idle_.size(): no allocation
      return;
    }
    --live_;
    ++destroyed_;
  }
  // Beyond the cap: destroyed now. cudaStreamDestroy returns at once even
  // with work pending (stream_pool.h): no FreeGate.
  destroy_(stream, destroy_arg_);
}

size_t StreamPool::DestroyIdle() {
  tokensel::MutexLock lock(&mu_);
  for (Stream s : idle_) destroy_(s, destroy_arg_);
  live_ -= idle_.size();
  idle_.clear();
  return live_;
}

size_t StreamPool::idle() const {
  tokensel::MutexLock lock(&mu_);
  return idle_.size();
}
size_t StreamPool::live() const {
  tokensel::MutexLock lock(&mu_);
  return live_;
}
int64_t StreamPool::created() const {
  tokensel::MutexLock lock(&mu_);
  return created_;
}
int64_t StreamPool::destroyed() const {
  tokensel::MutexLock lock(&mu_);
  return destroyed_;
}

}  // namespace tokensel::backends
