// tokensel_load_worker: one client process of the load test
// (tests/load/load_test.cc); also usable by hand against any server on the
// same host.
//
//   tokensel_load_worker --target=unix:///run/tokensel/tokensel.sock --shm_prefix=/tokensel
//       --threads=16 --seconds=60 [--max_requests=N] [--seed=S] [--report=-|path]
//       [--hold] [--mix=mixed|big] [--allow_exhausted]
//
// Each thread is a tests/load/load_thread.h LoadThread: its own connection,
// session and shm region, a random mix of every operator, Execute, Stream
// and buffer churn, every result checked against the CPU oracle. One session
// per thread (not per process) so that the server sees 16 x processes
// independent clients, as it would from the ranks of a training job, and so
// that a thread's region has exactly one writer and can be checked exactly.
//
// Protocol on stdout (line-buffered):
//   LOAD-WORKER ready pid=<pid> threads=<n>   every session open, region registered
//   LOAD-WORKER idle                          every thread's loop is over
//   (with --hold: waits for EOF on stdin, sessions still open)
//   then closes every session and writes the report (load_report.h) to
//   --report ("-" = stdout).
// Exit code 0 iff setup and CloseSession succeeded and there were no
// mismatches and no unexpected errors; 2 for bad flags.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/load/load_report.h"
#include "tests/load/load_thread.h"

ABSL_FLAG(std::string, target, "", "Server address, e.g. unix:///run/tokensel/tokensel.sock.");
ABSL_FLAG(std::string, shm_prefix, "", "The server's --shm_prefix (regions are named under it).");
ABSL_FLAG(int, threads, 16, "Client threads, each with its own connection and session.");
ABSL_FLAG(double, seconds, 60, "How long each thread sends requests.");
ABSL_FLAG(int64_t, max_requests, 0, "Per-thread cap on RPCs (0 = only the time bound).");
ABSL_FLAG(uint64_t, seed, 1, "Random seed; thread i uses a seed derived from it.");
ABSL_FLAG(std::string, report, "-", "Where the LOAD-REPORT line goes: - (stdout) or a path.");
ABSL_FLAG(bool, hold, false, "After the loops, wait for EOF on stdin before closing sessions.");
ABSL_FLAG(std::string, mix, "mixed",
          "mixed: every op, Execute, Stream, churn; big: 16 x 1 MiB "
          "gathers per Execute (back-pressure).");
ABSL_FLAG(bool, allow_exhausted, false,
          "RESOURCE_EXHAUSTED is expected (counted as exhausted, not as an error).");

namespace tokensel::load {
namespace {

void Say(const std::string& line) {
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

// p50/p99/max/min of every code's latencies, in microseconds.
void AddLatencies(const std::vector<std::unique_ptr<LoadThread>>& threads, LoadReport* report) {
  std::map<std::string, std::vector<int64_t>> all;
  for (const auto& t : threads) {
    for (const auto& [code, v] : t->latencies_us())
      all[code].insert(all[code].end(), v.begin(), v.end());
  }
  for (auto& [code, latencies] : all) {
    // A named reference: clang 14 (the asan preset) cannot capture a
    // structured binding in a lambda.
    std::vector<int64_t>& v = latencies;
    std::sort(v.begin(), v.end());
    auto at = [&](double q) {
      return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
    };
    report->Set(absl::StrCat("lat_us.", code, ".p50"), at(0.5));
    report->Set(absl::StrCat("lat_us.", code, ".p99"), at(0.99));
    report->Set(absl::StrCat("lat_us.", code, ".max"), v.back());
    report->Set(absl::StrCat("lat_us.", code, ".min"), v.front());
  }
}

void WaitForStdinEof() {
  char buf[256];
  while (true) {
    const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EINTR)) return;
  }
}

int Main() {
  LoadThreadOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.shm_prefix = absl::GetFlag(FLAGS_shm_prefix);
  options.big = absl::GetFlag(FLAGS_mix) == "big";
  options.allow_exhausted = absl::GetFlag(FLAGS_allow_exhausted);
  options.region_bytes = options.big ? (3 << 20) : (1 << 20);
  const int n = absl::GetFlag(FLAGS_threads);
  if (options.target.empty() || options.shm_prefix.empty() || n < 1 ||
      (absl::GetFlag(FLAGS_mix) != "mixed" && !options.big)) {
    std::fprintf(stderr,
                 "tokensel_load_worker: need --target, --shm_prefix, --threads >= 1, "
                 "--mix=mixed|big\n");
    return 2;
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  bool failed = false;
  std::vector<std::unique_ptr<LoadThread>> threads;
  for (int i = 0; i < n && !failed; ++i) {
    threads.push_back(std::make_unique<LoadThread>(i, options, seed * 1000003u + i));
    if (absl::Status s = threads.back()->Setup(); !s.ok()) {
      std::fprintf(stderr, "tokensel_load_worker: setup of thread %d: %s\n", i,
                   s.ToString().c_str());
      failed = true;
    }
  }
  if (!failed) {
    Say(absl::StrCat("LOAD-WORKER ready pid=", getpid(), " threads=", n));
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
    const int64_t max_requests = absl::GetFlag(FLAGS_max_requests);
    std::vector<std::thread> running;
    for (auto& t : threads)
      running.emplace_back([&t, deadline, max_requests] { t->Run(deadline, max_requests); });
    for (auto& th : running) th.join();
    const absl::Duration elapsed = absl::Now() - start;
    Say("LOAD-WORKER idle");
    if (absl::GetFlag(FLAGS_hold)) WaitForStdinEof();
    LoadReport report;
    for (auto& t : threads) {
      if (absl::Status s = t->Close(); !s.ok()) failed = true;
      report.Merge(t->report());
    }
    report.Set("threads", n);
    report.Set("elapsed_ms", absl::ToInt64Milliseconds(elapsed));
    AddLatencies(threads, &report);
    failed |= report.Get("mismatches") > 0 || report.Get("errors") > 0;
    const std::string path = absl::GetFlag(FLAGS_report);
    if (path == "-") {
      Say(report.ToLine());
    } else {
      std::ofstream(path) << report.ToLine() << "\n";
    }
  } else {
    for (auto& t : threads) t->Close().IgnoreError();
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace tokensel::load

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tokensel::load::Main();
}
