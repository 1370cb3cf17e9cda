// Helpers for the fault suites: /metrics polling, the server's memory map
// (/proc/<pid>/maps), a GatherTokens case by reference with its CPU-oracle
// result, and the base fixture. (The client process the tests SIGKILL is a
// tests/testing/child_process.h ChildProcess.)
//
//   std::string page;
//   bool released = PollMetrics(server, absl::Seconds(30), &page, [](absl::string_view p) {
//     return Metric(p, "tokensel_sessions") == 0;
//   });
//
// Everything here is test-only and single-threaded unless stated.
#ifndef TOKENSEL_TESTS_SERVER_INTEGRATION_FAULT_UTIL_H_
#define TOKENSEL_TESTS_SERVER_INTEGRATION_FAULT_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/server/integration/client_util.h"
#include "tests/testing/http_get.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::itest {

// The value of `series` on a /metrics page; -1 when absent.
inline double Metric(absl::string_view page, absl::string_view series) {
  return ::tokensel::testing::MetricValue(page, series).value_or(-1);
}

// Scrapes /metrics until `done(page)` (true) or the deadline (false);
// `*page` is the last page read.
inline bool PollMetrics(const ::tokensel::testing::ServerProcess& server, absl::Duration timeout,
                        std::string* page, const std::function<bool(absl::string_view)>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<::tokensel::testing::HttpResponse> r =
        ::tokensel::testing::HttpGet(server.metrics_port(), "/metrics");
    if (r.ok()) {
      *page = std::move(r->body);
      if (done(*page)) return true;
    }
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));  // polling a condition with a deadline
  }
}

// The sessions / buffers / bytes / inflight gauges, for messages.
inline std::string Gauges(absl::string_view page) {
  return absl::StrCat("sessions=", Metric(page, "tokensel_sessions"),
                      " buffers=", Metric(page, "tokensel_registered_buffers"),
                      " bytes=", Metric(page, "tokensel_registered_bytes"),
                      " inflight=", Metric(page, "tokensel_inflight_requests"));
}

// Whether /proc/<pid>/maps has a mapping of POSIX shm object `shm_name`
// ("/name" -> "/dev/shm/name", with " (deleted)" once unlinked).
inline bool MapsShm(pid_t pid, const std::string& shm_name, bool* deleted = nullptr) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::stringstream text;
  text << maps.rdbuf();
  const std::string path = "/dev/shm" + shm_name;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    const bool live = absl::EndsWith(line, " " + path);
    const bool gone = absl::EndsWith(line, " " + path + " (deleted)");
    if (live || gone) {
      if (deleted != nullptr) *deleted = gone;
      return true;
    }
  }
  return false;
}

// GatherTokens (batch_first) by reference: activations [1, S, C] float32 and
// indices [1, R] int32 placed first in a region, then `outputs` outputs
// [1, R, C]. Expected() is the CPU oracle's output bytes.
struct GatherCase {
  GatherCase(uint64_t region_bytes, int64_t s, int64_t c, int64_t r, int outputs)
      : arena(region_bytes) {
    act = arena.Place(DType::kFloat32, {1, s, c});
    idx = arena.Place(DType::kInt32, {1, r});
    for (int i = 0; i < outputs; ++i) outs.push_back(arena.Place(DType::kFloat32, {1, r, c}));
  }
  static uint64_t RegionBytes(int64_t s, int64_t c, int64_t r, int outputs) {
    return uint64_t(s * c * 4) + uint64_t(r * 4) + uint64_t(outputs) * (uint64_t(r * c * 4) + 64) +
           256;
  }
  void Fill(uint8_t* base, std::mt19937_64& rng) const {
    FillBytes(base + act.offset, act.extent_bytes, rng);
    FillIndices(idx.View(base), act.shape[1], /*unique=*/false, rng);
  }
  v1::GatherTokensRequest Request(const std::string& buffer, int out) const {
    v1::GatherTokensRequest req;
    *req.mutable_activations() = act.Ref(buffer);
    *req.mutable_indices() = idx.Ref(buffer);
    *req.mutable_out() = outs[out].Ref(buffer);
    req.set_batch_first(true);
    return req;
  }
  std::vector<uint8_t> Expected(uint8_t* base) const {
    std::vector<uint8_t> expect(outs[0].extent_bytes);
    Placed local = outs[0];
    local.offset = 0;
    const absl::Status s = kernels::cpu::GatherTokens(
        {act.View(base), idx.View(base), local.View(expect.data()), true}, nullptr);
    if (!s.ok()) expect.clear();  // a test bug; the comparison then fails
    return expect;
  }

  Arena arena;
  Placed act, idx;
  std::vector<Placed> outs;
};

// Base fixture of the fault suites: one real server per test (StartServer),
// whose output is printed when the test failed.
class FaultServerTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> args) {
    auto server = ::tokensel::testing::ServerProcess::Start({.extra_args = std::move(args)});
    ASSERT_OK(server);
    server_ = std::move(server).value();
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      std::string out = server_->Output();
      if (out.size() > 8000) out = "..." + out.substr(out.size() - 8000);
      std::fprintf(stderr, "--- server output (tail) ---\n%s\n---\n", out.c_str());
    }
  }

  // The /metrics page; a failed scrape fails the test and returns "".
  std::string Scrape() const {
    auto page = ::tokensel::testing::HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_OK(page.status());
    return page.ok() ? page->body : "";
  }

  std::mt19937_64 rng_{20240611};
  std::unique_ptr<::tokensel::testing::ServerProcess> server_;
};

}  // namespace tokensel::itest

#endif  // TOKENSEL_TESTS_SERVER_INTEGRATION_FAULT_UTIL_H_
