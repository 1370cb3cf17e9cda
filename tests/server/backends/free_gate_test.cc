// The FreeGate's deferred frees (server/core/free_gate.h), the StreamPool's
// idle cap (stream_pool.h) and the BlockPool's charge of idle bytes beyond
// its cap while the gate is closed (block_pool.h), without a device.
#include "server/core/free_gate.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/block_pool.h"
#include "server/backends/stream_pool.h"
#include "server/core/memory_budget.h"
#include "tests/server/backends/counting_pool.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using backends::BlockPool;
using backends::StreamPool;
using core::FreeGate;
using core::MemoryBudget;

// A Deferred function: counts its runs in the int64_t at `data`.
void Count(void* data, intptr_t /*arg*/) { ++*static_cast<int64_t*>(data); }

FreeGate::Deferred Counted(int64_t* runs, uint64_t bytes) {
  return FreeGate::Deferred{&Count, runs, 0, bytes};
}

TEST(FreeGateTest, DefersWhileClosedAndDrainsWhenTheLastWaitLeaves) {
  FreeGate gate;
  int64_t runs = 0;
  gate.FreeOrDefer(Counted(&runs, 10));  // open: at once
  EXPECT_EQ(runs, 1);
  gate.Enter();
  gate.Enter();
  for (uint64_t bytes : {1, 2, 3}) gate.FreeOrDefer(Counted(&runs, bytes));
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(gate.deferred(), 3u);
  EXPECT_EQ(gate.deferred_bytes(), 6u);
  EXPECT_EQ(gate.DrainIfOpen(), 3u);  // closed: nothing runs
  gate.Leave();                       // one wait still there
  EXPECT_EQ(runs, 1);
  gate.Leave();  // open: the leaving thread drains
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(gate.deferred(), 0u);
  EXPECT_EQ(gate.deferred_bytes(), 0u);
  EXPECT_EQ(gate.ran_deferred(), 3);
  EXPECT_EQ(gate.dropped(), 0);
}

TEST(FreeGateTest, TheDeferredListIsBoundedAndCountsWhatItDrops) {
  FreeGate gate;
  int64_t runs = 0;
  gate.Enter();
  for (size_t i = 0; i < FreeGate::kMaxDeferred + 5; ++i) gate.FreeOrDefer(Counted(&runs, 1));
  EXPECT_EQ(gate.deferred(), FreeGate::kMaxDeferred);
  EXPECT_EQ(gate.dropped(), 5);
  EXPECT_EQ(runs, 0);
  gate.Leave();
  EXPECT_EQ(runs, static_cast<int64_t>(FreeGate::kMaxDeferred));
  EXPECT_EQ(gate.DrainIfOpen(), 0u);
}

// The streams destroyed by Destroy, the StreamPool's destroy function.
std::vector<void*>* destroyed_streams = nullptr;
void Destroy(void* stream, intptr_t /*arg*/) { destroyed_streams->push_back(stream); }

// A StreamPool over fake streams: distinct addresses of `slots`.
struct Streams {
  explicit Streams(size_t max_idle, FreeGate* gate)
      : pool(
            max_idle,
            [this]() -> absl::StatusOr<void*> {
              if (fail) return absl::InternalError("injected stream creation failure");
              return static_cast<void*>(&slots[made++]);
            },
            &Destroy, 0, gate) {
    destroyed_streams = &destroyed;
  }
  ~Streams() { destroyed_streams = nullptr; }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  bool fail = false;
  size_t made = 0;
  char slots[64] = {};
  std::vector<void*> destroyed;
  StreamPool pool;
};

TEST(StreamPoolTest, ABurstLeavesAtMostTheIdleCap) {
  FreeGate gate;
  Streams s(4, &gate);
  ASSERT_OK(s.pool.Init(2));
  EXPECT_EQ(s.pool.idle(), 2u);
  std::vector<void*> held;
  held.reserve(20);
  for (int i = 0; i < 20; ++i) held.push_back(*s.pool.Acquire());  // a burst of 20
  EXPECT_EQ(s.pool.created(), 20);
  for (void* st : held) s.pool.Release(st);
  // The old pool kept all 20 for ever.
  EXPECT_EQ(s.pool.idle(), 4u);
  EXPECT_EQ(s.pool.live(), 4u);
  EXPECT_EQ(s.destroyed.size(), 16u);
  // The next 4 concurrent requests create nothing.
  held.clear();
  for (int i = 0; i < 4; ++i) held.push_back(*s.pool.Acquire());
  EXPECT_EQ(s.pool.created(), 20);
  for (void* st : held) s.pool.Release(st);
  // A creation failure holds nothing.
  held.clear();
  for (int i = 0; i < 4; ++i) held.push_back(*s.pool.Acquire());
  s.fail = true;
  EXPECT_THAT(s.pool.Acquire().status(), StatusIs(StatusCode::kInternal, "injected"));
  EXPECT_EQ(s.pool.live(), 4u);
  for (void* st : held) s.pool.Release(st);
  EXPECT_EQ(s.pool.DestroyIdle(), 0u);
  EXPECT_EQ(s.destroyed.size(), 20u);
}

TEST(StreamPoolTest, StreamsBeyondTheCapAreDestroyedOnlyOnceTheGateOpens) {
  FreeGate gate;
  Streams s(2, &gate);
  std::vector<void*> held;
  held.reserve(6);
  for (int i = 0; i < 6; ++i) held.push_back(*s.pool.Acquire());
  gate.Enter();  // a stream (of any backend) waits on a client's event
  for (void* st : held) s.pool.Release(st);
  EXPECT_TRUE(s.destroyed.empty());
  EXPECT_EQ(gate.deferred(), 4u);
  EXPECT_EQ(s.pool.idle(), 2u);
  gate.Leave();
  EXPECT_EQ(s.destroyed.size(), 4u);
  EXPECT_EQ(gate.deferred(), 0u);
}

TEST(BlockPoolTest, IdleBytesBeyondTheCapAreChargedToTheBudgetWhileTheGateIsClosed) {
  FreeGate gate;
  MemoryBudget budget(size_t{1} << 20, size_t{1} << 20, nullptr);
  CountingPool p("pool", 1024, 8192, nullptr, &gate);
  p.pool.AttachBudget(&budget);
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
  // Requests find that much less room.
  MemoryBudget::Reservation r = budget.Open();
  EXPECT_THAT(r.Grow((uint64_t{1} << 20) - (uint64_t{20} << 10) + 1, "staging for x"),
              StatusIs(StatusCode::kResourceExhausted, "--memory_budget_bytes"));
  // A reused block is the request's again: the charge shrinks.
  absl::StatusOr<BlockPool::Block> again = p.pool.Acquire(16 << 10);
  ASSERT_OK(again);
  EXPECT_EQ(p.pool.charged_bytes(), uint64_t{4} << 10);
  p.pool.Release(*again);
  EXPECT_EQ(budget.used_bytes(), uint64_t{20} << 10);
  // The gate opens: the next release trims, and the charge goes.
  gate.Leave();
  again = p.pool.Acquire(1024);
  ASSERT_OK(again);
  p.pool.Release(*again);
  EXPECT_GT(p.frees, 0);
  EXPECT_LE(p.pool.cached_bytes(), p.pool.max_cached_bytes());
  EXPECT_EQ(p.pool.charged_bytes(), 0u);
  EXPECT_EQ(budget.used_bytes(), 0u);
}

TEST(BlockPoolTest, AChargeBeyondTheBudgetRefusesEveryRequestUntilFreed) {
  FreeGate gate;
  MemoryBudget budget(16 << 10, 16 << 10, nullptr);
  CountingPool p("pool", 1024, 0, nullptr, &gate);
  p.pool.AttachBudget(&budget);
  gate.Enter();
  absl::StatusOr<BlockPool::Block> b = p.pool.Acquire(32 << 10);
  ASSERT_OK(b);
  p.pool.Release(*b);
  // Beyond the total (the memory exists): no request gets a byte.
  EXPECT_EQ(budget.used_bytes(), uint64_t{32} << 10);
  MemoryBudget::Reservation r = budget.Open();
  EXPECT_THAT(r.Grow(1, "staging for x"), StatusIs(StatusCode::kResourceExhausted));
  gate.Leave();
  b = p.pool.Acquire(1024);  // not reused (32 KiB > 2 x 1 KiB): a new block
  ASSERT_OK(b);
  p.pool.Release(*b);
  EXPECT_EQ(budget.used_bytes(), 0u);
  EXPECT_OK(r.Grow(1, "staging for x"));
  // Detached: nothing stays charged to a budget about to end.
  p.pool.AttachBudget(nullptr);
}

}  // namespace
}  // namespace tokensel::testing
