#include "client/cli/latency_stats.h"

#include "gtest/gtest.h"

namespace tokensel::cli {
namespace {

TEST(LatencyStatsTest, NearestRankPercentiles) {
  LatencyStats s;
  EXPECT_EQ(s.Percentile(0.5), 0);
  // 1..100 shuffled: nearest rank p = the value ceil(p * 100).
  for (int i = 0; i < 100; ++i) s.Add(static_cast<double>((i * 37) % 100 + 1));
  EXPECT_EQ(s.count(), 100);
  EXPECT_EQ(s.Percentile(0.5), 50);
  EXPECT_EQ(s.Percentile(0.9), 90);
  EXPECT_EQ(s.Percentile(0.99), 99);
  EXPECT_EQ(s.Percentile(0.999), 100);
  EXPECT_EQ(s.Percentile(0.0), 1);
  EXPECT_EQ(s.Max(), 100);
  EXPECT_DOUBLE_EQ(s.Mean(), 50.5);
}

TEST(LatencyStatsTest, MergeAndSmallCounts) {
  LatencyStats a, b;
  a.Add(10);
  b.Add(30);
  b.Add(20);
  a.Merge(b);
  EXPECT_EQ(a.count(), 3);
  EXPECT_EQ(a.Percentile(0.5), 20);  // rank ceil(1.5) = 2
  EXPECT_EQ(a.Percentile(0.34), 20);
  EXPECT_EQ(a.Percentile(0.33), 10);
  a.Add(5);  // adding after a query re-sorts
  EXPECT_EQ(a.Percentile(0.25), 5);
}

}  // namespace
}  // namespace tokensel::cli
