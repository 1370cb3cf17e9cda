// Naive SampleTokens reference for tests, written from the contract text in
// kernels/sample_math.h without using it: one Philox4x32-10 call per position
// (kernels/philox.h, itself checked against the Random123 known answers), a
// stable sort of positions by key, the first R, sorted by position.
#ifndef TOKENSEL_TESTS_KERNELS_SAMPLE_REFERENCE_H_
#define TOKENSEL_TESTS_KERNELS_SAMPLE_REFERENCE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::testing {

inline uint64_t ReferenceSampleKey(uint64_t seed, uint64_t step, int64_t l, int64_t b, int64_t s) {
  kernels::Philox4x32Counter counter;
  counter.v[0] = static_cast<uint32_t>(s / 2);
  counter.v[1] = static_cast<uint32_t>(b);
  counter.v[2] = static_cast<uint32_t>(l);
  counter.v[3] = static_cast<uint32_t>(step);
  kernels::Philox4x32Key key;
  key.v[0] = static_cast<uint32_t>(seed & 0xFFFFFFFFu);
  key.v[1] = static_cast<uint32_t>(seed >> 32);
  const kernels::Philox4x32Counter out = kernels::Philox4x32_10(counter, key);
  const uint32_t hi = (s % 2 == 0) ? out.v[0] : out.v[2];
  const uint32_t lo = (s % 2 == 0) ? out.v[1] : out.v[3];
  return (static_cast<uint64_t>(hi) << 32) + lo;
}

// The ascending ids of row (l, b).
inline std::vector<int64_t> ReferenceSampleRow(uint64_t seed, uint64_t step, int64_t l, int64_t b,
                                               int64_t S, int64_t R) {
  std::vector<uint64_t> keys(S);
  for (int64_t s = 0; s < S; ++s) keys[s] = ReferenceSampleKey(seed, step, l, b, s);
  std::vector<int64_t> order(S);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return keys[x] < keys[y]; });
  order.resize(R);
  std::sort(order.begin(), order.end());
  return order;
}

// After an op wrote the elements of `t` (whose whole buffer was filled with
// `poison` before), puts the poison back into the elements and checks that
// the buffer equals `before`: the op wrote nothing outside its elements.
inline bool OnlyElementsWritten(TestTensor& t, const std::vector<uint8_t>& before, uint8_t poison) {
  const int64_t n = t.NumElements();
  const int64_t size = kernels::ElementSize(t.dtype());
  for (int64_t i = 0; i < n; ++i) std::memset(t.ElementPtr(i), poison, size);
  return t.Bytes() == before;
}

// ------------------------------------------------- SampleTokens test helpers

inline constexpr uint8_t kPoison = 0xA5;

// ids [L,B,R] (and inverse [L,B,S] int32), every byte poisoned.

struct Outputs {
  TestTensor ids;
  std::optional<TestTensor> inverse;
  std::vector<uint8_t> ids_before, inverse_before;
};

inline Outputs MakeOutputs(int64_t L, int64_t B, int64_t S, int64_t R, kernels::DType dtype,
                           bool inverse, const Layout& layout = {}) {
  Outputs o;
  o.ids = TestTensor(dtype, {L, B, R}, layout);
  o.ids.Fill(kPoison);
  o.ids_before = o.ids.Bytes();
  if (inverse) {
    o.inverse = TestTensor(kernels::DType::kInt32, {L, B, S}, layout);
    o.inverse->Fill(kPoison);
    o.inverse_before = o.inverse->Bytes();
  }
  return o;
}

inline kernels::SampleTokensArgs MakeArgs(int64_t L, int64_t B, int64_t S, int64_t R, uint64_t seed,
                                          uint64_t step, Outputs& o) {
  kernels::SampleTokensArgs args;
  args.layers = L;
  args.batch = B;
  args.original_tokens = S;
  args.retained_tokens = R;
  args.seed = seed;
  args.step = step;
  args.ids = o.ids.view();
  if (o.inverse) args.inverse = o.inverse->view();
  return args;
}

inline std::vector<int64_t> Row(TestTensor& ids, int64_t row) {
  const int64_t R = ids.shape()[2];
  std::vector<int64_t> v(R);
  for (int64_t i = 0; i < R; ++i) v[i] = ids.GetIndex(row * R + i);
  return v;
}

// Checks ids (and inverse) of every row against the naive reference and that
// nothing outside the elements was written.
inline void ExpectMatchesReference(Outputs& o, int64_t L, int64_t B, int64_t S, int64_t R,
                                   uint64_t seed, uint64_t step) {
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t row = l * B + b;
      const std::vector<int64_t> expected = ReferenceSampleRow(seed, step, l, b, S, R);
      ASSERT_EQ(Row(o.ids, row), expected) << "row " << l << "," << b << " S=" << S;
      if (!o.inverse) continue;
      std::vector<int64_t> inv(S, -1);
      for (int64_t i = 0; i < R; ++i) inv[expected[i]] = i;
      for (int64_t s = 0; s < S; ++s) {
        ASSERT_EQ(o.inverse->Get<int32_t>(row * S + s), inv[s]) << "inverse s=" << s;
      }
    }
  }
  EXPECT_TRUE(OnlyElementsWritten(o.ids, o.ids_before, kPoison));
  if (o.inverse) {
    EXPECT_TRUE(OnlyElementsWritten(*o.inverse, o.inverse_before, kPoison));
  }
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_KERNELS_SAMPLE_REFERENCE_H_
