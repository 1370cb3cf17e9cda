// The FreeGate after the fifth and sixth CUDA reviews (server/core/free_gate.h):
// FreeOrDefer never runs a free on its caller's thread; the host gate of
// pinned memory is closed while any device gate is; StopAll stops the
// drainers and leaks what is left (reachably, counted); the byte cap on
// deferred teardowns. Without a device.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "gtest/gtest.h"
#include "server/backends/block_pool.h"
#include "server/core/free_gate.h"
#include "tests/server/backends/counting_pool.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using core::FreeGate;

constexpr absl::Duration kReviewWait = absl::Seconds(10);

bool CountRun(void* data, intptr_t /*arg*/) {
  ++*static_cast<std::atomic<int64_t>*>(data);
  return true;
}

FreeGate::Deferred Tally(std::atomic<int64_t>* runs, uint64_t bytes) {
  return FreeGate::Deferred{&CountRun, runs, 0, bytes};
}

// The thread a free ran on.
struct RunRecord {
  std::atomic<std::thread::id> thread{};
};

bool Record(void* data, intptr_t /*arg*/) {
  static_cast<RunRecord*>(data)->thread = std::this_thread::get_id();
  return true;
}

// The fifth review: with the gate open, FreeOrDefer ran the free on the
// calling thread (the completion thread, dropping the last region, closed
// a mapping there behind the device's queued kernels). Now the drainer
// runs it, after FreeOrDefer returned; from any thread.
TEST(FreeGateReviewTest, FreeOrDeferNeverRunsTheFreeOnTheCallingThread) {
  FreeGate gate;
  ASSERT_TRUE(gate.open());
  for (int round = 0; round < 3; ++round) {
    ASSERT_OK(gate.Reserve("test"));
    RunRecord record;
    std::thread::id caller;
    std::thread t([&] {
      caller = std::this_thread::get_id();
      gate.FreeOrDefer({&Record, &record, 0, 0});
    });
    t.join();
    EXPECT_EQ(gate.AwaitDrained(kReviewWait), 0u);
    EXPECT_NE(record.thread.load(), caller) << "ran on the caller's thread";
    EXPECT_NE(record.thread.load(), std::thread::id{}) << "never ran";
    EXPECT_EQ(gate.reserved(), 0u);
  }
  // On this thread too.
  ASSERT_OK(gate.Reserve("test"));
  RunRecord record;
  gate.FreeOrDefer({&Record, &record, 0, 0});
  EXPECT_EQ(gate.AwaitDrained(kReviewWait), 0u);
  EXPECT_NE(record.thread.load(), std::this_thread::get_id());
  EXPECT_EQ(gate.ran_deferred(), 4);
  EXPECT_EQ(gate.dropped(), 0);
}

// The fifth review: pinned memory is portable under unified addressing, so
// cudaFreeHost may synchronize any device's context. The host gate (the
// pinned pools' and pinned frees') is closed while ANY device's gate is, and
// opens only when all are open again; a device gate is not held back by
// another device's wait.
TEST(FreeGateReviewTest, TheHostGateIsClosedWhileAnyDeviceGateIsClosed) {
  FreeGate& host = FreeGate::ForHost();
  FreeGate& five = FreeGate::ForDevice(5);
  FreeGate& six = FreeGate::ForDevice(6);
  EXPECT_EQ(&FreeGate::ForHost(), &host);
  ASSERT_TRUE(host.open());
  std::atomic<int64_t> runs{0};
  five.Enter();  // a stuck client wait on device 5
  EXPECT_FALSE(host.open());
  EXPECT_TRUE(six.open());
  // A pinned free deferred meanwhile, and a pinned pool's trim: neither runs.
  ASSERT_OK(host.Reserve("test"));
  host.FreeOrDefer(Tally(&runs, 4096));
  {
    CountingPool pinned("pinned", 1024, 0, nullptr, &host);  // cap 0: every release frees
    BlockPool::Block block = *pinned.pool.Acquire(1024);
    pinned.pool.Release(block);
    EXPECT_EQ(pinned.frees, 0);
    EXPECT_EQ(host.AwaitDrained(absl::Milliseconds(50)), 1u);
    EXPECT_EQ(runs, 0);
    // Device 6's frees go on.
    ASSERT_OK(six.Reserve("test"));
    six.FreeOrDefer(Tally(&runs, 1));
    EXPECT_EQ(six.AwaitDrained(kReviewWait), 0u);
    EXPECT_EQ(runs, 1);
    six.Enter();
    five.Leave();  // device 6 still waits: the host gate stays closed
    EXPECT_FALSE(host.open());
    EXPECT_EQ(host.AwaitDrained(absl::Milliseconds(50)), 1u);
    EXPECT_EQ(runs, 1);
    six.Leave();  // every device gate open: the host gate opens
    EXPECT_TRUE(host.open());
    EXPECT_EQ(host.AwaitDrained(kReviewWait), 0u);
    EXPECT_EQ(runs, 2);
    // The host gate's opened hook trims the block the pool kept (block_pool.h).
    const absl::Time deadline = absl::Now() + kReviewWait;
    while (pinned.frees != 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(pinned.frees, 1);
    pinned.pool.Release(*pinned.pool.Acquire(1024));  // an open gate: the drainer trims
    EXPECT_EQ(host.AwaitDrained(kReviewWait), 0u);
    EXPECT_EQ(pinned.frees, 2);
  }
  EXPECT_EQ(host.reserved(), 0u);
}

// The fifth review: the drainers were never stopped (one could be inside a
// close while cudart tears down at exit). StopAll runs what can run within
// its bound, stops and joins every drainer, and leaks the rest on purpose:
// kept in the list (reachable) and counted; so is a FreeOrDefer after it. A
// later Reserve (another server in this process) starts the drainer again.
TEST(FreeGateReviewTest, StopAllStopsTheDrainersAndLeaksWhatIsLeftCounted) {
  FreeGate& open_gate = FreeGate::ForDevice(8);
  FreeGate& stuck = FreeGate::ForDevice(9);
  std::atomic<int64_t> runs{0};
  for (int i = 0; i < 2; ++i) ASSERT_OK(open_gate.Reserve("test"));
  for (int i = 0; i < 3; ++i) ASSERT_OK(stuck.Reserve("test"));
  stuck.Enter();  // stuck work leaked at shutdown: never opens
  stuck.FreeOrDefer(Tally(&runs, 1));
  open_gate.FreeOrDefer(Tally(&runs, 1));
  const int64_t leaked_before = stuck.leaked();
  const absl::Time start = absl::Now();
  EXPECT_EQ(FreeGate::StopAll(absl::Seconds(20)), 1u);
  // A closed gate is not waited for (it would not open): well within the bound.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(runs, 1);  // the open gate's entry ran
  EXPECT_EQ(stuck.leaked(), leaked_before + 1);
  EXPECT_EQ(stuck.deferred(), 1u);  // kept, reachable
  // The gate opens: no drainer runs it any more.
  stuck.Leave();
  EXPECT_EQ(stuck.AwaitDrained(absl::Milliseconds(50)), 1u);
  EXPECT_EQ(runs, 1);
  // A teardown after StopAll is kept and counted, never run.
  open_gate.FreeOrDefer(Tally(&runs, 1));
  EXPECT_EQ(open_gate.AwaitDrained(absl::Milliseconds(50)), 1u);
  EXPECT_EQ(open_gate.leaked(), 1);
  EXPECT_EQ(runs, 1);
  // A new server in this process: Reserve starts the drainer again, which
  // runs what waited (the gates are open).
  ASSERT_OK(open_gate.Reserve("test"));
  ASSERT_OK(stuck.Reserve("test"));
  EXPECT_EQ(open_gate.AwaitDrained(kReviewWait), 0u);
  EXPECT_EQ(stuck.AwaitDrained(kReviewWait), 0u);
  EXPECT_EQ(runs, 3);
  open_gate.Unreserve();
  stuck.Unreserve();
  for (int i = 0; i < 2; ++i) stuck.Unreserve();
  EXPECT_EQ(open_gate.reserved(), 0u);
  EXPECT_EQ(stuck.reserved(), 0u);
}

// The sixth review: teardowns behind a stuck wait kept other tenants'
// memory alive with no byte bound. Past max_deferred_bytes queued, Reserve
// (every new registration or staging on the device) is RESOURCE_EXHAUSTED
// naming the limit and the device; it passes again once they ran.
TEST(FreeGateReviewTest, DeferredBytesPastTheLimitRefuseNewResourcesOnThatDevice) {
  FreeGate& gate = FreeGate::ForDevice(7);
  FreeGate& other = FreeGate::ForDevice(10);
  EXPECT_EQ(gate.max_deferred_bytes(), FreeGate::kDefaultMaxDeferredBytes);
  gate.set_max_deferred_bytes(100);
  other.set_max_deferred_bytes(100);
  std::atomic<int64_t> runs{0};
  for (int i = 0; i < 3; ++i) ASSERT_OK(gate.Reserve("test"));
  gate.Enter();
  gate.FreeOrDefer(Tally(&runs, 60));
  ASSERT_OK(gate.Reserve("test"));  // 60 <= 100
  gate.FreeOrDefer(Tally(&runs, 40));
  ASSERT_OK(gate.Reserve("test"));  // 100: at the limit, not past it
  gate.FreeOrDefer(Tally(&runs, 1));
  EXPECT_EQ(gate.deferred_bytes(), 101u);
  EXPECT_THAT(gate.Reserve("cuda_vmm: a mapping"),
              StatusIs(StatusCode::kResourceExhausted,
                       "cuda_vmm: a mapping: device 7 has 101 bytes waiting for their deferred "
                       "teardown, more than the limit of 100"));
  ASSERT_OK(other.Reserve("test"));  // another device is not affected
  other.Unreserve();
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(kReviewWait), 0u);
  EXPECT_EQ(runs, 3);
  ASSERT_OK(gate.Reserve("test"));
  gate.Unreserve();
  gate.Unreserve();
  gate.Unreserve();
  EXPECT_EQ(gate.reserved(), 0u);
  gate.set_max_deferred_bytes(FreeGate::kDefaultMaxDeferredBytes);
  other.set_max_deferred_bytes(FreeGate::kDefaultMaxDeferredBytes);
}

// The CUDA read of the eighth session, RISK 1: the drainer ran the opened
// hooks only once its queue was empty, and a pool over its cap with the gate
// open stays uncharged until its hook (the trim) ran, so a long queue of
// teardowns let idle blocks grow unbounded meanwhile. The hooks now run
// between teardowns.
struct OrderLog {
  tokensel::Mutex mu;
  std::vector<int> order ABSL_GUARDED_BY(mu);  // 0: the hook; k > 0: teardown k
  void Add(int what) {
    tokensel::MutexLock lock(&mu);
    order.push_back(what);
  }
};

bool LogRun(void* data, intptr_t arg) {
  static_cast<OrderLog*>(data)->Add(static_cast<int>(arg));
  return true;
}

TEST(FreeGateReviewTest, TheOpenedHooksRunBetweenQueuedTeardowns) {
  FreeGate gate;
  OrderLog log;
  const uint64_t hook = gate.AddOpenedHook([&] { log.Add(0); });
  constexpr int kQueued = 4;
  gate.Enter();  // closed: the teardowns queue
  for (int k = 1; k <= kQueued; ++k) {
    ASSERT_OK(gate.Reserve("test"));
    gate.FreeOrDefer({&LogRun, &log, k, 0});
  }
  gate.Leave();  // opens: the drainer runs the teardowns and the hooks
  EXPECT_EQ(gate.AwaitDrained(kReviewWait), 0u);
  gate.RemoveOpenedHook(hook);
  tokensel::MutexLock lock(&log.mu);
  ASSERT_EQ(log.order.size(), static_cast<size_t>(kQueued) + 1);
  size_t hook_at = 0;
  while (hook_at < log.order.size() && log.order[hook_at] != 0) ++hook_at;
  EXPECT_LT(hook_at, static_cast<size_t>(kQueued)) << "the hook ran after every teardown";
}

}  // namespace
}  // namespace tokensel::testing
