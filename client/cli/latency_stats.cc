#include "client/cli/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tokensel::cli {

void LatencyStats::Merge(const LatencyStats& other) {
  values_.insert(values_.end(), other.values_.begin(), other.values_.end());
  sorted_ = false;
}

void LatencyStats::Sort() const {
  if (!sorted_) {
    std::sort(values_.begin(), values_.end());
    sorted_ = true;
  }
}

double LatencyStats::Percentile(double q) const {
  if (values_.empty()) return 0;
  Sort();
  const double n = static_cast<double>(values_.size());
  // Rank ceil(q * n), 1-based; clamp to [1, n]. The small epsilon keeps
  // q * n that is an integer in exact arithmetic (0.9 * 10) from rounding up.
  double rank = std::ceil(q * n - 1e-9);
  rank = std::clamp(rank, 1.0, n);
  return values_[static_cast<size_t>(rank) - 1];
}

double LatencyStats::Mean() const {
  if (values_.empty()) return 0;
  return std::accumulate(values_.begin(), values_.end(), 0.0) / static_cast<double>(values_.size());
}

}  // namespace tokensel::cli
