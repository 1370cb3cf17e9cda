// The pools' charges are per device (memory_budget.h, block_pool.h): a pool
// kept from trimming by a stuck client wait on its device charges that
// device's share only, so it refuses nothing on another device nor a
// request's own bytes (a reply's inline results); and a gate that opens
// gives its pools' charges back at once, on the gate's drainer (the fifth
// review's items "charges are global" and "charges are not released when a
// gate opens").
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/block_pool.h"
#include "server/core/free_gate.h"
#include "server/core/memory_budget.h"
#include "tests/server/backends/counting_pool.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using backends::BlockPool;
using core::FreeGate;
using core::MemoryBudget;

constexpr uint64_t kKiB = 1024;

// A request on the pool: reserves the block's bytes first (as the executor
// does), then takes a block and gives it back; the reservation ends.
absl::Status UseOnce(MemoryBudget& budget, BlockPool& pool, size_t bytes) {
  MemoryBudget::Reservation r = budget.Open();
  absl::Status s = r.Grow(pool.AllocationBytes(bytes), "staging for x");
  if (!s.ok()) return s;
  absl::StatusOr<BlockPool::Block> b = pool.Acquire(bytes);
  if (!b.ok()) return b.status();
  pool.Release(*b);
  return absl::OkStatus();
}

// Device k's client is stuck (its gate closed): requests of growing sizes
// there each leave a block idle beyond the cap, charged to k. Device j, the
// CPU path's inline results: nothing of k's charge refuses them. k's own
// growth stops at its share: its pools allocate a new block only while the
// requests' bytes plus k's charge are within the total.
TEST(BlockPoolShareTest, AChargedPoolOnOneDeviceRefusesNothingOnAnother) {
  FreeGate gate_k;
  FreeGate gate_j;
  MemoryBudget budget(64 * kKiB, 64 * kKiB, nullptr);
  CountingPool k("k", 1024, 0, nullptr, &gate_k);
  CountingPool j("j", 1024, 0, nullptr, &gate_j);
  k.pool.AttachBudget(&budget, 1);
  j.pool.AttachBudget(&budget, 0);
  gate_k.Enter();
  for (size_t kib : {8, 16, 32}) ASSERT_OK(UseOnce(budget, k.pool, kib * kKiB));
  EXPECT_EQ(k.pool.charged_bytes(), 56 * kKiB);
  EXPECT_EQ(budget.charged_bytes(1), 56 * kKiB);
  EXPECT_EQ(budget.charged_bytes(0), 0u);
  EXPECT_EQ(budget.request_bytes(), 0u);
  // k's share is used up: 48 KiB of requests + 56 KiB charged > 64 KiB.
  EXPECT_THAT(UseOnce(budget, k.pool, 48 * kKiB),
              StatusIs(StatusCode::kResourceExhausted, "over the server's memory budget total"));
  EXPECT_EQ(k.mallocs, 3);
  // A reused block is still fine there (the request takes its charge over).
  ASSERT_OK(UseOnce(budget, k.pool, 32 * kKiB));
  // Device j allocates a new block with the whole total, and the same
  // request's inline results fit too.
  MemoryBudget::Reservation r = budget.Open();
  ASSERT_OK(r.Grow(48 * kKiB, "staging for x"));
  absl::StatusOr<BlockPool::Block> b = j.pool.Acquire(48 * kKiB);
  ASSERT_OK(b);
  EXPECT_OK(r.Grow(16 * kKiB, "inline results"));
  // The requests alone stay bounded by the total.
  MemoryBudget::Reservation other = budget.Open();
  EXPECT_THAT(other.Grow(1, "inline results"),
              StatusIs(StatusCode::kResourceExhausted, "--memory_budget_bytes"));
  EXPECT_EQ(budget.request_bytes(), 64 * kKiB);
  // Bounds: each device's pools hold at most the total plus their caps (0):
  // k 56 KiB idle, j 48 KiB in use.
  EXPECT_LE(k.pool.cached_bytes() + k.pool.blocks_in_use(), budget.total_bytes());
  EXPECT_EQ(budget.used_bytes(), 64 * kKiB + 56 * kKiB);
  j.pool.Release(*b);
  r = MemoryBudget::Reservation();
  gate_k.Leave();
  k.pool.AttachBudget(nullptr, 1);
  j.pool.AttachBudget(nullptr, 0);
}

// Pools of one device share one charge account: the sum of their charges
// is what refuses a new block there.
TEST(BlockPoolShareTest, ThePoolsOfOneDeviceShareItsAccount) {
  FreeGate gate;
  MemoryBudget budget(64 * kKiB, 64 * kKiB, nullptr);
  CountingPool workspaces("workspaces", 1024, 0, nullptr, &gate);
  CountingPool staging("staging", 1024, 0, nullptr, &gate);
  workspaces.pool.AttachBudget(&budget, 3);
  staging.pool.AttachBudget(&budget, 3);
  gate.Enter();
  ASSERT_OK(UseOnce(budget, workspaces.pool, 40 * kKiB));
  EXPECT_EQ(budget.charged_bytes(3), 40 * kKiB);
  // 40 charged by the other pool of the device + 32 > 64: refused.
  EXPECT_THAT(UseOnce(budget, staging.pool, 32 * kKiB),
              StatusIs(StatusCode::kResourceExhausted, "over the server's memory budget total"));
  ASSERT_OK(UseOnce(budget, staging.pool, 24 * kKiB));  // 40 + 24 = 64: at the total
  EXPECT_EQ(budget.charged_bytes(3), 64 * kKiB);
  gate.Leave();
  workspaces.pool.AttachBudget(nullptr, 3);
  staging.pool.AttachBudget(nullptr, 3);
}

// The production wiring (PoolWiringOf, as CudaBackend wires its pools): a
// stuck client on device k closes k's gate and so the host gate; device j's
// pinned pool then cannot trim and charges its idle bytes beyond the cap.
// They go to the HOST account, so j's device pools still allocate with the
// whole total (the seventh review's item 1: they were charged to j's
// account, and j's device pools refused every new block although j's gate
// was open). What stays, unavoidably: new pinned blocks on every device are
// refused once the host account is full (no pinned free can run anywhere).
TEST(BlockPoolShareTest, AStuckDeviceFillsNoOtherDevicesAccountThroughItsPinnedPool) {
  constexpr int k = 41;  // ordinals no other test uses: the gates are the process's
  constexpr int j = 42;
  constexpr int other = 43;
  MemoryBudget budget(64 * kKiB, 64 * kKiB, nullptr);
  const backends::PoolWiring pinned_j = backends::PoolWiringOf(backends::PoolKind::kPinnedHost, j);
  const backends::PoolWiring pinned_o =
      backends::PoolWiringOf(backends::PoolKind::kPinnedHost, other);
  const backends::PoolWiring device_j = backends::PoolWiringOf(backends::PoolKind::kDevice, j);
  EXPECT_EQ(pinned_j.gate, &FreeGate::ForHost());
  EXPECT_EQ(device_j.gate, &FreeGate::ForDevice(j));
  CountingPool pinned("pinned j", 1024, 0, nullptr, pinned_j.gate);
  CountingPool pinned_other("pinned other", 1024, 0, nullptr, pinned_o.gate);
  CountingPool staging("staging j", 1024, 0, nullptr, device_j.gate);
  pinned.pool.AttachBudget(&budget, pinned_j.account);
  pinned_other.pool.AttachBudget(&budget, pinned_o.account);
  staging.pool.AttachBudget(&budget, device_j.account);
  FreeGate::ForDevice(k).Enter();  // k's client never records its event
  ASSERT_FALSE(FreeGate::ForHost().open());
  ASSERT_TRUE(FreeGate::ForDevice(j).open());
  // Client B on device j: inline tensors of growing sizes, each a new
  // pinned block that cannot be trimmed.
  for (size_t kib : {8, 16, 32}) ASSERT_OK(UseOnce(budget, pinned.pool, kib * kKiB));
  EXPECT_EQ(pinned.pool.charged_bytes(), 56 * kKiB);
  EXPECT_EQ(budget.charged_bytes(MemoryBudget::kHostAccount), 56 * kKiB);
  EXPECT_EQ(budget.charged_bytes(j), 0u);
  // j's device pool allocates a new block with the whole total (48 KiB of
  // requests + j's charge 0 <= 64 KiB).
  ASSERT_OK(UseOnce(budget, staging.pool, 48 * kKiB));
  EXPECT_EQ(staging.mallocs, 1);
  // The host account is full: a new pinned block of any device is refused.
  EXPECT_THAT(UseOnce(budget, pinned_other.pool, 48 * kKiB),
              StatusIs(StatusCode::kResourceExhausted, "over the server's memory budget total"));
  FreeGate::ForDevice(k).Leave();
  pinned.pool.AttachBudget(nullptr, pinned_j.account);
  pinned_other.pool.AttachBudget(nullptr, pinned_o.account);
  staging.pool.AttachBudget(nullptr, device_j.account);
}

// A gate that opens trims its pools' charged excess without any further
// call on the pool: on the gate's drainer, never on the thread that left
// the gate.
TEST(BlockPoolShareTest, OpeningTheGateGivesTheChargeBackAtOnce) {
  FreeGate gate;
  MemoryBudget budget(1 << 20, 1 << 20, nullptr);
  tokensel::Mutex mu;  // ThreadSanitizer sees it (common/mutex.h)
  std::vector<std::thread::id> freed_on;
  BlockPool pool(
      "pool", 1024, 4 * kKiB,
      [](size_t bytes) -> absl::StatusOr<void*> { return std::malloc(bytes); },
      [&](void* p) {
        tokensel::MutexLock lock(&mu);
        freed_on.push_back(std::this_thread::get_id());
        std::free(p);
      },
      &gate);
  pool.AttachBudget(&budget, 0);
  gate.Enter();
  std::vector<BlockPool::Block> blocks;
  for (size_t kib : {2, 8, 16}) blocks.push_back(*pool.Acquire(kib * kKiB));
  for (const BlockPool::Block& b : blocks) pool.Release(b);
  EXPECT_EQ(pool.charged_bytes(), 22 * kKiB);  // 26 KiB idle, 4 KiB cap
  EXPECT_EQ(budget.used_bytes(), 22 * kKiB);
  gate.Leave();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (pool.charged_bytes() != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(pool.charged_bytes(), 0u);
  EXPECT_EQ(budget.used_bytes(), 0u);
  EXPECT_LE(pool.cached_bytes(), pool.max_cached_bytes());
  tokensel::MutexLock lock(&mu);
  ASSERT_FALSE(freed_on.empty());
  for (const std::thread::id& id : freed_on) EXPECT_NE(id, std::this_thread::get_id());
}

// The seventh review's item 7: a Release over the cap (gate open) does not
// trim on the releasing thread (the completion thread or a request thread:
// a cudaFree there, or a cudaFreeHost that may wait for every device's
// kernels, held up everything behind it); it asks the gate's drainer,
// which frees. Until then the bytes beyond the cap are charged.
TEST(BlockPoolShareTest, AReleaseOverTheCapLeavesTheTrimToTheDrainer) {
  FreeGate gate;
  MemoryBudget budget(1 << 20, 1 << 20, nullptr);
  tokensel::Mutex mu;  // ThreadSanitizer sees it (common/mutex.h)
  std::vector<std::thread::id> freed_on;
  std::atomic<bool> releasing{false};
  std::atomic<int> freed_while_releasing{0};
  BlockPool pool(
      "pool", 1024, 4 * kKiB,
      [](size_t bytes) -> absl::StatusOr<void*> { return std::malloc(bytes); },
      [&](void* p) {
        if (releasing.load()) ++freed_while_releasing;
        tokensel::MutexLock lock(&mu);
        freed_on.push_back(std::this_thread::get_id());
        std::free(p);
      },
      &gate);
  pool.AttachBudget(&budget, 0);
  std::vector<BlockPool::Block> blocks;
  for (size_t kib : {2, 3, 8, 16}) blocks.push_back(*pool.Acquire(kib * kKiB));
  const std::thread::id self = std::this_thread::get_id();
  for (const BlockPool::Block& b : blocks) {
    releasing = true;
    pool.Release(b);
    releasing = false;
    tokensel::MutexLock lock(&mu);
    for (const std::thread::id& id : freed_on) ASSERT_NE(id, self) << "freed inside Release";
  }
  ASSERT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_GT(pool.frees(), 0);
  EXPECT_LE(pool.cached_bytes(), pool.max_cached_bytes());
  EXPECT_EQ(pool.charged_bytes(), 0u);
  EXPECT_EQ(budget.used_bytes(), 0u);
  tokensel::MutexLock lock(&mu);
  EXPECT_EQ(freed_on.size(), static_cast<size_t>(pool.frees()));
  for (const std::thread::id& id : freed_on) EXPECT_NE(id, self);
  pool.AttachBudget(nullptr, 0);
}

// Holds a gate's drainer inside an opened hook of its own until Let() (or
// its end): the hooks of the gate's pools wait behind it, as behind a slow
// cudaFreeHost of another device's pinned pool on the host gate's drainer.
class DrainerHold {
 public:
  explicit DrainerHold(FreeGate& gate) : gate_(gate) {
    id_ = gate_.AddOpenedHook([this] {
      {
        tokensel::MutexLock lock(&mu_);  // its Unlock wakes the constructor's wait
        running_ = true;
      }
      tokensel::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return let_; },
                           absl::InfiniteDuration());
    });
    gate_.RunOpenedHooksSoon();
    tokensel::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return running_; },
                         absl::InfiniteDuration());
  }
  ~DrainerHold() {
    Let();
    gate_.RemoveOpenedHook(id_);  // waits for the call in progress
  }
  void Let() {
    tokensel::MutexLock lock(&mu_);
    let_ = true;
  }

 private:
  FreeGate& gate_;
  uint64_t id_ = 0;
  tokensel::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool let_ ABSL_GUARDED_BY(mu_) = false;
};

// The second read of the seventh review, finding 2: a Release over the cap
// with the gate open charged the idle excess until the drainer trimmed, so
// every other pool of the account (all the devices' pinned pools share the
// host account) refused new blocks meanwhile, blaming a client's
// wait_event, although no gate was closed. With the gate open, a Release
// charges nothing (the trim is asked of the drainer, as before).
TEST(BlockPoolShareTest, AReleaseOverTheCapWithTheGateOpenRefusesNoOtherPoolOfTheAccount) {
  FreeGate gate;
  MemoryBudget budget(64 * kKiB, 64 * kKiB, nullptr);
  CountingPool a("a", 1024, 4 * kKiB, nullptr, &gate);
  CountingPool b("b", 1024, 4 * kKiB, nullptr, &gate);
  a.pool.AttachBudget(&budget, MemoryBudget::kHostAccount);
  b.pool.AttachBudget(&budget, MemoryBudget::kHostAccount);
  absl::StatusOr<BlockPool::Block> big = a.pool.Acquire(32 * kKiB);
  ASSERT_OK(big);
  {
    DrainerHold hold(gate);  // the trim cannot run yet
    a.pool.Release(*big);    // 32 KiB idle, 4 KiB cap: 28 KiB to trim
    EXPECT_EQ(a.frees, 0);
    EXPECT_EQ(a.pool.charged_bytes(), 0u) << "charged with the gate open";
    EXPECT_EQ(budget.charged_bytes(MemoryBudget::kHostAccount), 0u);
    // The requests' bytes near the total: 48 KiB + 28 KiB charged > 64 KiB.
    MemoryBudget::Reservation r = budget.Open();
    ASSERT_OK(r.Grow(48 * kKiB, "staging for x"));
    absl::StatusOr<BlockPool::Block> fresh = b.pool.Acquire(48 * kKiB);
    ASSERT_OK(fresh) << "another pool of the account refused while no gate was closed";
    b.pool.Release(*fresh);
  }
  ASSERT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_GT(a.frees, 0) << "the drainer trims once let go";
  EXPECT_LE(a.pool.cached_bytes(), a.pool.max_cached_bytes());
  EXPECT_EQ(budget.used_bytes(), 0u);
  a.pool.AttachBudget(nullptr, MemoryBudget::kHostAccount);
  b.pool.AttachBudget(nullptr, MemoryBudget::kHostAccount);
}

// The other half of that choice: the gate closes between a Release's check
// (open: nothing charged, the drainer asked) and the drainer's trim. The
// trim cannot free then (BeginFree fails), so it charges the excess, which
// from then on is held for a closed gate like any other; the opening trims
// it and gives the charge back. And a pool refused a new block while the
// gate is open again but the charge not trimmed yet says so, without
// blaming a wait still in progress.
TEST(BlockPoolShareTest, AGateClosedBeforeTheDrainersTrimChargesTheExcessThen) {
  FreeGate gate;
  MemoryBudget budget(64 * kKiB, 64 * kKiB, nullptr);
  CountingPool a("a", 1024, 4 * kKiB, nullptr, &gate);
  CountingPool b("b", 1024, 4 * kKiB, nullptr, &gate);
  a.pool.AttachBudget(&budget, 0);
  b.pool.AttachBudget(&budget, 0);
  absl::StatusOr<BlockPool::Block> big = a.pool.Acquire(32 * kKiB);
  ASSERT_OK(big);
  {
    DrainerHold hold(gate);
    a.pool.Release(*big);
    EXPECT_EQ(a.pool.charged_bytes(), 0u);
    gate.Enter();  // a stream waits on a client's event before the trim ran
  }
  ASSERT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_EQ(a.frees, 0);
  EXPECT_EQ(a.pool.charged_bytes(), 28 * kKiB) << "the closed gate's excess is not charged";
  MemoryBudget::Reservation r = budget.Open();
  ASSERT_OK(r.Grow(48 * kKiB, "staging for x"));
  EXPECT_THAT(b.pool.Acquire(48 * kKiB).status(),
              StatusIs(StatusCode::kResourceExhausted, "while a stream waits on a client's"));
  {
    // Open again, the trim not run yet: refused, naming the trim.
    DrainerHold hold(gate);
    gate.Leave();
    EXPECT_THAT(b.pool.Acquire(48 * kKiB).status(),
                StatusIs(StatusCode::kResourceExhausted, "not trimmed yet"));
  }
  ASSERT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_GT(a.frees, 0);
  EXPECT_EQ(a.pool.charged_bytes(), 0u);
  absl::StatusOr<BlockPool::Block> fresh = b.pool.Acquire(48 * kKiB);
  ASSERT_OK(fresh);
  b.pool.Release(*fresh);
  r = MemoryBudget::Reservation();
  a.pool.AttachBudget(nullptr, 0);
  b.pool.AttachBudget(nullptr, 0);
}

}  // namespace
}  // namespace tokensel::testing
