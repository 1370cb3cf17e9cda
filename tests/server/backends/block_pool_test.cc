// BlockPool alone, over CountingPool (fake_stream_device.h: malloc that
// counts): rounding, reuse within twice the size, trimming with hysteresis.
#include "server/backends/block_pool.h"

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/backends/fake_stream_device.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using backends::BlockPool;
using ::testing::ElementsAre;

TEST(BlockPoolTest, RoundsReusesWithinTwiceAndRefusesWrapping) {
  CountingPool p("pool", 1024, 1 << 20);
  EXPECT_EQ(p.pool.AllocationBytes(0), 1024u);
  EXPECT_EQ(p.pool.AllocationBytes(1025), 2048u);
  EXPECT_EQ(p.pool.AllocationBytes(SIZE_MAX - 3), SIZE_MAX);
  EXPECT_THAT(p.pool.Acquire(SIZE_MAX - 3).status(),
              StatusIs(StatusCode::kResourceExhausted, "pool of"));
  absl::StatusOr<BlockPool::Block> big = p.pool.Acquire(8192);
  ASSERT_OK(big);
  p.pool.Release(*big);
  absl::StatusOr<BlockPool::Block> small = p.pool.Acquire(1000);  // 8 KiB > 2 x 1 KiB: new
  ASSERT_OK(small);
  EXPECT_NE(small->data, big->data);
  absl::StatusOr<BlockPool::Block> half = p.pool.Acquire(4096);  // 8 KiB <= 2 x 4 KiB: reuse
  ASSERT_OK(half);
  EXPECT_EQ(half->data, big->data);
  EXPECT_EQ(half->bytes, 8192u);
  EXPECT_EQ(p.mallocs, 2);
  p.pool.Release(*small);
  p.pool.Release(*half);
  EXPECT_EQ(p.pool.blocks_in_use(), 0u);
}

TEST(BlockPoolTest, TrimsTheLargestIdleBlocksBeyondTheCap) {
  CountingPool p("pool", 1024, 4096);
  std::vector<BlockPool::Block> blocks;
  for (size_t kb : {1, 2, 3}) blocks.push_back(*p.pool.Acquire(kb * 1024));
  for (const BlockPool::Block& b : blocks) p.pool.Release(b);
  // 1 + 2 + 3 KiB idle > 4 KiB after the 3 KiB release: towards half the
  // cap, the other blocks largest first (the 2 then the 1 KiB block); the
  // block just released stays, since it alone is within the cap.
  EXPECT_EQ(p.pool.cached_bytes(), 3072u);
  EXPECT_EQ(p.frees, 2);
  EXPECT_EQ(p.pool.frees(), 2);
}

TEST(BlockPoolTest, ASteadyLoadJustOverTheCapDoesNotAllocateEveryWave) {
  // 64 KiB cap. An earlier load left 32 + 16 + 16 KiB idle (at the cap);
  // now every wave uses 32 + 4 KiB (68 KiB idle after it, just over the
  // cap). Trimming only to the cap freed the 32 KiB block after every wave
  // (the largest) and kept the stale 16 KiB ones, so every wave allocated
  // 32 KiB again. Trimming to half the cap drops the stale blocks too, and
  // the load settles.
  CountingPool p("pool", 4096, 64 << 10);
  {
    std::vector<BlockPool::Block> warm;
    for (size_t kb : {32, 16, 16}) warm.push_back(*p.pool.Acquire(kb << 10));
    for (const BlockPool::Block& b : warm) p.pool.Release(b);
  }
  ASSERT_EQ(p.pool.cached_bytes(), size_t{64} << 10);
  std::vector<int> allocations;
  for (int wave = 0; wave < 6; ++wave) {
    const int before = p.mallocs;
    absl::StatusOr<BlockPool::Block> large = p.pool.Acquire(32 << 10);
    absl::StatusOr<BlockPool::Block> small = p.pool.Acquire(4 << 10);
    ASSERT_OK(large);
    ASSERT_OK(small);
    p.pool.Release(*large);
    p.pool.Release(*small);
    EXPECT_LE(p.pool.cached_bytes(), p.pool.max_cached_bytes());
    allocations.push_back(p.mallocs - before);
  }
  // Wave 0 allocates the 4 KiB block (no idle one within twice its size)
  // and trims to {16, 4}; wave 1 allocates the 32 KiB block once more;
  // from then on 32 + 16 + 4 KiB stay idle and nothing is allocated.
  EXPECT_THAT(allocations, ElementsAre(1, 1, 0, 0, 0, 0));
  EXPECT_EQ(p.pool.blocks_in_use(), 0u);
}

TEST(BlockPoolTest, ALoadBlockAboveHalfTheCapIsKeptAndStaleOnesGo) {
  // 64 KiB cap, 16 + 16 KiB stale, every wave uses one 40 KiB block
  // (between half the cap and the cap). Its release takes idle to 72 KiB:
  // freeing the largest first would free the 40 KiB block itself (down to
  // 32 KiB) and every wave would allocate it again; the stale blocks go
  // instead, and the load settles after one allocation.
  CountingPool p("pool", 4096, 64 << 10);
  {
    std::vector<BlockPool::Block> stale;
    for (size_t kb : {16, 16}) stale.push_back(*p.pool.Acquire(kb << 10));
    for (const BlockPool::Block& b : stale) p.pool.Release(b);
  }
  std::vector<int> allocations;
  for (int wave = 0; wave < 5; ++wave) {
    const int before = p.mallocs;
    absl::StatusOr<BlockPool::Block> load = p.pool.Acquire(40 << 10);
    ASSERT_OK(load);
    p.pool.Release(*load);
    EXPECT_LE(p.pool.cached_bytes(), p.pool.max_cached_bytes());
    allocations.push_back(p.mallocs - before);
  }
  EXPECT_THAT(allocations, ElementsAre(1, 0, 0, 0, 0));
  EXPECT_EQ(p.pool.cached_bytes(), size_t{40} << 10);
}

TEST(BlockPoolTest, AReleasedBlockAboveTheCapIsFreedAtOnce) {
  CountingPool p("pool", 4096, 64 << 10);
  absl::StatusOr<BlockPool::Block> huge = p.pool.Acquire(80 << 10);
  ASSERT_OK(huge);
  p.pool.Release(*huge);
  EXPECT_EQ(p.pool.cached_bytes(), 0u);
  EXPECT_EQ(p.frees, 1);
}

// While a stream of the device waits on a client's event (FreeGate entered)
// a free would synchronize the device behind that event: nothing is freed,
// the idle blocks stay beyond the cap, and once the gate reopens its
// opened hook trims them on the gate's drainer (a release over the cap
// asks the drainer too; never trims on its own thread).
TEST(BlockPoolTest, NothingIsFreedWhileTheGateIsClosed) {
  backends::FreeGate gate;
  CountingPool p("pool", 1024, 4096, nullptr, &gate);
  gate.Enter();
  EXPECT_FALSE(gate.open());
  std::vector<BlockPool::Block> blocks;
  for (size_t kb : {1, 2, 3, 8}) blocks.push_back(*p.pool.Acquire(kb * 1024));
  for (const BlockPool::Block& b : blocks) p.pool.Release(b);
  EXPECT_EQ(p.frees, 0);
  EXPECT_EQ(p.pool.cached_bytes(), size_t{14} << 10);
  gate.Leave();
  ASSERT_TRUE(gate.open());
  absl::StatusOr<BlockPool::Block> again = p.pool.Acquire(1024);
  ASSERT_OK(again);
  p.pool.Release(*again);
  ASSERT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);  // the drainer trims (not Release)
  EXPECT_GT(p.pool.frees(), 0);
  EXPECT_LE(p.pool.cached_bytes(), p.pool.max_cached_bytes());
}

// A pool destroyed while a stream waits on a client event (a backend torn
// down with abandoned work) leaks its idle blocks: cudaFree would wait
// behind that event for ever. With the gate open it frees them.
TEST(BlockPoolTest, ADestroyedPoolFreesNothingWhileTheGateIsClosed) {
  static char arena[4][1024];  // never heap: the closed case leaks on purpose
  for (const bool closed : {true, false}) {
    backends::FreeGate gate;
    int next = 0, frees = 0;
    {
      BlockPool pool(
          "pool", 1024, 1 << 20,
          [&](size_t) -> absl::StatusOr<void*> { return static_cast<void*>(arena[next++]); },
          [&](void*) { ++frees; }, &gate);
      std::vector<BlockPool::Block> blocks;
      for (int i = 0; i < 3; ++i) blocks.push_back(*pool.Acquire(1000));
      for (const BlockPool::Block& b : blocks) pool.Release(b);
      if (closed) gate.Enter();
    }
    EXPECT_EQ(frees, closed ? 0 : 3) << (closed ? "closed" : "open");
    if (closed) gate.Leave();
  }
}

}  // namespace
}  // namespace tokensel::testing
