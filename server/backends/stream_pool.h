// StreamPool: the pooled streams of a device backend (CudaBackend), written
// against two functions (create, destroy) so that its sizing is tested
// without a device (tests/server/backends/stream_pool_test.cc).
//
//  - Acquire: an idle stream, else a new one (create's error otherwise).
//    It may throw std::bad_alloc, holding nothing then.
//  - Release(stream): back to the idle list; if `max_idle` streams are idle
//    already, the stream is destroyed instead, at once: cudaStreamDestroy
//    returns immediately even with work pending (the runtime releases the
//    stream when its work completes), so it never waits on a client's
//    event and needs no FreeGate. Without the cap a burst of N concurrent
//    requests left N streams for ever. A stream is released only once it
//    has no work left (a lease drains it, the completion queue releases it
//    after its completion event).
//    Never throws (it runs in destructors): the idle list's capacity is
//    kept at least the number of streams, reserved in Acquire.
//  - Init(n): creates n streams up front; if one fails, the streams made
//    so far are destroyed and the pool is as before.
//  - DestroyIdle: the backend's shutdown destroys the idle streams directly
//    (every stream must be back by then).
// Thread-safe.
#ifndef TOKENSEL_SERVER_BACKENDS_STREAM_POOL_H_
#define TOKENSEL_SERVER_BACKENDS_STREAM_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace tokensel::backends {

class StreamPool {
 public:
  using Stream = void*;  // cudaStream_t
  using CreateFn = std::function<absl::StatusOr<Stream>()>;
  // destroy(stream, destroy_arg); never throws.
  using DestroyFn = void (*)(void* stream, intptr_t arg);

  // `max_idle` >= 1.
  StreamPool(size_t max_idle, CreateFn create, DestroyFn destroy, intptr_t destroy_arg);
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  // Creates `n` idle streams up front (at most max_idle stay idle); on a
  // failure none of them stays (see above).
  absl::Status Init(int n);
  absl::StatusOr<Stream> Acquire();
  void Release(Stream stream) noexcept;
  // Destroys the idle streams now (shutdown: no gate, no deferral); returns
  // how many streams are still out.
  size_t DestroyIdle();

  size_t max_idle() const { return max_idle_; }
  size_t idle() const;
  size_t live() const;  // created and not destroyed
  int64_t created() const;
  int64_t destroyed() const;  // beyond the cap, or by a failed Init

 private:
  const size_t max_idle_;
  const CreateFn create_;
  const DestroyFn destroy_;
  const intptr_t destroy_arg_;
  mutable tokensel::Mutex mu_;  // not absl::Mutex: ThreadSanitizer sees this one (common/mutex.h)
  std::vector<Stream> idle_ ABSL_GUARDED_BY(mu_);  // capacity >= live_
  size_t live_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t created_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t destroyed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_STREAM_POOL_H_
