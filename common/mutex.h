// tokensel::Mutex: the lock of the server core (registry, sessions,
// admission, metrics).
//
//   tokensel::Mutex mu_;
//   int n_ ABSL_GUARDED_BY(mu_);
//   { tokensel::MutexLock lock(&mu_); ++n_; }
//   { tokensel::ReaderMutexLock lock(&mu_); return n_; }
//   mu_.AwaitWithTimeout([&] { return n_ == 0; }, absl::Seconds(1));  // mu_ held
//
// The subset of absl::Mutex the core uses, with the same thread-safety
// annotations, built on std::shared_mutex and std::condition_variable_any,
// i.e. on pthread primitives. Why not absl::Mutex: Debian's abseil is not
// built with -fsanitize=thread, and absl::Mutex synchronizes with its own
// atomics and futexes inside that library, so ThreadSanitizer sees none of
// its happens-before edges and reports every guarded access as a race.
// pthread locks are intercepted by TSan whatever library calls them, so with
// this type the core's concurrency tests run under TSan (docs/reliability.md).
//
// Thread-safe. Not reentrant. AwaitWithTimeout must be called with the lock
// held exclusively; it releases it while waiting, like absl::Mutex's.
#ifndef TOKENSEL_COMMON_MUTEX_H_
#define TOKENSEL_COMMON_MUTEX_H_

#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace tokensel {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Read under the lock: a waiter registers itself before releasing it.
    const bool wake = waiters_ > 0;
    mu_.unlock();
    if (wake) cv_.notify_all();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

  // Releases the lock until `condition()` holds (re-checked with the lock
  // held after every exclusive Unlock by another thread) or `timeout` passes;
  // returns with the lock held and the final value of `condition()`.
  template <typename Condition>
  bool AwaitWithTimeout(Condition condition, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    ++waiters_;
    std::unique_lock<std::shared_mutex> lock(mu_, std::adopt_lock);
    bool met = true;
    if (timeout == absl::InfiniteDuration()) {
      cv_.wait(lock, condition);
    } else {
      met = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), condition);
    }
    lock.release();  // still held: the caller's scope owns it
    --waiters_;
    return met;
  }

 private:
  std::shared_mutex mu_;
  std::condition_variable_any cv_;
  int waiters_ = 0;  // threads in AwaitWithTimeout (guarded by mu_)
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace tokensel

#endif  // TOKENSEL_COMMON_MUTEX_H_
