#include "server/grpc/work_queue.h"

#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tokensel::server {
namespace {

TEST(WorkQueueTest, RunsEveryTaskOnItsWorkers) {
  WorkQueue queue(3);
  std::mutex mu;  // not absl::Mutex: TSan cannot see Debian's libabsl locks
  std::vector<int> seen;
  const std::thread::id caller = std::this_thread::get_id();
  bool ran_on_caller = false;
  for (int i = 0; i < 200; ++i) {
    auto owned = std::make_unique<int>(i);  // move-only capture
    queue.Post([&, owned = std::move(owned)] {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(*owned);
      ran_on_caller |= std::this_thread::get_id() == caller;
    });
  }
  queue.Stop();  // runs everything posted before returning
  ASSERT_EQ(seen.size(), 200u);
  std::vector<bool> hit(200, false);
  for (int v : seen) hit[v] = true;
  for (int i = 0; i < 200; ++i) EXPECT_TRUE(hit[i]) << i;
  EXPECT_FALSE(ran_on_caller);
}

TEST(WorkQueueTest, OneWorkerIsFifo) {
  WorkQueue queue(1);
  absl::Notification gate;
  std::vector<int> order;
  queue.Post([&] { gate.WaitForNotification(); });  // hold the worker while we post
  for (int i = 0; i < 50; ++i) queue.Post([&order, i] { order.push_back(i); });
  gate.Notify();
  queue.Stop();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkQueueTest, PostAfterStopRunsInline) {
  WorkQueue queue(2);
  queue.Stop();
  bool ran = false;
  queue.Post([&] { ran = true; });
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace tokensel::server
