// Cooperative stop of operators (client cancellation, deadlines): how a long
// op learns that its caller gave up and ends early. Backend-neutral: the
// server's executor installs the token; the CPU kernels (kernels/cpu) poll it
// between chunks of work, other backends between launches.
//
// The caller of an op installs a StopToken for its thread with
// ScopedStopToken; the op and the thread pool poll it with CheckStop():
//  - ParallelFor (thread_pool.h) captures the calling thread's token at entry
//    and checks it before every chunk, on whichever thread runs the chunk;
//    once a check fails no further chunk of that call starts (chunks already
//    running finish), and the failure is latched into the caller's scope.
//  - Every operator calls CheckStop() after each parallel phase whose results
//    later code relies on (validation passes above all) and returns its error
//    before using them, so a stopped op never writes based on a partial
//    validation. Long serial loops check about every 64K elements.
//
// Latching: once a check fails in a scope (the caller's, or a chunk's, which
// hands it on to the caller when the ParallelFor returns), every later
// CheckStop() in that scope returns the same error without asking the token
// again. A token whose Check() went back to OK could otherwise let an op use
// the results of a phase whose chunks were skipped.
//
// Threading: StopToken::Check() is called concurrently from the pool's
// threads. ScopedStopToken and CheckStop() act on the calling thread only.
#ifndef TOKENSEL_KERNELS_STOP_H_
#define TOKENSEL_KERNELS_STOP_H_

#include "absl/status/status.h"

namespace tokensel::kernels {

class StopToken {
 public:
  virtual ~StopToken() = default;
  // OK while the op may go on; CANCELLED / DEADLINE_EXCEEDED (with a message)
  // once it must stop. Called concurrently from the pool's threads; must be
  // cheap (~tens of ns) and should stay non-OK once it was non-OK.
  virtual absl::Status Check() const = 0;
};

namespace stop_internal {

// The calling thread's current token and what it has latched.
struct StopScope {
  const StopToken* token = nullptr;
  absl::Status stopped;  // the first failed check in this scope; OK until then
};

// The calling thread's innermost scope, or null.
StopScope* CurrentStopScope();

// Installs `scope` as the calling thread's innermost scope; returns the
// previous one (restore it with SwapStopScope(previous)).
StopScope* SwapStopScope(StopScope* scope);

// Records `status` (non-OK) in `scope` unless it already holds an error.
void LatchStop(StopScope* scope, const absl::Status& status);

// CheckStop() against `scope` (may be null: OK).
absl::Status CheckStopIn(StopScope* scope);

}  // namespace stop_internal

// Installs `token` (may be null: nothing to check) as the calling thread's
// current token for the lifetime of this object; restores the previous one.
// Scopes nest; destroy them in reverse order of creation, on the same thread.
class ScopedStopToken {
 public:
  explicit ScopedStopToken(const StopToken* token);
  ~ScopedStopToken();
  ScopedStopToken(const ScopedStopToken&) = delete;
  ScopedStopToken& operator=(const ScopedStopToken&) = delete;

  // What this scope latched: OK, or the first failed check.
  const absl::Status& stopped() const { return scope_.stopped; }

 private:
  stop_internal::StopScope scope_;
  stop_internal::StopScope* previous_;
};

// The calling thread's current token's Check() (OK when there is none), or
// the error already latched in the current scope.
inline absl::Status CheckStop() {
  return stop_internal::CheckStopIn(stop_internal::CurrentStopScope());
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_STOP_H_
