// The FreeGate's deferred frees (server/core/free_gate.h): per device,
// bounded by reservation, drained by the gate's own thread; the StreamPool's
// idle cap (stream_pool.h); the BlockPool's charge of idle bytes beyond its
// cap while the gate is closed (block_pool.h). Without a device.
#include "server/core/free_gate.h"

#include <atomic>
#include <cstdint>
#include <thread>
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

constexpr absl::Duration kWait = absl::Seconds(10);

// A Deferred function: counts its runs in the atomic at `data`.
bool Count(void* data, intptr_t /*arg*/) {
  ++*static_cast<std::atomic<int64_t>*>(data);
  return true;
}

FreeGate::Deferred Counted(std::atomic<int64_t>* runs, uint64_t bytes) {
  return FreeGate::Deferred{&Count, runs, 0, bytes};
}

TEST(FreeGateTest, DefersWhileClosedAndItsDrainerRunsThemWhenTheLastWaitLeaves) {
  FreeGate gate;
  std::atomic<int64_t> runs{0};
  for (int i = 0; i < 4; ++i) ASSERT_OK(gate.Reserve("test"));
  EXPECT_EQ(gate.reserved(), 4u);
  gate.FreeOrDefer(Counted(&runs, 10));  // open: its drainer runs it, its room back
  EXPECT_EQ(gate.AwaitDrained(kWait), 0u);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(gate.reserved(), 3u);
  gate.Enter();
  gate.Enter();
  for (uint64_t bytes : {1, 2, 3}) gate.FreeOrDefer(Counted(&runs, bytes));
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(gate.deferred(), 3u);
  EXPECT_EQ(gate.deferred_bytes(), 6u);
  EXPECT_EQ(gate.DrainIfOpen(), 3u);  // closed: nothing runs
  gate.Leave();                       // one wait still there
  EXPECT_EQ(gate.AwaitDrained(absl::Milliseconds(50)), 3u);
  EXPECT_EQ(runs, 1);
  gate.Leave();  // open: the drainer runs them
  EXPECT_EQ(gate.AwaitDrained(kWait), 0u);
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(gate.deferred_bytes(), 0u);
  EXPECT_EQ(gate.ran_deferred(), 4);
  EXPECT_EQ(gate.reserved(), 0u);
  EXPECT_EQ(gate.dropped(), 0);
}

// The review's item 7: the thread whose Leave opens the gate (a backend's
// completion thread, or a request thread completing a sync chain) does not
// run other clients' deferred frees; the gate's drainer does.
std::atomic<std::thread::id> ran_on;
bool NoteThread(void* /*data*/, intptr_t /*arg*/) {
  ran_on = std::this_thread::get_id();
  return true;
}

TEST(FreeGateTest, LeaveDoesNotRunTheDeferredFreesOnItsThread) {
  FreeGate gate;
  ASSERT_OK(gate.Reserve("test"));
  gate.Enter();
  gate.FreeOrDefer({&NoteThread, nullptr, 0, 0});
  ran_on = std::thread::id();
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(kWait), 0u);
  EXPECT_NE(ran_on.load(), std::thread::id());
  EXPECT_NE(ran_on.load(), std::this_thread::get_id());
}

// The review's item 1: the list cannot overflow. Room is reserved when a
// resource is made, live and deferred together; past kMaxPending the maker
// gets RESOURCE_EXHAUSTED naming the limit, and nothing is ever dropped.
TEST(FreeGateTest, RoomIsReservedUpFrontSoNothingIsDropped) {
  FreeGate gate;
  std::atomic<int64_t> runs{0};
  for (size_t i = 0; i < FreeGate::kMaxPending; ++i) ASSERT_OK(gate.Reserve("test"));
  EXPECT_THAT(gate.Reserve("cuda_ipc: opening a handle"),
              StatusIs(StatusCode::kResourceExhausted, "kMaxPending"));
  gate.Enter();
  for (size_t i = 0; i < FreeGate::kMaxPending; ++i) gate.FreeOrDefer(Counted(&runs, 1));
  EXPECT_EQ(gate.deferred(), FreeGate::kMaxPending);
  EXPECT_EQ(gate.dropped(), 0);
  EXPECT_EQ(runs, 0);
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(kWait), 0u);
  EXPECT_EQ(runs, static_cast<int64_t>(FreeGate::kMaxPending));
  EXPECT_EQ(gate.reserved(), 0u);
  EXPECT_OK(gate.Reserve("test"));
  gate.Unreserve();
  // A deferral without room (a caller bug) is dropped, never run now.
  gate.Enter();
  gate.FreeOrDefer(Counted(&runs, 1));
  EXPECT_EQ(gate.dropped(), 1);
  gate.Leave();
}

// A free that reports its resource still in use (a closing IPC handle
// reused meanwhile) keeps its room for the owner's next deferral.
bool KeepIt(void* /*data*/, intptr_t /*arg*/) { return false; }

TEST(FreeGateTest, AFreeThatKeepsItsResourceKeepsItsRoom) {
  FreeGate gate;
  ASSERT_OK(gate.Reserve("test"));
  gate.Enter();
  gate.FreeOrDefer({&KeepIt, nullptr, 0, 0});
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(kWait), 0u);
  EXPECT_EQ(gate.reserved(), 1u);
  gate.FreeOrDefer({&KeepIt, nullptr, 0, 0});  // open: the drainer runs it
  EXPECT_EQ(gate.AwaitDrained(kWait), 0u);
  EXPECT_EQ(gate.reserved(), 1u);
  gate.Unreserve();
  EXPECT_EQ(gate.reserved(), 0u);
}

// The review's items 1 and 2: one gate per device. A stuck client wait on
// device 0 (its gate closed for ever) does not stop the frees of device 1.
TEST(FreeGateTest, AStuckWaitOnOneDeviceDoesNotStopFreesOnAnother) {
  FreeGate& zero = FreeGate::ForDevice(0);
  FreeGate& one = FreeGate::ForDevice(1);
  EXPECT_NE(&zero, &one);
  EXPECT_EQ(&FreeGate::ForDevice(1), &one);  // the same, every time
  // Ordinals beyond the table share one gate.
  EXPECT_EQ(&FreeGate::ForDevice(FreeGate::kMaxDevices), &FreeGate::ForDevice(-1));
  std::atomic<int64_t> runs{0};
  zero.Enter();
  ASSERT_OK(one.Reserve("test"));
  one.FreeOrDefer(Counted(&runs, 1));
  EXPECT_EQ(one.AwaitDrained(kWait), 0u);  // its drainer runs it
  EXPECT_EQ(runs, 1);
  BlockPool::Block block;
  {
    CountingPool p("pool", 1024, 0, nullptr, &one);  // cap 0: every release frees
    block = *p.pool.Acquire(1024);
    p.pool.Release(block);
    EXPECT_EQ(one.AwaitDrained(kWait), 0u);  // its drainer trims the pool
    EXPECT_EQ(p.frees, 1);
  }
  zero.Leave();
}

// Enter racing the drain: no free runs while a wait is registered (Enter
// waits for a free in progress, and a drain stops at a wait).
std::atomic<bool> inside{false};
std::atomic<int64_t> ran_inside{0};
bool CheckOutside(void* data, intptr_t /*arg*/) {
  if (inside.load()) ++ran_inside;
  ++*static_cast<std::atomic<int64_t>*>(data);
  return true;
}

TEST(FreeGateTest, NoFreeRunsWhileAWaitIsRegisteredUnderConcurrency) {
  FreeGate gate;
  std::atomic<int64_t> runs{0};
  constexpr int kFrees = 2000;
  for (int i = 0; i < kFrees; ++i) ASSERT_OK(gate.Reserve("test"));
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    while (!done.load()) {
      gate.Enter();
      inside = true;
      std::this_thread::yield();
      inside = false;
      gate.Leave();
    }
  });
  for (int i = 0; i < kFrees; ++i) gate.FreeOrDefer({&CheckOutside, &runs, 0, 1});
  done = true;
  waiter.join();
  EXPECT_EQ(gate.AwaitDrained(kWait), 0u);
  EXPECT_EQ(runs, kFrees);
  EXPECT_EQ(ran_inside, 0);
  EXPECT_EQ(gate.reserved(), 0u);
}

// The streams destroyed by Destroy, the StreamPool's destroy function.
std::vector<void*>* destroyed_streams = nullptr;
void Destroy(void* stream, intptr_t /*arg*/) { destroyed_streams->push_back(stream); }

// A StreamPool over fake streams: distinct addresses of `slots`.
struct Streams {
  explicit Streams(size_t max_idle, int fail_at = -1)
      : pool(
            max_idle,
            [this, fail_at]() -> absl::StatusOr<void*> {
              if (fail || static_cast<int>(made) == fail_at) {
                return absl::InternalError("injected stream creation failure");
              }
              return static_cast<void*>(&slots[made++]);
            },
            &Destroy, 0) {
    destroyed_streams = &destroyed;
  }
  ~Streams() { destroyed_streams = nullptr; }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  bool fail = false;
  size_t made = 0;
  char slots[256] = {};
  std::vector<void*> destroyed;
  StreamPool pool;
};

TEST(StreamPoolTest, ABurstLeavesAtMostTheIdleCap) {
  Streams s(4);
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

// The review's items 1 and 9: cudaStreamDestroy returns at once with work
// pending, so a stream beyond the cap is destroyed at once, whatever any
// gate says: bursts while a client wait is stuck leave no list of streams.
TEST(StreamPoolTest, StreamsBeyondTheCapAreDestroyedAtOnceBurstAfterBurst) {
  FreeGate& gate = FreeGate::ForDevice(0);
  gate.Enter();  // a stream of the device waits on a client's event
  Streams s(2);
  for (int burst = 0; burst < 10; ++burst) {
    std::vector<void*> held;
    held.reserve(6);
    for (int i = 0; i < 6; ++i) held.push_back(*s.pool.Acquire());
    for (void* st : held) s.pool.Release(st);
    EXPECT_EQ(s.pool.idle(), 2u);
    EXPECT_EQ(s.pool.live(), 2u);
  }
  EXPECT_EQ(s.destroyed.size(), 40u);
  EXPECT_EQ(gate.deferred(), 0u);
  gate.Leave();
  EXPECT_EQ(s.pool.DestroyIdle(), 0u);
}

// The review's item 15: a failed Init keeps none of the streams it made.
TEST(StreamPoolTest, AFailedInitDestroysTheStreamsItMade) {
  Streams s(8, /*fail_at=*/3);
  EXPECT_THAT(s.pool.Init(5), StatusIs(StatusCode::kInternal, "injected"));
  EXPECT_EQ(s.pool.live(), 0u);
  EXPECT_EQ(s.pool.idle(), 0u);
  EXPECT_EQ(s.destroyed.size(), 3u);
  EXPECT_EQ(s.pool.DestroyIdle(), 0u);
}

}  // namespace
}  // namespace tokensel::testing
