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
  absl::Status CheckUsable() const override {
    return marked_out_of_service.load() > 0 || sticky.load()
               ? absl::UnavailableError("out of service")
               : absl::OkStatus();
  }
  absl::StatusOr<bool> QueryStream(Stream) override {
    if (fail_queries.load()) return absl::InternalError("injected stream query failure");
    return false;
  }
  void MarkOutOfService(absl::string_view) override { ++marked_out_of_service; }
  bool ContextFailed() const override { return sticky.load(); }
  absl::StatusOr<Event> OpenIpcEvent(absl::string_view, absl::string_view) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<Event> CreateEvent() override { return absl::UnimplementedError(""); }
  void DestroyEvent(Event) override { ++events_destroyed; }
  absl::Status WaitEvent(Stream, Event, absl::string_view) override { return {}; }
  absl::Status RecordEvent(Event, Stream, absl::string_view) override { return {}; }
  absl::StatusOr<bool> EventDone(Event e) override {
    ++queries;
    if (fail_queries.load()) return absl::InternalError("injected event query failure");
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
  std::atomic<bool> fail_queries{false};  // EventDone and QueryStream fail
  std::atomic<bool> sticky{false};        // the context failed (ContextFailed)

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

// The review's scenario: item A's queries keep failing without a sticky
// error, so A is abandoned and the device marked out of service; item B's
// next failed query must abandon B too (its context may still run B's
// work, B's stream may still wait on a client's event), never complete it:
// completing returns B's blocks to the pools, its stream to the idle list
// and leaves the FreeGate (which may open it). Both tickets complete.
TEST(CompletionQueueTest, AMarkedDeviceAbandonsItemsItCannotQuery) {
  ThreadSafeDevice device;
  LeasePools pools(64 << 10, 4 << 20);
  auto done_calls = std::make_shared<std::atomic<int>>(0);
  auto deferred = std::make_shared<absl::Status>();
  CompletionQueue queue(&device, pools.pools());
  queue.set_failed_query_limit(std::chrono::milliseconds(0));
  device.fail_queries = true;
  std::list<CompletionWork> a =
      Item(pools, reinterpret_cast<StreamDevice::Event>(0x6), done_calls, deferred);
  std::list<CompletionWork> b =
      Item(pools, reinterpret_cast<StreamDevice::Event>(0x7), done_calls, deferred);
  for (std::list<CompletionWork>* item : {&a, &b}) {
    pools.gate.Enter();  // as a chain with a client wait
    item->front().gate = &pools.gate;
    queue.Push(item);
  }
  ASSERT_TRUE(Eventually([&] { return done_calls->load() == 2; }));
  EXPECT_GE(device.marked_out_of_service.load(), 1);
  EXPECT_EQ(queue.abandoned(), 2u) << "an item was completed on a device only marked";
  EXPECT_EQ(device.streams_released.load(), 0) << "a stream went back to the idle list";
  EXPECT_EQ(pools.InUse(), 2u) << "a workspace went back to its pool";
  EXPECT_FALSE(pools.gate.open()) << "the gate was left";
  EXPECT_EQ(device.finishes.load(), 0);
}

// With a sticky error the context runs nothing more: a failed query
// completes the item (its error the deferred one) and returns everything.
TEST(CompletionQueueTest, AFailedContextCompletesItsItems) {
  ThreadSafeDevice device;
  LeasePools pools(64 << 10, 4 << 20);
  auto done_calls = std::make_shared<std::atomic<int>>(0);
  auto deferred = std::make_shared<absl::Status>();
  CompletionQueue queue(&device, pools.pools());
  device.fail_queries = true;
  device.sticky = true;
  std::list<CompletionWork> node =
      Item(pools, reinterpret_cast<StreamDevice::Event>(0x8), done_calls, deferred);
  queue.Push(&node);
  ASSERT_TRUE(Eventually([&] { return done_calls->load() == 1; }));
  EXPECT_EQ(deferred->code(), absl::StatusCode::kInternal) << *deferred;
  EXPECT_EQ(queue.abandoned(), 0u);
  EXPECT_EQ(device.streams_released.load(), 1);
  EXPECT_EQ(pools.InUse(), 0u);
}

}  // namespace
}  // namespace tokensel::testing
