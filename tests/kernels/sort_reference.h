// Naive references and helpers for the SortTokens / TopKTokens tests, written
// independently of the kernels (plain loops, std::sort / std::stable_sort).
#ifndef TOKENSEL_TESTS_KERNELS_SORT_REFERENCE_H_
#define TOKENSEL_TESTS_KERNELS_SORT_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::testing {

// The ids of one row in ascending order.
inline std::vector<int64_t> RefSortRow(std::vector<int64_t> row) {
  std::sort(row.begin(), row.end());
  return row;
}

// inverse[s] = rank of s in `sorted`, -1 when absent.
inline std::vector<int64_t> RefInverseRow(const std::vector<int64_t>& sorted, int64_t s) {
  std::vector<int64_t> inv(static_cast<size_t>(s), -1);
  for (size_t k = 0; k < sorted.size(); ++k)
    inv[static_cast<size_t>(sorted[k])] = static_cast<int64_t>(k);
  return inv;
}

inline float RefBF16ToFloat(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline float RefF16ToFloat(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 31;
  const int man = h & 1023;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man != 0 ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man + 1024), exp - 25);
  }
  return sign ? -v : v;
}

inline float RefF32FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// The r best positions of `row` (higher first, NaN lowest, ties -> lower
// position), returned in ascending position order.
inline std::vector<int64_t> RefTopKRow(const std::vector<float>& row, int64_t r) {
  std::vector<int64_t> pos(row.size());
  std::iota(pos.begin(), pos.end(), 0);
  std::stable_sort(pos.begin(), pos.end(), [&](int64_t a, int64_t b) {
    const float fa = row[static_cast<size_t>(a)];
    const float fb = row[static_cast<size_t>(b)];
    if (std::isnan(fa) || std::isnan(fb)) return !std::isnan(fa) && std::isnan(fb);
    return fa > fb;
  });
  pos.resize(static_cast<size_t>(r));
  std::sort(pos.begin(), pos.end());
  return pos;
}

// Element values of an index tensor, row-major.
inline std::vector<int64_t> ReadIndices(TestTensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.NumElements()));
  for (int64_t i = 0; i < t.NumElements(); ++i) v[static_cast<size_t>(i)] = t.GetIndex(i);
  return v;
}

// Checks that an op wrote nothing outside the elements of `t`: puts back the
// element bytes of `before_elems` (from SnapshotElements), compares the whole
// store with `before_bytes`, then restores the written elements.
inline std::vector<std::vector<uint8_t>> SnapshotElements(TestTensor& t) {
  std::vector<std::vector<uint8_t>> e(static_cast<size_t>(t.NumElements()));
  for (int64_t i = 0; i < t.NumElements(); ++i) e[static_cast<size_t>(i)] = t.ElementBytes(i);
  return e;
}
inline void ExpectOnlyElementsWritten(TestTensor& t, const std::vector<uint8_t>& before_bytes,
                                      const std::vector<std::vector<uint8_t>>& before_elems) {
  const auto after = SnapshotElements(t);
  const size_t size = static_cast<size_t>(kernels::ElementSize(t.dtype()));
  for (int64_t i = 0; i < t.NumElements(); ++i) {
    std::memcpy(t.ElementPtr(i), before_elems[static_cast<size_t>(i)].data(), size);
  }
  EXPECT_TRUE(t.Bytes() == before_bytes) << "bytes outside the view's elements were written";
  for (int64_t i = 0; i < t.NumElements(); ++i) {
    std::memcpy(t.ElementPtr(i), after[static_cast<size_t>(i)].data(), size);
  }
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_KERNELS_SORT_REFERENCE_H_
