#include "server/core/admission.h"

#include <atomic>
#include <optional>
#include <thread>
#include <utility>

#include "gtest/gtest.h"
#include "server/core/service_metrics.h"
#include "tests/server/core/metric_reader.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::core {
namespace {

using tokensel::testing::StatusIs;

TEST(AdmissionTest, BoundsRequestsInFlight) {
  Admission admission(2, nullptr);
  absl::StatusOr<Admission::Ticket> a = admission.Admit();
  absl::StatusOr<Admission::Ticket> b = admission.Admit();
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(admission.inflight(), 2u);
  EXPECT_THAT(admission.Admit(), StatusIs(absl::StatusCode::kResourceExhausted, "max_inflight"));
  EXPECT_EQ(admission.inflight(), 2u);
  a = absl::CancelledError("release");  // destroys the ticket
  EXPECT_EQ(admission.inflight(), 1u);
  EXPECT_OK(admission.Admit());  // admitted, and released at once (temporary)
  EXPECT_EQ(admission.inflight(), 1u);
}

TEST(AdmissionTest, MovedTicketsReleaseExactlyOnce) {
  Admission admission(4, nullptr);
  {
    Admission::Ticket t1 = *admission.Admit();
    Admission::Ticket t2 = std::move(t1);
    EXPECT_EQ(admission.inflight(), 1u);
    Admission::Ticket t3 = *admission.Admit();
    EXPECT_EQ(admission.inflight(), 2u);
    t3 = std::move(t2);  // t3's own slot is released, t2's is taken over
    EXPECT_EQ(admission.inflight(), 1u);
  }
  EXPECT_EQ(admission.inflight(), 0u);
}

TEST(AdmissionTest, DrainRefusesNewRequestsAndWaitsForInFlight) {
  Admission admission(4, nullptr);
  std::optional<Admission::Ticket> held(*admission.Admit());
  std::atomic<bool> drained{false};
  bool drain_result = false;
  std::thread drainer([&] {
    drain_result = admission.Drain(absl::Seconds(60));
    drained = true;
  });
  while (!admission.draining()) std::this_thread::yield();
  EXPECT_THAT(admission.Admit(), StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
  // The ticket is still held, so Drain cannot have returned true.
  EXPECT_FALSE(drained.load());
  held.reset();
  drainer.join();
  EXPECT_TRUE(drain_result);
  EXPECT_EQ(admission.inflight(), 0u);
  EXPECT_THAT(admission.Admit(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(AdmissionTest, DrainReportsWorkLeftAfterTimeout) {
  Admission admission(4, nullptr);
  Admission::Ticket held = *admission.Admit();
  EXPECT_FALSE(admission.Drain(absl::Milliseconds(1)));
  EXPECT_TRUE(admission.draining());
  EXPECT_EQ(admission.inflight(), 1u);
}

TEST(AdmissionTest, DrainWithNothingInFlightReturnsAtOnce) {
  Admission admission(4, nullptr);
  EXPECT_TRUE(admission.Drain(absl::ZeroDuration()));
}

TEST(AdmissionTest, InflightGauge) {
  ServiceMetrics metrics("test", "cpu");
  Admission admission(4, &metrics);
  {
    Admission::Ticket a = *admission.Admit();
    Admission::Ticket b = *admission.Admit();
    EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_inflight_requests"), 2);
  }
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_inflight_requests"), 0);
}

}  // namespace
}  // namespace tokensel::core
