// Console reporter that also prints, at the end, each benchmark's speed
// relative to the baseline of its case, measured in the same run.
//
// Naming convention: "<case>/<variant>", where exactly one variant of a case
// starts with "baseline" (e.g. "gather.bf16.bsc.t1/op" and
// "gather.bf16.bsc.t1/baseline_memcpy"). With --benchmark_repetitions=N the
// medians are compared; otherwise the single runs. The ratio is
// baseline_time / variant_time: > 1 means the variant is faster.
#ifndef TOKENSEL_TESTS_BENCH_RATIO_REPORTER_H_
#define TOKENSEL_TESTS_BENCH_RATIO_REPORTER_H_

#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace tokensel::bench {

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override;
  void Finalize() override;

 private:
  struct Entry {
    std::string variant;
    double real_time_ns = 0;
    std::map<std::string, double> counters;
  };
  std::vector<std::string> case_order_;
  std::map<std::string, std::vector<Entry>> cases_;
  std::map<std::string, int> repetitions_;
};

}  // namespace tokensel::bench

#endif  // TOKENSEL_TESTS_BENCH_RATIO_REPORTER_H_
