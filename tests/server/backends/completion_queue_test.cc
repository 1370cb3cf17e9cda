// CompletionQueue with its own thread (the CUDA backend's mode): a
// completion is seen by the thread alone, with no Poll from the test, once
// the device reports the item's event done; Shutdown waits for the items
// still pending. Over a minimal thread-safe device (FakeStreamDevice is
// single-threaded): its only state is which events are done.
#include "server/backends/completion_queue.h"

#include <atomic>
#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "tests/server/backends/fake_stream_device.h"

namespace tokensel::testing {
namespace {

using backends::CompletionQueue;
using backends::CompletionWork;

class ThreadSafeDevice final : public StreamDevice {
 public:
  absl::StatusOr<Stream> AcquireStream() override { return reinterpret_cast<Stream>(0x10); }
  void ReleaseStream(Stream) override { ++streams_released; }
  absl::Status CopyToDevice(void*, const void*, uint64_t, Stream) override { return {}; }
  absl::Status CopyToHost(void*, const void*, uint64_t, Stream) override { return {}; }
  absl::Status Zero(void*, uint64_t, Stream) override { return {}; }
  uint64_t WorkspaceBytes(core::OpArgs) const override { return 0; }
  absl::Status Launch(core::OpArgs, kernels::cuda::Workspace, Stream) override { return {}; }
  absl::Status Finish(core::OpArgs, kernels::cuda::Workspace, Stream) override {
    ++finishes;
    return absl::InvalidArgumentError("bad ids");
  }
  absl::Status Drain(Stream, absl::Status status) override { return status; }
  absl::Status CheckUsable() const override { return {}; }
  absl::StatusOr<bool> QueryStream(Stream) override { return false; }
  void MarkOutOfService(absl::string_view) override { ++marked_out_of_service; }
  absl::StatusOr<Event> OpenIpcEvent(absl::string_view, absl::string_view) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<Event> CreateEvent() override { return absl::UnimplementedError(""); }
  void DestroyEvent(Event) override { ++events_destroyed; }
  absl::Status WaitEvent(Stream, Event, absl::string_view) override { return {}; }
  absl::Status RecordEvent(Event, Stream, absl::string_view) override { return {}; }
  absl::StatusOr<bool> EventDone(Event e) override {
    ++queries;
    std::lock_guard<std::mutex> lock(mu_);
    return done_.count(e) > 0;
  }
  void Complete(Event e) {
    std::lock_guard<std::mutex> lock(mu_);
    done_.insert(e);
  }
  std::atomic<int> queries{0};
  std::atomic<int> finishes{0};
  std::atomic<int> streams_released{0};
  std::atomic<int> events_destroyed{0};
  std::atomic<int> marked_out_of_service{0};

 private:
  std::mutex mu_;
  std::set<Event> done_;
};

// One item with one op to finish (its Finish answers bad ids); `done` is
// set with the deferred error.
std::list<CompletionWork> Item(LeasePools& pools, StreamDevice::Event event,
                               std::shared_ptr<std::atomic<int>> done_calls,
                               std::shared_ptr<absl::Status> deferred) {
  std::list<CompletionWork> node(1);
  CompletionWork& w = node.front();
  w.stream = reinterpret_cast<StreamDevice::Stream>(0x10);
  w.done_event = event;
  absl::StatusOr<BlockPool::Block> ws = pools.workspaces.pool.Acquire(64);
  EXPECT_TRUE(ws.ok());
  w.ops.push_back({core::OpArgsValue(kernels::SortTokensArgs{}), *ws, true, "ops[0] (SortTokens)"});
  w.done = [done_calls, deferred](absl::Status s) {
    *deferred = std::move(s);
    done_calls->fetch_add(1);
  };
  return node;
}

bool Eventually(const std::function<bool()>& cond) {
  for (int i = 0; i < 2000 && !cond(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

TEST(CompletionQueueTest, TheThreadCompletesAnItemOnceItsEventIsDone) {
  ThreadSafeDevice device;
  LeasePools pools(64 << 10, 4 << 20);
  auto done_calls = std::make_shared<std::atomic<int>>(0);
  auto deferred = std::make_shared<absl::Status>();
  auto* const event = reinterpret_cast<StreamDevice::Event>(0x1);
  {
    CompletionQueue queue(&device, pools.pools());
    std::list<CompletionWork> node = Item(pools, event, done_calls, deferred);
    queue.Push(&node);
    EXPECT_TRUE(node.empty()) << "the item moved into the queue";
    ASSERT_TRUE(Eventually([&] { return device.queries.load() >= 3; })) << "the thread polls";
    EXPECT_EQ(done_calls->load(), 0);
    EXPECT_EQ(pools.InUse(), 1u) << "held while the event is not done";
    device.Complete(event);
    ASSERT_TRUE(Eventually([&] { return done_calls->load() == 1; }));
    EXPECT_EQ(deferred->code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(deferred->message(), "ops[0] (SortTokens): bad ids");
    EXPECT_EQ(pools.InUse(), 0u);
    EXPECT_EQ(device.streams_released.load(), 1);
    EXPECT_EQ(device.events_destroyed.load(), 1);
  }
}

TEST(CompletionQueueTest, ShutdownWaitsForThePendingItems) {
  ThreadSafeDevice device;
  LeasePools pools(64 << 10, 4 << 20);
  auto done_calls = std::make_shared<std::atomic<int>>(0);
  auto deferred = std::make_shared<absl::Status>();
  auto* const event = reinterpret_cast<StreamDevice::Event>(0x2);
  CompletionQueue queue(&device, pools.pools());
  std::list<CompletionWork> node = Item(pools, event, done_calls, deferred);
  queue.Push(&node);
  std::thread device_thread([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    device.Complete(event);
  });
  queue.Shutdown();  // returns only once the item completed
  EXPECT_EQ(done_calls->load(), 1);
  EXPECT_EQ(pools.InUse(), 0u);
  device_thread.join();
}

// A stream stuck on a client's event that never completes: Shutdown gives
// up at its deadline instead of joining for ever (the process must be able
// to exit), completes the item's ticket and leaks what its device work may
// still use (nothing returned to a pool).
TEST(CompletionQueueTest, ShutdownGivesUpOnAStuckItemAtItsDeadline) {
  ThreadSafeDevice device;
  LeasePools pools(64 << 10, 4 << 20);
  auto done_calls = std::make_shared<std::atomic<int>>(0);
  auto deferred = std::make_shared<absl::Status>();
  auto* const never = reinterpret_cast<StreamDevice::Event>(0x3);
  CompletionQueue queue(&device, pools.pools());
  std::list<CompletionWork> node = Item(pools, never, done_calls, deferred);
  queue.Push(&node);
  std::atomic<bool> returned{false};
  std::thread stopper([&] {
    queue.Shutdown(CompletionQueue::Clock::now() + std::chrono::milliseconds(50));
    returned = true;
  });
  const bool bounded = Eventually([&] { return returned.load(); });
  if (!bounded) device.Complete(never);  // let the old code's join end
  stopper.join();
  ASSERT_TRUE(bounded) << "Shutdown waited past its deadline for an item that never completes";
  EXPECT_EQ(done_calls->load(), 1) << "the ticket is completed";
  EXPECT_EQ(deferred->code(), absl::StatusCode::kUnavailable) << *deferred;
  EXPECT_EQ(queue.abandoned(), 1u);
  EXPECT_EQ(queue.pending(), 0u);
  EXPECT_EQ(pools.InUse(), 1u) << "the workspace is leaked, not back in the pool";
  EXPECT_EQ(device.streams_released.load(), 0) << "the stream is leaked";
  EXPECT_EQ(queue.abandoned_streams().size(), 1u) << "listed: its owner must not synchronize it";
  EXPECT_EQ(device.finishes.load(), 0) << "no Finish of work that may not have run";
}

// After Shutdown nothing polls: an item pushed then is completed at once if
// its work is done, else abandoned with its ticket completed; never left
// pending (which would leak its ticket and hang whoever waits on it).
TEST(CompletionQueueTest, APushAfterShutdownIsNeverLeftPending) {
  ThreadSafeDevice device;
  LeasePools pools(64 << 10, 4 << 20);
  CompletionQueue queue(&device, pools.pools());
  queue.Shutdown();
  auto done_calls = std::make_shared<std::atomic<int>>(0);
  auto deferred = std::make_shared<absl::Status>();
  auto* const done_event = reinterpret_cast<StreamDevice::Event>(0x4);
  device.Complete(done_event);
  std::list<CompletionWork> node = Item(pools, done_event, done_calls, deferred);
  queue.Push(&node);
  EXPECT_EQ(done_calls->load(), 1) << "completed during Push";
  EXPECT_EQ(deferred->message(), "ops[0] (SortTokens): bad ids");
  EXPECT_EQ(pools.InUse(), 0u);
  EXPECT_EQ(device.streams_released.load(), 1);

  auto* const never = reinterpret_cast<StreamDevice::Event>(0x5);
  std::list<CompletionWork> stuck = Item(pools, never, done_calls, deferred);
  queue.Push(&stuck);
  EXPECT_EQ(done_calls->load(), 2) << "abandoned during Push, its ticket completed";
  EXPECT_EQ(deferred->code(), absl::StatusCode::kUnavailable) << *deferred;
  EXPECT_EQ(queue.abandoned(), 1u);
  EXPECT_EQ(queue.pending(), 0u);
  EXPECT_EQ(pools.InUse(), 1u) << "its workspace leaked: its work may still run";
}

}  // namespace
}  // namespace tokensel::testing
