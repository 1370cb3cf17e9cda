// Naive SamplePackedTokens reference for tests, written from the spec
// (../shared/spec/ops.md §11) on top of the naive SampleTokens row
// (sample_reference.h): no code of kernels/ but the Philox function.
#ifndef TOKENSEL_TESTS_KERNELS_SAMPLE_PACKED_REFERENCE_H_
#define TOKENSEL_TESTS_KERNELS_SAMPLE_PACKED_REFERENCE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tests/kernels/sample_reference.h"

namespace tokensel::testing {

struct PackedRule {
  int64_t keep_num = 1, keep_den = 2, min_tokens = 0;
};

// r_i with exact integer arithmetic: keep_den here stays below 2^31, so the
// product n * keep_num fits int64 (the kernels' 128-bit form is tested
// separately against this on scaled fractions).
inline int64_t ReferenceKeep(int64_t n, const PackedRule& rule) {
  int64_t r = (n * rule.keep_num + rule.keep_den - 1) / rule.keep_den;
  r = std::max(r, rule.min_tokens);
  return std::min(r, n);
}

struct PackedExpected {
  std::vector<int64_t> cu_kept;                 // [N+1]
  std::vector<std::vector<int64_t>> ids;        // [L][T']
  std::vector<std::vector<int64_t>> positions;  // [L][T']
  std::vector<std::vector<int64_t>> inverse;    // [L][T]
};

inline PackedExpected ReferenceSamplePacked(const std::vector<int64_t>& cu, int64_t T,
                                            const PackedRule& rule, int64_t L, uint64_t seed,
                                            uint64_t step) {
  PackedExpected e;
  const int64_t N = static_cast<int64_t>(cu.size()) - 1;
  e.cu_kept.assign(cu.size(), 0);
  for (int64_t i = 0; i < N; ++i)
    e.cu_kept[i + 1] = e.cu_kept[i] + ReferenceKeep(cu[i + 1] - cu[i], rule);
  for (int64_t l = 0; l < L; ++l) {
    std::vector<int64_t> ids, pos, inv(T, -1);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t n = cu[i + 1] - cu[i];
      for (int64_t s : ReferenceSampleRow(seed, step, l, i, n, ReferenceKeep(n, rule))) {
        inv[cu[i] + s] = static_cast<int64_t>(ids.size());
        ids.push_back(cu[i] + s);
        pos.push_back(s);
      }
    }
    e.ids.push_back(ids);
    e.positions.push_back(pos);
    e.inverse.push_back(inv);
  }
  return e;
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_KERNELS_SAMPLE_PACKED_REFERENCE_H_
