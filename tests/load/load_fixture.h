// The load tests' fixture (tests/load/load_test.cc,
// tests/load/backpressure_test.cc): a real tokensel-server on a unix socket
// only (ServerProcess), tokensel_load_worker processes (testing::ChildProcess, path
// from TOKENSEL_LOAD_WORKER_BINARY), their reports merged, /metrics scraped,
// the server's fds read from /proc. Durations come from the environment
// (EnvSeconds). On failure the server's output tail goes to stderr.
#ifndef TOKENSEL_TESTS_LOAD_LOAD_FIXTURE_H_
#define TOKENSEL_TESTS_LOAD_LOAD_FIXTURE_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/load/load_report.h"
#include "tests/load/proc_stats.h"
#include "tests/testing/child_process.h"
#include "tests/testing/http_get.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

#ifndef TOKENSEL_LOAD_WORKER_BINARY
#error "TOKENSEL_LOAD_WORKER_BINARY must be defined to the tokensel_load_worker path"
#endif

namespace tokensel::load {

using ::tokensel::testing::ChildProcess;
using ::tokensel::testing::HttpGet;
using ::tokensel::testing::MetricSum;
using ::tokensel::testing::MetricValue;
using ::tokensel::testing::ServerProcess;

// Under AddressSanitizer freed memory sits in the allocator's quarantine
// (256 MB by default) and RSS grows regardless of leaks: the RSS bounds are
// reported but not asserted there (kAsan); the clean exit at the end
// (LeakSanitizer runs at exit) covers leaks instead.
using ::tokensel::testing::kAsan;

inline constexpr int kProcesses = 4;
inline constexpr int kThreadsPerProcess = 16;
inline constexpr char kReady[] = "LOAD-WORKER ready";
inline constexpr char kIdle[] = "LOAD-WORKER idle";

inline double EnvSeconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  double s = 0;
  return v != nullptr && absl::SimpleAtod(v, &s) && s > 0 ? s : fallback;
}

inline double Growth(int64_t from, int64_t to) {
  return from > 0 ? 100.0 * static_cast<double>(to - from) / static_cast<double>(from) : 0;
}

// Targets in `a` but not in `b` (multiset difference), for diagnostics.
inline std::vector<std::string> Minus(std::vector<std::string> a, std::vector<std::string> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

class LoadTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> extra_args) {
    extra_args.push_back("--log_level=warning");
    auto server = ServerProcess::Start({.extra_args = std::move(extra_args), .tcp = false});
    ASSERT_OK(server);
    server_ = std::move(server).value();
  }

  std::vector<std::string> WorkerArgs(int index, double seconds) const {
    return {TOKENSEL_LOAD_WORKER_BINARY, absl::StrCat("--target=", server_->unix_target()),
            absl::StrCat("--shm_prefix=", server_->shm_prefix()),
            absl::StrCat("--seed=", index + 1), absl::StrCat("--seconds=", seconds)};
  }

  std::string Metrics() const {
    auto r = HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_OK(r);
    return r.ok() ? r->body : "";
  }

  // The fd list once it stopped changing (transient connections, e.g. the
  // harness' health check, closed): 5 equal counts 100 ms apart.
  std::vector<std::string> StableFds() const {
    std::vector<std::string> fds;
    size_t last = 0;
    int same = 0;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
         same < 5 && absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(100))) {
      auto r = OpenFds(server_->pid());
      if (!r.ok()) break;
      fds = *std::move(r);
      same = fds.size() == last ? same + 1 : 0;
      last = fds.size();
    }
    return fds;
  }

  // Collects every worker's exit code and report.
  LoadReport Finish(std::vector<std::unique_ptr<ChildProcess>>& workers) {
    LoadReport merged;
    for (auto& w : workers) {
      w->CloseStdin();
      auto code = w->WaitForExit(absl::Now() + absl::Seconds(60));
      EXPECT_OK(code);
      if (code.ok()) {
        EXPECT_EQ(*code, 0) << "worker " << w->pid() << " reported a failure";
      }
      auto line = w->WaitForLine(kReportPrefix, absl::Now() + absl::Seconds(1));
      EXPECT_OK(line);
      if (!line.ok()) continue;
      auto report = LoadReport::Parse(*line);
      EXPECT_TRUE(report.has_value()) << *line;
      if (!report) continue;
      std::printf("[load] worker %d: %s\n", w->pid(), line->c_str());
      // Latency percentiles do not add up: keep the worst worker's.
      for (const auto& [key, n] : report->counters()) {
        if (absl::StartsWith(key, "lat_us.")) {
          merged.Set(key, std::max(merged.Get(key), n));
        } else {
          merged.Add(key, n);
        }
      }
    }
    return merged;
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      std::string out = server_->Output();
      if (out.size() > 8000) out = "..." + out.substr(out.size() - 8000);
      std::fprintf(stderr, "--- server output (tail) ---\n%s\n---\n", out.c_str());
    }
  }

  std::unique_ptr<ServerProcess> server_;
};

}  // namespace tokensel::load

#endif  // TOKENSEL_TESTS_LOAD_LOAD_FIXTURE_H_
