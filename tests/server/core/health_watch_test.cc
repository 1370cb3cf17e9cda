// HealthWatch: the server's health follows Backend::healthy(), with a fake
// backend (a device lost to a sticky CUDA error, without a GPU).
#include "server/core/health_watch.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/backends/fake_device_backend.h"

namespace tokensel::core {
namespace {

TEST(HealthWatchTest, TurnsNotServingOnceWhenTheBackendFails) {
  testing::FakeDevice backend(0, "GPU-0");
  int not_serving = 0;
  HealthWatch watch(&backend, [&] { ++not_serving; });
  EXPECT_TRUE(watch.Poll());
  EXPECT_TRUE(watch.Poll());
  EXPECT_EQ(not_serving, 0) << "a healthy backend leaves health alone";
  backend.set_healthy(false);
  EXPECT_FALSE(watch.Poll());
  EXPECT_EQ(not_serving, 1);
  EXPECT_TRUE(watch.reported());
  EXPECT_FALSE(watch.Poll());
  EXPECT_EQ(not_serving, 1) << "reported once";
}

TEST(HealthWatchTest, ConcurrentPollsReportOnce) {
  testing::FakeDevice backend(0, "GPU-0");
  backend.set_healthy(false);
  std::atomic<int> not_serving{0};
  HealthWatch watch(&backend, [&] { ++not_serving; });
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) EXPECT_FALSE(watch.Poll());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(not_serving.load(), 1);
}

}  // namespace
}  // namespace tokensel::core
