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
//    `max_cached_bytes`, the pool asks its gate's drainer to trim it
//    (FreeGate::RunOpenedHooksSoon: the opened hook below), never on the
//    releasing thread, which is the completion thread or a request thread
//    (the seventh review's item 7; a pool without a gate, in tests and
//    tools, trims at once). Until the trim, the idle bytes beyond the cap
//    are NOT charged while the gate is open (the second read of that
//    review, finding 2: charging them refused every other pool of the
//    account, all the devices' pinned pools for the host account, until
//    the drainer ran, with no client stuck): they are uncharged for as long
//    as the drainer is behind (its work runs only while the gate is open,
//    so it waits for bounded device work), as they were for the length of
//    the inline trim before. If the gate closes before the trim, the trim
//    cannot free and charges them instead, as below. The trim frees the other idle blocks, largest
//    first, until at most half of it is idle (hysteresis: trimming only to the cap
//    would free a block on every release of a load hovering at the cap, the
//    next wave would allocate it again, and cudaFree / cudaFreeHost
//    synchronize the whole device); the block just released goes too only
//    if it alone exceeds the cap (it is the current load's, the others sat
//    idle longer). Freed outside the lock (freeing device memory waits for
//    the device). A block must be idle when released (no device work still
//    using it).
//    Release never throws (it runs in destructors, while unwinding): it
//    allocates nothing; a trim takes the blocks to free one at a time under
//    the lock and frees them outside it, with no container to grow.
//    Acquire still trims on its own thread when the pool's account is over
//    its share (below) and the gate is open: that thread is about to
//    allocate anyway (cudaMalloc / cudaHostAlloc, as costly), and waiting
//    for the drainer would refuse the request instead.
//  - While the gate (FreeGate) is closed nothing is freed: idle blocks may
//    then exceed `max_cached_bytes`. Those bytes beyond the cap, which no
//    request pays for any more, are charged (by a Release that finds the
//    gate closed, or by the drainer's trim that finds it closed; with the
//    gate open only by a Release that saw it closed just before it
//    opened, and the trim already asked for settles that) to the
//    MemoryBudget given to
//    AttachBudget, on the account of the pool's device or, for pinned
//    pools, the host's (PoolWiringOf below; a
//    MemoryBudget::WeakCharge of the pool's own, grown past the bounds if
//    need be: the memory exists and cannot be returned now), and given back
//    as soon as they are freed or reused. Weak: a budget destroyed before
//    the pool (tests, tools) is not touched by the pool afterwards.
//    Count-and-cap, per device (memory_budget.h): a request reserves its
//    pooled bytes with MemoryBudget::Reservation::Grow, which counts the
//    requests' bytes only, so reusing a charged block never fails because
//    of a charge (the request takes it over: the charge shrinks); but while
//    the requests' bytes plus the charge of the pool's device (every pool
//    of it) are over the total, Acquire allocates no new block
//    (RESOURCE_EXHAUSTED, saying whether the gate is closed now or its
//    drainer has not trimmed yet: no other cause exists, a charge being a
//    closed gate's), and every block a request allocates was reserved
//    by it first, so a closed gate cannot make the device's pools grow
//    beyond what the budget admits (plus the caps). Another device's charge
//    refuses nothing here.
//    When the gate opens, its drainer trims the pool (FreeGate's opened
//    hook, registered by the constructor): the charge goes back at once,
//    not at the pool's next Release, and the frees run on the drainer,
//    never on the thread that left the gate.
//    gated_allocations() counts the blocks allocated while it was closed
//    (sampled when the allocation is decided).
//  - Abandon(block): a block that device work may still use for ever (the
//    completion queue abandoned its item) is forgotten: never freed nor
//    reused, its Release node dropped; it stays counted in use (the stuck
//    work may still use it) and in abandoned().
// Bounds: blocks in use are at most twice what their users asked for (the
// callers count AllocationBytes in a MemoryBudget first), and idle blocks at
// most `max_cached_bytes` once the drainer trimmed after a Release while the
// gate is open (until then the bytes beyond the cap are uncharged: a
// transient overshoot of the budget, as long as the drainer is behind);
// while it is closed, the idle bytes beyond the cap are charged to the
// budget.
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
#include "common/mutex.h"
#include "server/core/free_gate.h"
#include "server/core/memory_budget.h"

namespace tokensel::backends {

// Whether pools may free now (server/core/free_gate.h): while a stream
// waits on a client's IPC event the pools sharing the gate do not trim.
using FreeGate = core::FreeGate;

// Which gate and which charge account a device backend's pool of `kind`
// on device `ordinal` uses (CudaBackend wires its pools with it; tests build
// the same wiring without a device). Device pools: the device's gate and
// account. Pinned host pools: the host gate (cudaFreeHost may synchronize
// any context, free_gate.h) and the HOST account (memory_budget.h), never
// the device's: the host gate is closed by a stuck client on any device, and
// a pinned charge on device j's account would refuse j's device blocks
// because of device k's client (the seventh review's item 1).
enum class PoolKind { kDevice, kPinnedHost };
struct PoolWiring {
  FreeGate* gate;
  int account;  // an ordinal, or MemoryBudget::kHostAccount
};
// May throw std::bad_alloc (the gate is made on first use).
PoolWiring PoolWiringOf(PoolKind kind, int ordinal);

class BlockPool {
 public:
  struct Block {
    void* data = nullptr;
    size_t bytes = 0;
  };
  using AllocateFn = std::function<absl::StatusOr<void*>(size_t bytes)>;
  using FreeFn = std::function<void(void* data)>;

  // `granule` > 0. `gate` (may be null: always open) must outlive the pool;
  // the pool registers an opened hook there (may throw: std::bad_alloc,
  // std::system_error).
  BlockPool(std::string name, size_t granule, size_t max_cached_bytes, AllocateFn allocate,
            FreeFn free, FreeGate* gate = nullptr);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // The size of the block Acquire(bytes) allocates; SIZE_MAX when it would wrap.
  size_t AllocationBytes(size_t bytes) const;
  absl::StatusOr<Block> Acquire(size_t bytes);
  void Release(Block block) noexcept;
  // Forgets a block handed out by Acquire (see above). Never throws.
  void Abandon(Block block) noexcept;
  // The budget that pays for idle bytes beyond the cap, on the account of
  // device `ordinal` (the pool's; see above), or the host's for
  // MemoryBudget::kHostAccount (pinned pools: PoolWiringOf); null: none
  // (tests, tools). Call before the pool is used; the charge is weak (see
  // above).
  void AttachBudget(core::MemoryBudget* budget, int ordinal);

  size_t max_cached_bytes() const { return max_cached_bytes_; }
  // Statistics (tests, diagnostics): allocations made so far, blocks freed
  // by trimming so far, idle blocks and their bytes, blocks handed out and
  // not yet released.
  int64_t allocations() const;
  int64_t frees() const;
  size_t cached_blocks() const;
  size_t cached_bytes() const;
  size_t blocks_in_use() const;
  uint64_t charged_bytes() const;  // idle bytes beyond the cap, charged
  int64_t gated_allocations() const;
  int64_t abandoned() const;
  size_t spare_nodes() const;  // Release nodes held for blocks in use

 private:
  const std::string name_;
  const size_t granule_;
  const size_t max_cached_bytes_;
  const AllocateFn allocate_;
  const FreeFn free_;
  FreeGate* const gate_;
  mutable tokensel::Mutex mu_;  // not absl::Mutex: ThreadSanitizer sees this one (common/mutex.h)
  std::multimap<size_t, void*> idle_ ABSL_GUARDED_BY(mu_);  // bytes -> block
  // One map node per block in use, made by Acquire (which may throw), so
  // that Release moves a node into idle_ instead of allocating one.
  std::multimap<size_t, void*> spare_nodes_ ABSL_GUARDED_BY(mu_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t frees_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t gated_allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t abandoned_ ABSL_GUARDED_BY(mu_) = 0;
  core::MemoryBudget::WeakCharge excess_ ABSL_GUARDED_BY(mu_);
  uint64_t opened_hook_ = 0;  // the gate's id for TrimOnOpen
  // The block whose Release went over the cap: TrimOnOpen frees it last
  // (a pointer compared only, never dereferenced).
  void* keep_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Pops the next block to trim (largest first, never `keep`) while idle
  // bytes exceed `target`; null when none.
  void* PopForTrimLocked(size_t target, void* keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees idle blocks (never `keep` unless it alone exceeds the cap) down
  // to `low_water`, then settles the charge; the caller holds the gate.
  void TrimHeld(size_t low_water, void* keep) noexcept;
  // The gate's opened hook: trims the charged excess (on its drainer),
  // after the gate opened or a Release went over the cap.
  void TrimOnOpen() noexcept;
  // The idle bytes beyond the cap.
  size_t ExcessLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // excess_ = ExcessLocked(): only for a closed gate (see above).
  void ChargeExcessLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // excess_ = min(excess_, ExcessLocked()): blocks reused or freed give
  // their charge back; never charges.
  void ShrinkChargeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_BLOCK_POOL_H_
