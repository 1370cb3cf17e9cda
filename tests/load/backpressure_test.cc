// Back-pressure under load: a real tokensel-server with --max_inflight=4 and
// one tokensel_load_worker whose 16 threads send Executes of 16 x 1 MiB
// by-reference gathers (--mix=big), for TOKENSEL_LOAD_BACKPRESSURE_SECONDS
// (default 6). Asserted: some requests are refused, none fails otherwise or
// mismatches, refused ones leave the region untouched, the sampled in-flight
// gauge never exceeds 4, and server-side 99% of refusals finish in a lower
// latency bucket than the median admitted Execute (a refusal that waited for
// a slot would take at least as long as an admitted op). No absolute time is
// asserted: this machine is shared and runs the test under the sanitizers;
// the latency of a refusal is a benchmark's business (rpc_bench). The
// measurements are printed to stdout ("[backpressure] ...").
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/load/load_fixture.h"

namespace tokensel::load {
namespace {

// 16 threads of one worker send Executes of 16 x 1 MiB gathers (a few ms
// each) to a server admitting 4 requests: the rest must be refused with
// RESOURCE_EXHAUSTED at once (never queued), leaving the caller's region
// untouched, and every admitted one must still be right.
TEST_F(LoadTest, BackPressureRefusesBeyondMaxInflightAtOnce) {
  const double seconds = EnvSeconds("TOKENSEL_LOAD_BACKPRESSURE_SECONDS", 6);
  constexpr int kMaxInflight = 4;
  ASSERT_NO_FATAL_FAILURE(
      StartServer({"--threads=2", absl::StrCat("--max_inflight=", kMaxInflight)}));
  std::vector<std::string> argv = WorkerArgs(0, seconds);
  for (const char* arg : {"--threads=16", "--mix=big", "--allow_exhausted"}) argv.push_back(arg);
  auto worker = ChildProcess::Start(argv);
  ASSERT_OK(worker);
  ASSERT_OK((*worker)->WaitForLine(kReady, absl::Now() + absl::Seconds(60)));

  // The in-flight gauge, as often as a scrape allows, until the loops end.
  double max_inflight = 0;
  int scrapes = 0;
  const absl::Time limit = absl::Now() + absl::Seconds(seconds + 120);
  while (!(*worker)->WaitForLine(kIdle, absl::Now() + absl::Milliseconds(10)).ok()) {
    ASSERT_LT(absl::Now(), limit) << "worker still running long after its deadline";
    max_inflight =
        std::max(max_inflight, MetricValue(Metrics(), "tokensel_inflight_requests").value_or(0));
    ++scrapes;
  }
  std::vector<std::unique_ptr<ChildProcess>> workers;
  workers.push_back(*std::move(worker));
  const LoadReport report = Finish(workers);
  const std::string metrics = Metrics();

  const int64_t exhausted = report.Get("exhausted");
  const int64_t executed = report.Get("rpc.Execute") - exhausted;
  const int64_t ok_p50 = report.Get("lat_us.OK.p50"), ok_max = report.Get("lat_us.OK.max");
  const int64_t re_p50 = report.Get("lat_us.RESOURCE_EXHAUSTED.p50");
  const int64_t re_p99 = report.Get("lat_us.RESOURCE_EXHAUSTED.p99");
  const int64_t re_max = report.Get("lat_us.RESOURCE_EXHAUSTED.max");
  std::printf(
      "[backpressure] --max_inflight=%d, 16 threads, %.0f s: Executes OK=%lld "
      "RESOURCE_EXHAUSTED=%lld mismatches=%lld errors=%lld; max inflight gauge over %d "
      "scrapes=%.0f\n",
      kMaxInflight, seconds, static_cast<long long>(executed), static_cast<long long>(exhausted),
      static_cast<long long>(report.Get("mismatches")),
      static_cast<long long>(report.Get("errors")), scrapes, max_inflight);
  std::printf(
      "[backpressure] latency us: OK p50=%lld p99=%lld max=%lld min=%lld; "
      "RESOURCE_EXHAUSTED p50=%lld p99=%lld max=%lld\n",
      static_cast<long long>(ok_p50), static_cast<long long>(report.Get("lat_us.OK.p99")),
      static_cast<long long>(ok_max), static_cast<long long>(report.Get("lat_us.OK.min")),
      static_cast<long long>(re_p50), static_cast<long long>(re_p99),
      static_cast<long long>(re_max));
  std::fflush(stdout);

  // Server-side durations (tokensel_rpc_duration_seconds, from the handler's
  // start to Finish): the client-side ones above mostly measure the wait for
  // a core on this 2-core machine, where the server's two op workers and 16
  // client threads compete.
  auto within = [&](absl::string_view code, absl::string_view le) {
    return MetricSum(metrics, "tokensel_rpc_duration_seconds_bucket",
                     {"method=\"Execute\"", absl::StrCat("code=\"", code, "\""),
                      absl::StrCat("le=\"", le, "\"")});
  };
  // The upper bound (as printed) of the bucket holding quantile q.
  auto quantile = [&](absl::string_view code, double q) -> std::string {
    static constexpr const char* kBuckets[] = {"1e-05",  "2.5e-05", "5e-05",  "0.0001", "0.00025",
                                               "0.0005", "0.001",   "0.0025", "0.005",  "0.01",
                                               "0.025",  "0.05",    "0.1",    "0.25",   "0.5",
                                               "1",      "2.5",     "5",      "10"};
    const double total = within(code, "+Inf");
    for (const char* le : kBuckets) {
      if (within(code, le) >= q * total) return le;
    }
    return "+Inf";
  };
  auto seconds_of = [](const std::string& le) {
    double v = 0;
    return absl::SimpleAtod(le, &v) ? v : 1e9;
  };
  const double re_total = within("RESOURCE_EXHAUSTED", "+Inf");
  const std::string re_p99_le = quantile("RESOURCE_EXHAUSTED", 0.99);
  const std::string re_max_le = quantile("RESOURCE_EXHAUSTED", 1.0);
  const std::string ok_p50_le = quantile("OK", 0.5);
  const std::string ok_min_le = quantile("OK", 0.0 + 1e-9);
  std::printf(
      "[backpressure] server-side (rpc_duration buckets, upper bounds in s): refusals "
      "p99 <= %s, max <= %s; admitted Executes min <= %s, p50 <= %s\n",
      re_p99_le.c_str(), re_max_le.c_str(), ok_min_le.c_str(), ok_p50_le.c_str());
  std::fflush(stdout);

  EXPECT_EQ(report.Get("mismatches"), 0);
  EXPECT_EQ(report.Get("errors"), 0);
  EXPECT_GT(executed, 0);
  EXPECT_GT(exhausted, 0) << "16 clients never exceeded --max_inflight=" << kMaxInflight;
  EXPECT_LE(max_inflight, kMaxInflight);
  EXPECT_GT(scrapes, 0);
  // Refusals never wait for a slot: 99% of them land in a lower bucket than
  // the median admitted Execute (which holds a slot for the whole op).
  EXPECT_EQ(re_total, static_cast<double>(exhausted));
  EXPECT_LT(seconds_of(re_p99_le), seconds_of(ok_p50_le)) << "refusals waited like admitted ops";
  EXPECT_EQ(MetricSum(metrics, "tokensel_requests_total",
                      {"method=\"Execute\"", "code=\"RESOURCE_EXHAUSTED\""}),
            static_cast<double>(exhausted));
  EXPECT_EQ(MetricSum(metrics, "tokensel_requests_total", {"method=\"Execute\"", "code=\"OK\""}),
            static_cast<double>(executed));
}

}  // namespace
}  // namespace tokensel::load
