// Latency statistics for `tokensel bench` and `tokensel demo`.
//
//   LatencyStats stats;
//   stats.Add(12.5);                 // microseconds, one call
//   stats.Percentile(0.99);          // nearest rank
//
// Percentiles use the nearest-rank definition: the smallest recorded value v
// such that at least q * n values are <= v (q in (0, 1]; q = 0 gives the
// minimum). Not thread-safe: keep one per thread and Merge() at the end.
#ifndef TOKENSEL_CLIENT_CLI_LATENCY_STATS_H_
#define TOKENSEL_CLIENT_CLI_LATENCY_STATS_H_

#include <cstdint>
#include <vector>

namespace tokensel::cli {

class LatencyStats {
 public:
  void Add(double micros) {
    values_.push_back(micros);
    sorted_ = false;
  }
  void Merge(const LatencyStats& other);

  int64_t count() const { return static_cast<int64_t>(values_.size()); }
  // 0 when empty.
  double Percentile(double q) const;
  double Mean() const;
  double Max() const { return Percentile(1.0); }

 private:
  void Sort() const;

  mutable std::vector<double> values_;
  mutable bool sorted_ = true;
};

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_LATENCY_STATS_H_
