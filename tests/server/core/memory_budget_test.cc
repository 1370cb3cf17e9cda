#include "server/core/memory_budget.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/service_metrics.h"
#include "tests/server/core/metric_reader.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::core {
namespace {

using tokensel::testing::StatusIs;

TEST(MemoryBudgetTest, ARequestIsBoundedAloneAndAllTogether) {
  ServiceMetrics metrics("test", "cpu");
  MemoryBudget budget(/*total=*/1000, /*per_request=*/600, &metrics);
  MemoryBudget::Reservation a = budget.Open();
  ASSERT_OK(a.Grow(400, "a"));
  EXPECT_THAT(a.Grow(201, "staging for out"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "staging for out: needs 201 bytes of server memory (400 already held"));
  EXPECT_EQ(a.bytes(), 400u);   // a refused Grow reserves nothing
  ASSERT_OK(a.Grow(200, "a"));  // exactly the per-request bound
  MemoryBudget::Reservation b = budget.Open();
  EXPECT_THAT(b.Grow(401, "scratch of TopKTokens"),
              StatusIs(absl::StatusCode::kResourceExhausted, "requests in flight hold 600"));
  ASSERT_OK(b.Grow(400, "b"));  // exactly the total
  EXPECT_EQ(budget.used_bytes(), 1000u);
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_request_memory_bytes"), 1000);
  a.Shrink(100);
  EXPECT_EQ(budget.used_bytes(), 900u);
  a = MemoryBudget::Reservation();  // released by assignment
  EXPECT_EQ(budget.used_bytes(), 400u);
  {
    MemoryBudget::Reservation moved = std::move(b);
    EXPECT_EQ(budget.used_bytes(), 400u);
  }
  EXPECT_EQ(budget.used_bytes(), 0u);
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_request_memory_bytes"), 0);
}

TEST(MemoryBudgetTest, AnUnboundReservationAcceptsEverything) {
  MemoryBudget::Reservation free;
  EXPECT_FALSE(free.bound());
  EXPECT_OK(free.Grow(UINT64_MAX, "x"));
  EXPECT_OK(free.Grow(5, "x"));  // saturates
  EXPECT_EQ(free.bytes(), UINT64_MAX);
}

TEST(MemoryBudgetTest, ConcurrentReservationsNeverExceedTheTotal) {
  MemoryBudget budget(/*total=*/1 << 20, /*per_request=*/1 << 20, nullptr);
  std::atomic<uint64_t> peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        MemoryBudget::Reservation r = budget.Open();
        if (r.Grow(300 * 1024, "x").ok()) {
          uint64_t used = budget.used_bytes();
          uint64_t seen = peak.load();
          while (used > seen && !peak.compare_exchange_weak(seen, used)) {
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), uint64_t{1} << 20);
  EXPECT_EQ(budget.used_bytes(), 0u);
}

}  // namespace
}  // namespace tokensel::core
