// tokensel_kernels_bench: CPU operator benchmarks with a ratio table against
// same-run baselines. Typical use (medians of 5 repetitions):
//   tokensel_kernels_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// --stop_token runs every op with a stop token installed (one that never
// fires, as costly as a server's: an atomic flag and a clock read), to
// measure what the per-chunk checks and the finer chunking cost.
#include <atomic>
#include <chrono>
#include <cstring>

#include "benchmark/benchmark.h"
#include "kernels/cpu/stop.h"
#include "tests/bench/ratio_reporter.h"

namespace {

class NeverFiringToken : public tokensel::kernels::cpu::StopToken {
 public:
  absl::Status Check() const override {
    if (cancelled_.load(std::memory_order_relaxed)) return absl::CancelledError("cancelled");
    if (std::chrono::steady_clock::now() > deadline_) {
      return absl::DeadlineExceededError("deadline");
    }
    return absl::OkStatus();
  }

 private:
  std::atomic<bool> cancelled_{false};
  std::chrono::steady_clock::time_point deadline_ =
      std::chrono::steady_clock::now() + std::chrono::hours(24 * 365);
};

}  // namespace

int main(int argc, char** argv) {
  bool stop_token = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stop_token") == 0) {
      stop_token = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  NeverFiringToken token;
  tokensel::kernels::cpu::ScopedStopToken scope(stop_token ? &token : nullptr);
  tokensel::bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
