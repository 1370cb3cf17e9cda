// tokensel_kernels_bench: CPU operator benchmarks with a ratio table against
// same-run baselines. Typical use (medians of 5 repetitions):
//   tokensel_kernels_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include "benchmark/benchmark.h"
#include "tests/bench/ratio_reporter.h"

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  tokensel::bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
