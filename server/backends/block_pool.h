// BlockPool: a cache of memory blocks of one kind (device workspaces, device
// staging, pinned host staging: CudaBackend has one of each per device), so
// the steady state allocates nothing. Allocation and freeing are the
// caller's functions (cudaMalloc / cudaHostAlloc in the backend, counting
// fakes in tests): the pool itself touches no device and is tested without
// one (tests/server/backends/block_pool_test.cc).
//
//  - Acquire(bytes): the smallest cached block of at least `bytes`, unless it
//    is more than twice AllocationBytes(bytes) (a small request must not hold
//    on to a large block while the next large one allocates another); else a
//    new block of AllocationBytes(bytes): `bytes` rounded up to the granule,
//    at least one granule (a block is never null), RESOURCE_EXHAUSTED naming
//    the pool when that would wrap. An allocation error is returned as is.
//  - Release(block): cached for reuse; then, if the idle bytes exceed
//    `max_cached_bytes`, the other idle blocks are freed, largest first,
//    until at most half of it is idle (hysteresis: trimming only to the cap
//    would free a block on every release of a load hovering at the cap, the
//    next wave would allocate it again, and cudaFree / cudaFreeHost
//    synchronize the whole device); the block just released goes too only
//    if it alone exceeds the cap (it is the current load's, the others sat
//    idle longer). Freed outside the lock (freeing device memory waits for
//    the device). A block must be idle when released (no device work still
//    using it).
// Bounds: blocks in use are at most twice what their users asked for (the
// callers count AllocationBytes in a MemoryBudget first), and idle blocks at
// most `max_cached_bytes` after every Release.
//
// Thread-safe. The destructor frees the idle blocks; every block must have
// been released by then.
#ifndef TOKENSEL_SERVER_BACKENDS_BLOCK_POOL_H_
#define TOKENSEL_SERVER_BACKENDS_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tokensel::backends {

// Whether pools may free now. On CUDA, cudaFree / cudaFreeHost synchronize
// the whole device: while a stream of the device waits on a client's IPC
// event (stream_chain.h), which may never complete, a free would block its
// thread (a request's, or the completion thread) for as long. Enter() before
// such a wait is queued and Leave() once the stream is back in its pool;
// the pools sharing the gate trim only while no wait is registered, and a
// free in progress finishes before a wait is queued (Enter waits for it).
// Meanwhile a pool keeps its idle blocks beyond its cap: they are returned
// by a later Release, once the gate is open again.
class FreeGate {
 public:
  void Enter() {
    absl::MutexLock lock(&mu_);
    ++waits_;
  }
  void Leave() {
    absl::MutexLock lock(&mu_);
    --waits_;
  }
  // True (holding the gate until EndFree) when no wait is registered.
  bool BeginFree() ABSL_SHARED_TRYLOCK_FUNCTION(true, mu_) {
    mu_.ReaderLock();
    if (waits_ == 0) return true;
    mu_.ReaderUnlock();
    return false;
  }
  void EndFree() ABSL_UNLOCK_FUNCTION(mu_) { mu_.ReaderUnlock(); }
  bool open() const {
    absl::ReaderMutexLock lock(&mu_);
    return waits_ == 0;
  }

 private:
  mutable absl::Mutex mu_;
  int waits_ ABSL_GUARDED_BY(mu_) = 0;
};

class BlockPool {
 public:
  struct Block {
    void* data = nullptr;
    size_t bytes = 0;
  };
  using AllocateFn = std::function<absl::StatusOr<void*>(size_t bytes)>;
  using FreeFn = std::function<void(void* data)>;

  // `granule` > 0. `gate` (may be null: always open) must outlive the pool.
  BlockPool(std::string name, size_t granule, size_t max_cached_bytes, AllocateFn allocate,
            FreeFn free, FreeGate* gate = nullptr);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // The size of the block Acquire(bytes) allocates; SIZE_MAX when it would wrap.
  size_t AllocationBytes(size_t bytes) const;
  absl::StatusOr<Block> Acquire(size_t bytes);
  void Release(Block block);

  size_t max_cached_bytes() const { return max_cached_bytes_; }
  // Statistics (tests, diagnostics): allocations made so far, blocks freed
  // by trimming so far, idle blocks and their bytes, blocks handed out and
  // not yet released.
  int64_t allocations() const;
  int64_t frees() const;
  size_t cached_blocks() const;
  size_t cached_bytes() const;
  size_t blocks_in_use() const;

 private:
  const std::string name_;
  const size_t granule_;
  const size_t max_cached_bytes_;
  const AllocateFn allocate_;
  const FreeFn free_;
  FreeGate* const gate_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, void*> idle_ ABSL_GUARDED_BY(mu_);  // bytes -> block
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t frees_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_BLOCK_POOL_H_
