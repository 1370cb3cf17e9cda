// ServiceMetrics through the Prometheus text exposition a scrape would see.
#include "server/core/service_metrics.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace tokensel::core {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Scrape(const ServiceMetrics& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
}

// The value on the exposition line that starts with `series` + " ", or -1.
double Value(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      return std::stod(std::string(line.substr(series.size() + 1)));
    }
  }
  return -1;
}

const prometheus::MetricFamily* Find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name) {
  for (const auto& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(ServiceMetricsTest, ExposesEveryMetricWithItsType) {
  ServiceMetrics metrics("1.2.3", "cpu");
  // RPC families have no series (and so no exposition) until the first RPC.
  EXPECT_THAT(Scrape(metrics), Not(HasSubstr("tokensel_rpc_duration_seconds")));
  metrics.ObserveRpc("Ping", "OK", 1e-5);
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_op_duration_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_rpc_duration_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_requests_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_bytes_moved_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_registered_buffers gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_registered_bytes gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_sessions gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_inflight_requests gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_event_executes gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_event_executes_refused_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE tokensel_build_info gauge"));
  EXPECT_THAT(text, HasSubstr("# HELP tokensel_op_duration_seconds "));
  EXPECT_EQ(Value(text, "tokensel_build_info{backend=\"cpu\",version=\"1.2.3\"}"), 1);
}

TEST(ServiceMetricsTest, OpSeriesExistForAllEightOpsFromTheStart) {
  ServiceMetrics metrics("v", "cuda");
  const std::string text = Scrape(metrics);
  for (const char* op : {"SortTokens", "GatherTokens", "ScatterTokens", "GatherBertMask",
                         "SliceGptMask", "SegmentSeqlens", "SampleTokens", "TopKTokens"}) {
    EXPECT_EQ(
        Value(text, absl::StrCat(
                        "tokensel_op_duration_seconds_count{backend=\"cuda\",device=\"cuda\",op=\"",
                        op, "\"}")),
        0)
        << op;
    EXPECT_EQ(Value(text, absl::StrCat("tokensel_bytes_moved_total{op=\"", op, "\"}")), 0) << op;
  }
  // RPC series are created on first use only.
  EXPECT_THAT(text, Not(HasSubstr("tokensel_requests_total")));
}

TEST(ServiceMetricsTest, BucketBoundsAreTheLatencyBuckets) {
  const std::vector<double>& b = ServiceMetrics::LatencyBuckets();
  ASSERT_EQ(b.size(), 19u);
  EXPECT_DOUBLE_EQ(b.front(), 1e-5);
  EXPECT_DOUBLE_EQ(b[1], 2.5e-5);
  EXPECT_DOUBLE_EQ(b[6], 1e-3);
  EXPECT_DOUBLE_EQ(b.back(), 10.0);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);

  ServiceMetrics metrics("v", "cpu");
  const auto families = metrics.registry()->Collect();
  const prometheus::MetricFamily* op = Find(families, "tokensel_op_duration_seconds");
  ASSERT_NE(op, nullptr);
  ASSERT_FALSE(op->metric.empty());
  const auto& buckets = op->metric[0].histogram.bucket;
  ASSERT_EQ(buckets.size(), b.size() + 1);  // + the +Inf bucket
  EXPECT_DOUBLE_EQ(buckets[0].upper_bound, 1e-05);
  EXPECT_DOUBLE_EQ(buckets[b.size() - 1].upper_bound, 10.0);
  EXPECT_THAT(Scrape(metrics), HasSubstr("le=\"1e-05\""));
}

TEST(ServiceMetricsTest, ObserveOpMovesCountSumBucketsAndBytes) {
  ServiceMetrics metrics("v", "cpu");
  metrics.ObserveOp("GatherTokens", "cpu", 30e-6, 1000);
  metrics.ObserveOp("GatherTokens", "cpu", 2e-3, 24);
  metrics.ObserveOp("SortTokens", "cpu", 5e-6, 8);
  const std::string text = Scrape(metrics);
  const std::string gather = "{backend=\"cpu\",device=\"cpu\",op=\"GatherTokens\"}";
  EXPECT_EQ(Value(text, "tokensel_op_duration_seconds_count" + gather), 2);
  EXPECT_NEAR(Value(text, "tokensel_op_duration_seconds_sum" + gather), 2.03e-3, 1e-12);
  // Cumulative buckets: 30 us lands in le=5e-05, 2 ms in le=0.0025.
  EXPECT_EQ(
      Value(
          text,
          "tokensel_op_duration_seconds_bucket{backend=\"cpu\",device=\"cpu\",op=\"GatherTokens\","
          "le=\"2.5e-05\"}"),
      0);
  EXPECT_EQ(
      Value(
          text,
          "tokensel_op_duration_seconds_bucket{backend=\"cpu\",device=\"cpu\",op=\"GatherTokens\","
          "le=\"5e-05\"}"),
      1);
  EXPECT_EQ(
      Value(
          text,
          "tokensel_op_duration_seconds_bucket{backend=\"cpu\",device=\"cpu\",op=\"GatherTokens\","
          "le=\"0.001\"}"),
      1);
  EXPECT_EQ(
      Value(
          text,
          "tokensel_op_duration_seconds_bucket{backend=\"cpu\",device=\"cpu\",op=\"GatherTokens\","
          "le=\"0.0025\"}"),
      2);
  EXPECT_EQ(
      Value(text,
            "tokensel_op_duration_seconds_bucket{backend=\"cpu\",device=\"cpu\",op=\"SortTokens\","
            "le=\"1e-05\"}"),
      1);
  EXPECT_EQ(Value(text, "tokensel_bytes_moved_total{op=\"GatherTokens\"}"), 1024);
  EXPECT_EQ(Value(text, "tokensel_bytes_moved_total{op=\"SortTokens\"}"), 8);
  EXPECT_EQ(Value(text, "tokensel_bytes_moved_total{op=\"TopKTokens\"}"), 0);
}

TEST(ServiceMetricsTest, ObserveRpcCreatesOneSeriesPerMethodAndCode) {
  ServiceMetrics metrics("v", "cpu");
  metrics.ObserveRpc("GatherTokens", "OK", 1e-4);
  metrics.ObserveRpc("GatherTokens", "OK", 3e-4);
  metrics.ObserveRpc("GatherTokens", "INVALID_ARGUMENT", 2e-5);
  metrics.ObserveRpc("Ping", "OK", 1e-5);
  const std::string text = Scrape(metrics);
  EXPECT_EQ(Value(text, "tokensel_requests_total{code=\"OK\",method=\"GatherTokens\"}"), 2);
  EXPECT_EQ(
      Value(text, "tokensel_requests_total{code=\"INVALID_ARGUMENT\",method=\"GatherTokens\"}"), 1);
  EXPECT_EQ(Value(text, "tokensel_requests_total{code=\"OK\",method=\"Ping\"}"), 1);
  EXPECT_EQ(Value(text, "tokensel_rpc_duration_seconds_count{code=\"OK\",method=\"GatherTokens\"}"),
            2);
  EXPECT_NEAR(Value(text, "tokensel_rpc_duration_seconds_sum{code=\"OK\",method=\"GatherTokens\"}"),
              4e-4, 1e-12);
  EXPECT_EQ(Value(text,
                  "tokensel_rpc_duration_seconds_bucket{code=\"OK\",method=\"Ping\","
                  "le=\"1e-05\"}"),
            1);
  const auto families = metrics.registry()->Collect();
  EXPECT_EQ(Find(families, "tokensel_requests_total")->metric.size(), 3u);
}

TEST(ServiceMetricsTest, GaugesHoldTheLastValue) {
  ServiceMetrics metrics("v", "cpu");
  metrics.SetRegisteredBuffers(3);
  metrics.SetRegisteredBytes(4096);
  metrics.SetSessions(2);
  metrics.SetInflight(7);
  metrics.SetInflight(5);
  metrics.SetEventExecutes(3);
  metrics.CountRefusedEventExecute();
  metrics.CountRefusedEventExecute();
  const std::string text = Scrape(metrics);
  EXPECT_EQ(Value(text, "tokensel_event_executes"), 3);
  EXPECT_EQ(Value(text, "tokensel_event_executes_refused_total"), 2);
  EXPECT_EQ(Value(text, "tokensel_registered_buffers"), 3);
  EXPECT_EQ(Value(text, "tokensel_registered_bytes"), 4096);
  EXPECT_EQ(Value(text, "tokensel_sessions"), 2);
  EXPECT_EQ(Value(text, "tokensel_inflight_requests"), 5);
}

TEST(ServiceMetricsTest, OpSeriesPerDeviceFromTheStartAndObservedPerDevice) {
  ServiceMetrics metrics("v", "cuda", {"cuda:0", "cuda:1"});
  metrics.ObserveOp("GatherTokens", "cuda:1", 1e-3, 10);
  metrics.ObserveOp("GatherTokens", "cuda:1", 1e-3, 10);
  metrics.ObserveOp("GatherTokens", "cuda:0", 1e-3, 10);
  const std::string text = Scrape(metrics);
  const std::string prefix = "tokensel_op_duration_seconds_count{backend=\"cuda\",device=\"";
  EXPECT_EQ(Value(text, prefix + "cuda:0\",op=\"SortTokens\"}"), 0);
  EXPECT_EQ(Value(text, prefix + "cuda:1\",op=\"SortTokens\"}"), 0);
  EXPECT_EQ(Value(text, prefix + "cuda:0\",op=\"GatherTokens\"}"), 1);
  EXPECT_EQ(Value(text, prefix + "cuda:1\",op=\"GatherTokens\"}"), 2);
  EXPECT_THAT(text, Not(HasSubstr("device=\"cuda\"")))
      << "no series for a device label that was not given";
  EXPECT_EQ(Value(text, "tokensel_bytes_moved_total{op=\"GatherTokens\"}"), 30);
}

TEST(ServiceMetricsTest, ConcurrentObservationsAreAllCounted) {
  ServiceMetrics metrics("v", "cpu");
  constexpr int kThreads = 8;
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      const std::string code = t % 2 == 0 ? "OK" : "NOT_FOUND";
      for (int i = 0; i < kPerThread; ++i) {
        metrics.ObserveRpc("Execute", code, 1e-4);
        metrics.ObserveOp("ScatterTokens", "cpu", 1e-4, 2);
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::string text = Scrape(metrics);
  EXPECT_EQ(Value(text, "tokensel_requests_total{code=\"OK\",method=\"Execute\"}"),
            kThreads / 2 * kPerThread);
  EXPECT_EQ(Value(text, "tokensel_requests_total{code=\"NOT_FOUND\",method=\"Execute\"}"),
            kThreads / 2 * kPerThread);
  EXPECT_EQ(Value(text, "tokensel_bytes_moved_total{op=\"ScatterTokens\"}"),
            2.0 * kThreads * kPerThread);
  EXPECT_EQ(Value(text,
                  "tokensel_op_duration_seconds_count{backend=\"cpu\",device=\"cpu\",op="
                  "\"ScatterTokens\"}"),
            kThreads * kPerThread);
}

}  // namespace
}  // namespace tokensel::core
