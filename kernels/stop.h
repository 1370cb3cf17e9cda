// Cooperative stop: how a long op learns that its caller gave up (the client
// cancelled, or its deadline passed) and ends early.
//
// The server wraps an op in a ScopedStopToken; the CPU kernels consult the
// calling thread's token between chunks of work (ParallelFor checks it
// before every chunk and carries it to the pool's threads) and return its
// status. A stopped op may have written part of its outputs: that happens
// only on a stop, never on an error.
//
//   ScopedStopToken scope(&token);     // this thread, until scope ends
//   RETURN_IF_ERROR(CheckStop());      // OK, or why to stop
#ifndef TOKENSEL_KERNELS_STOP_H_
#define TOKENSEL_KERNELS_STOP_H_

#include "absl/status/status.h"

namespace tokensel::kernels {

class StopToken {
 public:
  virtual ~StopToken() = default;
  // OK while the op may go on; CANCELLED or DEADLINE_EXCEEDED (with a
  // message) once it must stop, and from then on. Called concurrently from
  // the pool's threads, once per chunk: keep it cheap (tens of ns).
  virtual absl::Status Check() const = 0;
};

// Installs `token` (may be null: never stops) as the calling thread's
// current token until destroyed; restores the previous one.
class ScopedStopToken {
 public:
  explicit ScopedStopToken(const StopToken* token);
  ~ScopedStopToken();
  ScopedStopToken(const ScopedStopToken&) = delete;
  ScopedStopToken& operator=(const ScopedStopToken&) = delete;

 private:
  const StopToken* const previous_;
};

// The calling thread's current token, or null.
const StopToken* CurrentStopToken();

// CurrentStopToken()->Check(), or OK without a token.
absl::Status CheckStop();

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_STOP_H_
