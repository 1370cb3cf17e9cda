// The BlockPool's charge of idle bytes beyond its cap while its FreeGate is
// closed (block_pool.h): paid by the MemoryBudget, on the pool's device's
// account (more in block_pool_share_test.cc), weakly (a budget that
// ends first is not touched); abandoned blocks; the gated statistic.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "absl/time/time.h"
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

TEST(BlockPoolTest, IdleBytesBeyondTheCapAreChargedToTheBudgetWhileTheGateIsClosed) {
  FreeGate gate;
  MemoryBudget budget(size_t{1} << 20, size_t{1} << 20, nullptr);
  CountingPool p("pool", 1024, 8192, nullptr, &gate);
  p.pool.AttachBudget(&budget, 0);
  gate.Enter();
  std::vector<BlockPool::Block> blocks;
  for (size_t kb : {4, 8, 16}) blocks.push_back(*p.pool.Acquire(kb * 1024));
  EXPECT_EQ(p.pool.gated_allocations(), 3);
  for (const BlockPool::Block& b : blocks) p.pool.Release(b);
  EXPECT_EQ(p.frees, 0);
  // 28 KiB idle, 8 KiB cap: 20 KiB no request pays for, charged.
  EXPECT_EQ(p.pool.cached_bytes(), size_t{28} << 10);
  EXPECT_EQ(p.pool.charged_bytes(), uint64_t{20} << 10);
  EXPECT_EQ(budget.used_bytes(), uint64_t{20} << 10);
  EXPECT_EQ(budget.charged_bytes(0), uint64_t{20} << 10);
  // The requests' bytes do not see it (memory_budget.h); a new block on
  // the device does: the requests' bytes plus its charge would pass the
  // total.
  MemoryBudget::Reservation r = budget.Open();
  ASSERT_OK(r.Grow((uint64_t{1} << 20) - (uint64_t{16} << 10), "staging for x"));
  EXPECT_THAT(p.pool.Acquire(32 << 10).status(),
              StatusIs(StatusCode::kResourceExhausted, "over the server's memory budget total"));
  r = MemoryBudget::Reservation();
  // A reused block is the request's again: the charge shrinks.
  absl::StatusOr<BlockPool::Block> again = p.pool.Acquire(16 << 10);
  ASSERT_OK(again);
  EXPECT_EQ(p.pool.charged_bytes(), uint64_t{4} << 10);
  p.pool.Release(*again);
  EXPECT_EQ(budget.used_bytes(), uint64_t{20} << 10);
  // The gate opens: its opened hook trims on the drainer, and the charge
  // goes.
  gate.Leave();
  again = p.pool.Acquire(1024);
  ASSERT_OK(again);
  p.pool.Release(*again);
  ASSERT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);  // the drainer trims (not Release)
  EXPECT_GT(p.pool.frees(), 0);
  EXPECT_LE(p.pool.cached_bytes(), p.pool.max_cached_bytes());
  EXPECT_EQ(p.pool.charged_bytes(), 0u);
  EXPECT_EQ(budget.used_bytes(), 0u);
}

TEST(BlockPoolTest, AChargeBeyondTheTotalRefusesNewBlocksOnItsDeviceUntilFreed) {
  FreeGate gate;
  MemoryBudget budget(16 << 10, 16 << 10, nullptr);
  CountingPool p("pool", 1024, 0, nullptr, &gate);
  p.pool.AttachBudget(&budget, 0);
  gate.Enter();
  absl::StatusOr<BlockPool::Block> b = p.pool.Acquire(32 << 10);
  ASSERT_OK(b);
  p.pool.Release(*b);
  // Beyond the total (the memory exists): no new block on the device; a
  // request's own bytes are still granted.
  EXPECT_EQ(budget.used_bytes(), uint64_t{32} << 10);
  MemoryBudget::Reservation r = budget.Open();
  ASSERT_OK(r.Grow(1024, "staging for x"));
  EXPECT_THAT(p.pool.Acquire(1024).status(),
              StatusIs(StatusCode::kResourceExhausted, "--memory_budget_bytes"));
  gate.Leave();
  b = p.pool.Acquire(1024);  // the charged block is freed first (if the hook did not yet)
  ASSERT_OK(b);
  p.pool.Release(*b);
  ASSERT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);  // the drainer trims (not Release)
  EXPECT_EQ(budget.used_bytes(), 1024u);
  EXPECT_EQ(budget.charged_bytes(), 0u);
  // Detached: nothing stays charged to a budget about to end.
  p.pool.AttachBudget(nullptr, 0);
}

// The review's item 2: a request whose pooled bytes would reuse an idle
// block the pool charged takes over its charge: its reservation does not
// count the pools' charges (none does since the per-device shares,
// memory_budget.h), so the reuse never fails because of them; a NEW block
// is still refused while the requests' bytes plus the device's charge are
// over the total (count-and-cap).
TEST(BlockPoolTest, ReusingAChargedBlockTakesOverItsCharge) {
  FreeGate gate;
  MemoryBudget budget(16 << 10, 16 << 10, nullptr);
  CountingPool p("pool", 1024, 0, nullptr, &gate);
  p.pool.AttachBudget(&budget, 0);
  gate.Enter();
  absl::StatusOr<BlockPool::Block> b = p.pool.Acquire(8 << 10);
  ASSERT_OK(b);
  p.pool.Release(*b);
  EXPECT_EQ(p.pool.charged_bytes(), uint64_t{8} << 10);
  MemoryBudget::Reservation r = budget.Open();
  ASSERT_OK(r.Grow(12 << 10, "staging for x"));
  EXPECT_EQ(budget.used_bytes(), uint64_t{20} << 10);  // over the total until taken over
  // A new block now would pass the total: refused.
  EXPECT_THAT(p.pool.Acquire(12 << 10).status(),
              StatusIs(StatusCode::kResourceExhausted, "--memory_budget_bytes"));
  EXPECT_EQ(p.mallocs, 1);
  // The charged block is reused: its charge is the request's now.
  absl::StatusOr<BlockPool::Block> again = p.pool.Acquire(8 << 10);
  ASSERT_OK(again);
  EXPECT_EQ(again->data, b->data);
  EXPECT_EQ(p.pool.charged_bytes(), 0u);
  EXPECT_EQ(budget.used_bytes(), uint64_t{12} << 10);
  // Within the total again: a new block may be allocated.
  absl::StatusOr<BlockPool::Block> fresh = p.pool.Acquire(4 << 10);
  ASSERT_OK(fresh);
  p.pool.Release(*fresh);
  p.pool.Release(*again);
  r = MemoryBudget::Reservation();
  gate.Leave();
  absl::StatusOr<BlockPool::Block> last = p.pool.Acquire(1024);
  ASSERT_OK(last);
  p.pool.Release(*last);
  ASSERT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);  // the drainer trims (not Release)
  EXPECT_EQ(p.pool.charged_bytes(), 0u);
  EXPECT_EQ(budget.used_bytes(), 0u);
  p.pool.AttachBudget(nullptr, 0);
}

// The review's item 14: a pool that outlives its budget (tests, tools:
// never detached) does not touch it when it gives its charge back. The
// budget's storage is reused by another budget holding a request's bytes:
// the old pool giving its charge "back" would take them from that one.
TEST(BlockPoolTest, APoolThatOutlivesItsBudgetLeavesItAlone) {
  FreeGate gate;
  alignas(MemoryBudget) unsigned char storage[sizeof(MemoryBudget)];
  auto* budget = new (storage) MemoryBudget(1 << 20, 1 << 20, nullptr);
  {
    CountingPool p("pool", 1024, 0, nullptr, &gate);
    p.pool.AttachBudget(budget, 0);
    gate.Enter();
    absl::StatusOr<BlockPool::Block> b = p.pool.Acquire(4096);
    ASSERT_OK(b);
    p.pool.Release(*b);
    EXPECT_EQ(budget->used_bytes(), 4096u);  // charged
    budget->~MemoryBudget();                 // ends first, never detached
    budget = new (storage) MemoryBudget(1 << 20, 1 << 20, nullptr);
    MemoryBudget::Reservation request = budget->Open();
    ASSERT_OK(request.Grow(8192, "staging for x"));
    gate.Leave();
    b = p.pool.Acquire(4096);  // reused: the (old) charge would go back
    ASSERT_OK(b);
    p.pool.Release(*b);
    EXPECT_EQ(budget->used_bytes(), 8192u);
  }                                     // the pool ends: nothing given back either
  EXPECT_EQ(budget->used_bytes(), 0u);  // the request's reservation ended too
  budget->~MemoryBudget();
}

// The review's item 14: an abandoned block (its device work stuck for
// ever) is forgotten: no longer in use, never freed nor reused.
TEST(BlockPoolTest, AnAbandonedBlockIsForgotten) {
  CountingPool p("pool", 1024, 1 << 20);
  absl::StatusOr<BlockPool::Block> a = p.pool.Acquire(1024);
  absl::StatusOr<BlockPool::Block> b = p.pool.Acquire(1024);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(p.pool.blocks_in_use(), 2u);
  p.pool.Abandon(*a);
  EXPECT_EQ(p.pool.blocks_in_use(), 2u);  // its stuck work may still use it
  EXPECT_EQ(p.pool.abandoned(), 1);
  EXPECT_EQ(p.pool.spare_nodes(), 1u);  // b's only: a's Release never comes
  p.pool.Release(*b);
  EXPECT_EQ(p.pool.blocks_in_use(), 1u);
  EXPECT_EQ(p.pool.cached_blocks(), 1u);  // b only
  absl::StatusOr<BlockPool::Block> c = p.pool.Acquire(1024);
  ASSERT_OK(c);
  EXPECT_EQ(c->data, b->data);
  p.pool.Release(*c);
  std::free(a->data);  // the test's, not the pool's
  p.sizes.erase(a->data);
}

// The review's item 14: gated_allocations() says whether the gate was
// closed when the allocation was decided, not after a slow allocation.
TEST(BlockPoolTest, TheGatedStatisticIsSampledBeforeTheAllocation) {
  FreeGate gate;
  bool close_during = false;
  int frees = 0;
  BlockPool pool(
      "pool", 1024, 1 << 20,
      [&](size_t bytes) -> absl::StatusOr<void*> {
        if (close_during) gate.Enter();  // the gate closes meanwhile
        return std::malloc(bytes);
      },
      [&](void* p) {
        ++frees;
        std::free(p);
      },
      &gate);
  close_during = true;
  absl::StatusOr<BlockPool::Block> b = pool.Acquire(1024);
  ASSERT_OK(b);
  EXPECT_EQ(pool.gated_allocations(), 0);
  close_during = false;
  absl::StatusOr<BlockPool::Block> c = pool.Acquire(4096);  // closed now
  ASSERT_OK(c);
  EXPECT_EQ(pool.gated_allocations(), 1);
  gate.Leave();
  pool.Release(*b);
  pool.Release(*c);
}

}  // namespace
}  // namespace tokensel::testing
