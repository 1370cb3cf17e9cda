// Index-row checks by sorting: O(n log n) time and O(n) memory whatever the
// id range. Used for rows whose bitmap over [0, limit) would be far larger
// than the row itself (e.g. 3 ids in [0, 2^31), or a zero-strided activation
// tensor with a huge S): a bitmap there would let a tiny request allocate and
// scan gigabytes (found by the long fuzz run).
#ifndef TOKENSEL_KERNELS_CPU_ROW_CHECK_H_
#define TOKENSEL_KERNELS_CPU_ROW_CHECK_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/sparse_rows.h"

namespace tokensel::kernels::cpu {

// The path rule, PreferSortingToBitmap, is kernels/sparse_rows.h (shared
// with the CUDA layouts).

// Sorts `values` ascending; true when they are unique and all in [0, limit).
inline bool SortAndCheckUniqueInRange(std::vector<int64_t>* values, int64_t limit) {
  std::sort(values->begin(), values->end());
  if (values->empty()) return true;
  if (values->front() < 0 || values->back() >= limit) return false;
  return std::adjacent_find(values->begin(), values->end()) == values->end();
}

// The first offending element of a row of ids.
struct BadPosition {
  int64_t position = -1;  // lowest position out of range or repeating an earlier id; -1: none
  int64_t first = -1;     // for a repeat, the lowest position holding the same id; else -1
};

// The same answer a left-to-right scan with a bitmap gives, in O(n log n).
inline BadPosition FirstBadPosition(const std::vector<int64_t>& values, int64_t limit) {
  std::vector<std::pair<int64_t, int64_t>> by_value(values.size());  // (value, position)
  for (size_t i = 0; i < values.size(); ++i) by_value[i] = {values[i], static_cast<int64_t>(i)};
  std::sort(by_value.begin(), by_value.end());
  BadPosition bad;
  size_t run_start = 0;  // first entry of the current run of equal values
  for (size_t k = 0; k < by_value.size(); ++k) {
    const auto [value, pos] = by_value[k];
    if (k > 0 && by_value[k - 1].first != value) run_start = k;
    if (bad.position >= 0 && pos >= bad.position) continue;
    if (value < 0 || value >= limit) {
      bad = {pos, -1};
    } else if (k != run_start) {
      bad = {pos, by_value[run_start].second};
    }
  }
  return bad;
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_ROW_CHECK_H_
