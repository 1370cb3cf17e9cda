// FreeGate: whether memory (and other device resources) may be freed now.
//
// On CUDA, cudaFree, cudaFreeHost, cudaIpcCloseMemHandle, cuMemUnmap /
// cuMemRelease and cudaStreamDestroy may synchronize the device. While a
// stream waits on a client's IPC event (server/backends/stream_chain.h),
// which the client may never record, such a call can block its thread for
// ever: a request's thread, or a backend's completion thread. So a stream
// Enter()s the gate before its wait on a client event is queued and
// Leave()s it once it is back in its pool; meanwhile nothing is freed:
//  - BlockPools (server/backends/block_pool.h) do not trim: their idle
//    blocks stay (beyond the cap, charged to the MemoryBudget: block_pool.h);
//  - every other synchronizing free or teardown goes through FreeOrDefer:
//    run at once while the gate is open (holding it, so that no wait is
//    queued while it runs), else put on the deferred list.
// The deferred list is drained when the gate opens, by the thread whose
// Leave opened it (a backend's completion thread: no stream then waits on
// a client event, so a free there waits for bounded device work only; a
// gRPC request thread never Leaves: its chains hand their stream to the
// completion thread), and by DrainIfOpen (a backend's shutdown). If stuck
// work was leaked at shutdown the gate never opens and the process exits
// with the deferred frees not run (the OS takes the memory back).
//
// The deferred list is bounded (kMaxDeferred entries, reserved when the
// gate is made) and counted (deferred(), deferred_bytes(): the bytes they
// will free; a caller whose memory was charged to a MemoryBudget keeps it
// charged until its free runs). An entry is trivially copyable, so
// deferring allocates nothing and FreeOrDefer never throws: it is called
// on release paths (destructors). Beyond the bound an entry is dropped
// (never run: the resource is leaked, counted in dropped()) rather than
// run now, which could block for ever. What defers (mapping teardown,
// streams beyond the pool's idle cap, the direct staging API's frees) is
// bounded by the buffer registry's and the stream pool's own bounds, far
// below kMaxDeferred.
//
// One gate per process (Process(): never destroyed, so a deferred free
// never runs after its gate is gone): cudaFree and the IPC teardown may
// synchronize more than their own device (not verified), and the mappers
// (server/memory) tear down mappings of any device. Tests make their own.
// Thread-safe.
#ifndef TOKENSEL_SERVER_CORE_FREE_GATE_H_
#define TOKENSEL_SERVER_CORE_FREE_GATE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tokensel::core {

class FreeGate {
 public:
  // A free to run once the gate is open: run(data, arg). `bytes`: the
  // memory it returns (0 for a teardown that returns none of ours).
  struct Deferred {
    void (*run)(void* data, intptr_t arg) = nullptr;
    void* data = nullptr;
    intptr_t arg = 0;
    uint64_t bytes = 0;
  };
  static constexpr size_t kMaxDeferred = 4096;

  FreeGate();             // reserves the deferred list (may throw std::bad_alloc)
  ~FreeGate() = default;  // deferred frees not run are dropped
  FreeGate(const FreeGate&) = delete;
  FreeGate& operator=(const FreeGate&) = delete;
  // The process's gate (made on first use, never destroyed).
  static FreeGate& Process();

  // A stream is about to wait on a client's event.
  void Enter();
  // That stream is back in its pool. If the gate opens, the deferred frees
  // run now, on this thread (see above).
  void Leave();
  // True (holding the gate until EndFree) when no wait is registered: then
  // the caller may free; a wait is queued only after EndFree.
  bool BeginFree() ABSL_SHARED_TRYLOCK_FUNCTION(true, mu_);
  void EndFree() ABSL_UNLOCK_FUNCTION(mu_);
  bool open() const;

  // Runs `free` now while the gate is open, else defers it (see above).
  void FreeOrDefer(Deferred free) noexcept;
  // Runs the deferred frees while the gate is open (shutdown); returns how
  // many are left (the gate closed meanwhile, or never opened).
  size_t DrainIfOpen() noexcept;

  // Statistics: deferred frees waiting and the bytes they will free; frees
  // dropped because the list was full; deferred frees run so far.
  size_t deferred() const;
  uint64_t deferred_bytes() const;
  int64_t dropped() const;
  int64_t ran_deferred() const;

 private:
  mutable absl::Mutex mu_;
  int waits_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Mutex list_mu_;  // after mu_ (FreeOrDefer holds neither when it runs)
  std::vector<Deferred> deferred_ ABSL_GUARDED_BY(list_mu_);
  uint64_t deferred_bytes_ ABSL_GUARDED_BY(list_mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(list_mu_) = 0;
  int64_t ran_ ABSL_GUARDED_BY(list_mu_) = 0;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_FREE_GATE_H_
