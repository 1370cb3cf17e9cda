#include "server/core/memory_budget.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/device_slot.h"
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

// Per-device charge accounts (memory_budget.h): a charge, even beyond the
// total, is seen only by its own device's OverShare, never by a request's
// bytes; ordinals past the slots share one account; a charge given back
// leaves nothing.
TEST(MemoryBudgetTest, ChargesArePerDeviceAndApartFromTheRequests) {
  ServiceMetrics metrics("test", "cpu");
  MemoryBudget budget(/*total=*/1000, /*per_request=*/1000, &metrics);
  MemoryBudget::WeakCharge k = budget.OpenWeakCharge(1);
  MemoryBudget::WeakCharge j = budget.OpenWeakCharge(0);
  k.Set(5000);  // far beyond the total: the memory exists
  EXPECT_TRUE(k.OverShare());
  EXPECT_FALSE(j.OverShare());
  MemoryBudget::Reservation r = budget.Open();
  ASSERT_OK(r.Grow(1000, "inline results"));  // the whole total
  EXPECT_FALSE(j.OverShare());                // at the total, not over it
  MemoryBudget::Reservation other = budget.Open();
  EXPECT_THAT(other.Grow(1, "inline results"),
              StatusIs(absl::StatusCode::kResourceExhausted, "hold 1000 of the server's 1000"));
  j.Set(1);
  EXPECT_TRUE(j.OverShare());
  EXPECT_EQ(budget.request_bytes(), 1000u);
  EXPECT_EQ(budget.charged_bytes(), 5001u);
  EXPECT_EQ(budget.charged_bytes(1), 5000u);
  EXPECT_EQ(budget.used_bytes(), 6001u);
  // Ordinals beyond the slots share the last account.
  MemoryBudget::WeakCharge far = budget.OpenWeakCharge(kMaxSlotDevices);
  MemoryBudget::WeakCharge farther = budget.OpenWeakCharge(kMaxSlotDevices + 7);
  far.Set(3);
  EXPECT_EQ(budget.charged_bytes(kMaxSlotDevices + 7), 3u);
  EXPECT_TRUE(farther.OverShare());  // far's charge, with the requests at the total
  far.Set(0);
  EXPECT_FALSE(farther.OverShare());
  k.Set(0);
  j = MemoryBudget::WeakCharge();  // gives its charge back
  r = MemoryBudget::Reservation();
  EXPECT_EQ(budget.used_bytes(), 0u);
  EXPECT_EQ(budget.charged_bytes(), 0u);
}

}  // namespace
}  // namespace tokensel::core
