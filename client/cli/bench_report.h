// Results of `tokensel bench`: per-op latency statistics, errors by status
// code and bytes, printed as a table or as one JSON object.
#ifndef TOKENSEL_CLIENT_CLI_BENCH_REPORT_H_
#define TOKENSEL_CLIENT_CLI_BENCH_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "client/cli/bench_workload.h"
#include "client/cli/latency_stats.h"

namespace tokensel::cli {

struct OpResult {
  LatencyStats latency_us;                // successful calls only
  std::map<std::string, int64_t> errors;  // status code name -> count
  int64_t bytes = 0;                      // tensor bytes of the successful calls

  int64_t error_count() const;
  void Merge(const OpResult& other);
};

struct PhaseResult {
  double seconds = 0;  // wall time of the measured part
  std::map<BenchOp, OpResult> ops;

  OpResult Total() const;
};

struct BenchConfig {
  std::string target;
  bool by_reference = false;
  int concurrency = 1;
  double rate = 0;  // 0 = closed loop
  std::string mix;
  BenchShapes shapes;
};

// The table (and, with a baseline, the Ping p50 and the overhead ratios
// op_p50 / ping_p50).
std::string FormatText(const BenchConfig& config, const PhaseResult& result,
                       const std::optional<PhaseResult>& baseline);
// {"config":{...},"ops":{"gather":{"count":..,"ops_per_s":..,"p50_us":..,
//  "p90_us","p99_us","p999_us","max_us","mean_us","bytes_per_s",
//  "errors":{"CODE":n}}},"total":{...},"baseline":{"ping":{...},
//  "ratio_p50":{"gather":..}}}
std::string FormatJson(const BenchConfig& config, const PhaseResult& result,
                       const std::optional<PhaseResult>& baseline);

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_BENCH_REPORT_H_
