// SortTokens: spec vectors, every spec error, metadata errors, and randomized
// comparison with a naive std::sort reference over dtypes, layouts, sizes and
// thread counts. On every error nothing may be written.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/sort_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::kernels::cpu {
namespace {

namespace tt = ::tokensel::testing;
using ::testing::ElementsAreArray;
using tt::Layout;
using tt::StatusIs;
using tt::TestTensor;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TestTensor MakeIds(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& values,
                   Layout layout = {}) {
  TestTensor t(dtype, std::move(shape), layout);
  t.Fill(0xAB);
  for (size_t i = 0; i < values.size(); ++i) t.SetIndex(static_cast<int64_t>(i), values[i]);
  return t;
}

// A spec vector, run in place and out of place for both index dtypes.
struct Vector {
  std::vector<int64_t> shape;
  int64_t s;
  std::vector<int64_t> in;
  std::vector<int64_t> expected;
};

class SortSpecTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(SortSpecTest, Vectors) {
  const auto [dtype, in_place] = GetParam();
  const std::vector<Vector> vectors = {
      {{1, 1, 4}, 10, {7, 2, 9, 0}, {0, 2, 7, 9}},
      {{2, 2, 3}, 6, {5, 1, 3, 0, 4, 2, 2, 5, 0, 1, 3, 4}, {1, 3, 5, 0, 2, 4, 0, 2, 5, 1, 3, 4}},
      {{5}, 5, {4, 0, 3, 1, 2}, {0, 1, 2, 3, 4}},
      {{2, 1, 1}, 4, {3, 0}, {3, 0}},
      {{5}, 7, {6, 0, 3, 5, 1}, {0, 1, 3, 5, 6}},
  };
  for (const Vector& v : vectors) {
    SCOPED_TRACE(::testing::PrintToString(v.in));
    TestTensor ids = MakeIds(dtype, v.shape, v.in);
    TestTensor out(dtype, v.shape);
    SortTokensArgs args{ids.view(), v.s, std::nullopt, std::nullopt};
    if (!in_place) args.out = out.view();
    ASSERT_OK(SortTokens(args, nullptr));
    EXPECT_THAT(tt::ReadIndices(in_place ? ids : out), ElementsAreArray(v.expected));
    if (!in_place) {
      EXPECT_THAT(tt::ReadIndices(ids), ElementsAreArray(v.in));
    }
  }
}

TEST_P(SortSpecTest, Inverse) {
  const auto [dtype, in_place] = GetParam();
  TestTensor ids = MakeIds(dtype, {1, 1, 4}, {7, 2, 9, 0});
  TestTensor out(dtype, {1, 1, 4});
  TestTensor inv(DType::kInt32, {1, 1, 10});
  inv.Fill(0x5A);
  SortTokensArgs args{ids.view(), 10, std::nullopt, inv.view()};
  if (!in_place) args.out = out.view();
  ASSERT_OK(SortTokens(args, nullptr));
  EXPECT_THAT(tt::ReadIndices(in_place ? ids : out), ElementsAreArray({0, 2, 7, 9}));
  EXPECT_THAT(tt::ReadIndices(inv), ElementsAreArray({0, -1, 1, -1, -1, -1, -1, 2, -1, 3}));
}

// Runs an op expected to fail and checks that ids, out and inverse are
// byte-identical afterwards.
void ExpectSortError(DType dtype, std::vector<int64_t> shape, int64_t s,
                     const std::vector<int64_t>& in, const std::string& message) {
  for (const bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    TestTensor ids = MakeIds(dtype, shape, in);
    TestTensor out(dtype, shape);
    out.Fill(0xCD);
    std::vector<int64_t> inv_shape = shape;
    inv_shape.back() = s > 0 && s < 1000 ? s : 1;
    TestTensor inv(DType::kInt32, inv_shape);
    inv.Fill(0xEF);
    const auto ids_before = ids.Bytes();
    const auto out_before = out.Bytes();
    const auto inv_before = inv.Bytes();
    SortTokensArgs args{ids.view(), s, std::nullopt, inv.view()};
    if (!in_place) args.out = out.view();
    EXPECT_THAT(SortTokens(args, nullptr), StatusIs(kInvalid, message));
    EXPECT_EQ(ids.Bytes(), ids_before);
    EXPECT_EQ(out.Bytes(), out_before);
    EXPECT_EQ(inv.Bytes(), inv_before);
  }
}

TEST_P(SortSpecTest, SpecErrors) {
  const DType dtype = std::get<0>(GetParam());
  ExpectSortError(dtype, {4}, 5, {3, 1, 3, 0},
                  "ids[2] = 3 duplicates ids[0] (indices must be unique within a row)");
  ExpectSortError(dtype, {2}, 5, {1, 5}, "ids[1] = 5 is out of range [0, 5)");
  ExpectSortError(dtype, {2}, 5, {1, -2}, "ids[1] = -2 is out of range [0, 5)");
  ExpectSortError(dtype, {3, 0}, 5, {}, "ids: R must be >= 1");
  ExpectSortError(dtype, {1, 3}, 2, {0, 1, 1}, "ids: R = 3 exceeds original_tokens S = 2");
}

INSTANTIATE_TEST_SUITE_P(DTypes, SortSpecTest,
                         ::testing::Combine(::testing::Values(DType::kInt32, DType::kInt64),
                                            ::testing::Bool()));

TEST(SortTokensTest, FirstErrorIsLowestRowThenLowestPosition) {
  // Row 0 valid; row 1: duplicate at 2 before out-of-range at 3; row 2: out of
  // range at 0. Row 1 position 2 is reported for every thread count.
  const std::vector<int64_t> in = {0, 1, 2, 3, 4, 5, 4, 9, 1, 9, 9, 9, 0, 1, 2, 3};
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (DType dtype : {DType::kInt32, DType::kInt64}) {
      TestTensor ids = MakeIds(dtype, {2, 2, 4}, in);
      const auto before = ids.Bytes();
      EXPECT_THAT(SortTokens({ids.view(), 8, std::nullopt, std::nullopt}, &pool),
                  StatusIs(kInvalid, "ids[0,1,2] = 4 duplicates ids[0,1,0] (indices must be"));
      EXPECT_EQ(ids.Bytes(), before);
    }
  }
  // Many rows, the only bad one near the end: still found, nothing written.
  std::vector<int64_t> many;
  for (int row = 0; row < 500; ++row) {
    for (int i = 0; i < 3; ++i) many.push_back(row == 431 && i == 2 ? -7 : 2 - i);
  }
  ThreadPool pool(3);
  TestTensor ids = MakeIds(DType::kInt32, {500, 3}, many);
  const auto before = ids.Bytes();
  EXPECT_THAT(SortTokens({ids.view(), 3, std::nullopt, std::nullopt}, &pool),
              StatusIs(kInvalid, "ids[431,2] = -7 is out of range [0, 3)"));
  EXPECT_EQ(ids.Bytes(), before);
}

TEST(SortTokensTest, MetadataErrors) {
  TestTensor ids = MakeIds(DType::kInt32, {2, 3}, {2, 0, 1, 0, 1, 2});
  TestTensor f32(DType::kFloat32, {2, 3});
  TestTensor out64(DType::kInt64, {2, 3});
  TestTensor out_short(DType::kInt32, {2, 2});
  TestTensor inv(DType::kInt32, {2, 5});
  TestTensor inv64(DType::kInt64, {2, 4});
  TestTensor inv_wrong_s(DType::kInt32, {2, 5});
  const auto ids_before = ids.Bytes();
  auto with = [&](auto&& mutate) {
    SortTokensArgs a{ids.view(), 4, std::nullopt, std::nullopt};
    mutate(a);
    return SortTokens(a, nullptr);
  };
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.ids = f32.view(); }),
              StatusIs(kInvalid, "ids: dtype float32 is not supported"));
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.original_tokens = 0; }),
              StatusIs(kInvalid, "original_tokens: S = 0 is outside [1, 2147483647]"));
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.original_tokens = int64_t{1} << 31; }),
              StatusIs(kInvalid, "original_tokens: S = 2147483648"));
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.out = out64.view(); }),
              StatusIs(kInvalid, "out: dtype int64 differs from ids dtype int32"));
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.out = out_short.view(); }),
              StatusIs(kInvalid, "out: dim 1 (R) is 2, expected 3"));
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.inverse = inv64.view(); }),
              StatusIs(kInvalid, "inverse: dtype int64 is not supported"));
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.inverse = inv_wrong_s.view(); }),
              StatusIs(kInvalid, "inverse: dim 1 (S) is 5, expected 4"));
  // out overlapping ids (but not the same view).
  TensorView shifted = ids.view();
  shifted.data = ids.ElementPtr(1);
  shifted.shape[0] = 1;
  TensorView ids_row0 = ids.view();
  ids_row0.shape[0] = 1;
  EXPECT_THAT(with([&](SortTokensArgs& a) {
                a.ids = ids_row0;
                a.out = shifted;
              }),
              StatusIs(kInvalid, "out: overlaps ids"));
  // inverse overlapping ids / out.
  TensorView inv_on_ids = TensorView::Contiguous(ids.data(), DType::kInt32, {2, 4});
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.inverse = inv_on_ids; }),
              StatusIs(kInvalid, "inverse: overlaps ids"));
  TestTensor big(DType::kInt32, {4, 4});
  TensorView out_in_big = TensorView::Contiguous(big.data(), DType::kInt32, {2, 3});
  TensorView inv_in_big = TensorView::Contiguous(big.ElementPtr(4), DType::kInt32, {2, 4});
  EXPECT_THAT(with([&](SortTokensArgs& a) {
                a.out = out_in_big;
                a.inverse = inv_in_big;
              }),
              StatusIs(kInvalid, "inverse: overlaps out"));
  // Self-overlapping outputs (stride 0 over rows).
  TensorView bcast = TensorView::Strided(ids.data(), DType::kInt32, {2, 3}, {0, 1});
  EXPECT_THAT(with([&](SortTokensArgs& a) { a.ids = bcast; }),
              StatusIs(kInvalid, "ids: output strides [0,1]"));
  EXPECT_EQ(ids.Bytes(), ids_before);
  // out == ids (the very same view) is in place.
  TestTensor same = MakeIds(DType::kInt64, {1, 3}, {2, 0, 1});
  ASSERT_OK(SortTokens({same.view(), 3, same.view(), std::nullopt}, nullptr));
  EXPECT_THAT(tt::ReadIndices(same), ElementsAreArray({0, 1, 2}));
}

// One randomized case against the reference, for null / 1 / 3 threads.
struct RandomCase {
  DType dtype;
  std::vector<int64_t> shape;  // ids shape; last dim R
  int64_t s;
  bool in_place;
  bool inverse;
  Layout ids_layout;
  Layout out_layout;
  Layout inv_layout;
};

void RunRandom(const RandomCase& c, std::mt19937_64& rng) {
  const int64_t r = c.shape.back();
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < c.shape.size(); ++d) rows *= c.shape[d];
  // Each row: R distinct ids from [0, S), by rejection when R is small
  // against S, else by a partial Fisher-Yates shuffle.
  std::vector<int64_t> in;
  std::uniform_int_distribution<int64_t> any(0, c.s - 1);
  for (int64_t row = 0; row < rows; ++row) {
    if (r * 4 < c.s) {
      std::set<int64_t> seen;
      while (static_cast<int64_t>(seen.size()) < r) {
        const int64_t id = any(rng);
        if (seen.insert(id).second) in.push_back(id);
      }
      continue;
    }
    std::vector<int64_t> perm(static_cast<size_t>(c.s));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = 0; i < r; ++i) {
      std::uniform_int_distribution<int64_t> pick(i, c.s - 1);
      std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(pick(rng))]);
      in.push_back(perm[static_cast<size_t>(i)]);
    }
  }
  std::vector<int64_t> want_ids;
  std::vector<int64_t> want_inv;
  for (int64_t row = 0; row < rows; ++row) {
    const auto sorted =
        tt::RefSortRow(std::vector<int64_t>(in.begin() + row * r, in.begin() + (row + 1) * r));
    want_ids.insert(want_ids.end(), sorted.begin(), sorted.end());
    if (c.inverse) {
      const auto inv = tt::RefInverseRow(sorted, c.s);
      want_inv.insert(want_inv.end(), inv.begin(), inv.end());
    }
  }
  std::vector<int64_t> inv_shape = c.shape;
  inv_shape.back() = c.inverse ? c.s : 1;
  ThreadPool pool1(1);
  ThreadPool pool3(3);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool3}) {
    SCOPED_TRACE(pool == nullptr ? 0 : pool->threads());
    TestTensor ids(c.dtype, c.shape, c.ids_layout);
    ids.FillRandom(rng);
    for (size_t i = 0; i < in.size(); ++i) ids.SetIndex(static_cast<int64_t>(i), in[i]);
    TestTensor out(c.dtype, c.shape, c.out_layout);
    out.FillRandom(rng);
    TestTensor inv(DType::kInt32, inv_shape, c.inv_layout);
    inv.FillRandom(rng);
    const auto ids_bytes = ids.Bytes();
    const auto ids_elems = tt::SnapshotElements(ids);
    const auto out_bytes = out.Bytes();
    const auto out_elems = tt::SnapshotElements(out);
    const auto inv_bytes = inv.Bytes();
    const auto inv_elems = tt::SnapshotElements(inv);
    SortTokensArgs args{ids.view(), c.s, std::nullopt, std::nullopt};
    if (!c.in_place) args.out = out.view();
    if (c.inverse) args.inverse = inv.view();
    ASSERT_OK(SortTokens(args, pool));
    if (c.in_place) {
      ASSERT_EQ(tt::ReadIndices(ids), want_ids);
      tt::ExpectOnlyElementsWritten(ids, ids_bytes, ids_elems);
      EXPECT_EQ(out.Bytes(), out_bytes);
    } else {
      ASSERT_EQ(tt::ReadIndices(out), want_ids);
      tt::ExpectOnlyElementsWritten(out, out_bytes, out_elems);
      EXPECT_EQ(ids.Bytes(), ids_bytes);
    }
    if (c.inverse) {
      ASSERT_EQ(tt::ReadIndices(inv), want_inv);
      tt::ExpectOnlyElementsWritten(inv, inv_bytes, inv_elems);
    } else {
      EXPECT_EQ(inv.Bytes(), inv_bytes);
    }
  }
}

TEST(SortTokensTest, RandomAgainstReference) {
  std::mt19937_64 rng(1234);
  const std::vector<Layout> layouts = {{}, {{0, 0, 3}, 0}, {{1, 2, 1}, 1}, {{}, 3}};
  struct Size {
    std::vector<int64_t> shape;
    int64_t s;
  };
  const std::vector<Size> sizes = {
      {{0, 3}, 5},
      {{1}, 1},
      {{1, 1}, 1},
      {{3, 1}, 7},
      {{2, 3, 5}, 5},
      {{2, 3, 7}, 64},
      {{4, 63}, 65},
      {{3, 64}, 128},
      {{2, 2, 100}, 1000},
      {{5, 130}, 131},
      {{2, 1000}, 100000},
      {{1, 100000}, 100000},
      {{7, 3, 17}, 4099},
      // Sparse rows (S/64 words > 16 R): sorted by comparison.
      {{3, 2}, 5000},
      {{2, 3, 1}, 3000},
      {{4, 9}, 65537},
  };
  int iteration = 0;
  for (const Size& size : sizes) {
    for (DType dtype : {DType::kInt32, DType::kInt64}) {
      for (const bool in_place : {true, false}) {
        for (const bool inverse : {false, true}) {
          ++iteration;
          const size_t rank = size.shape.size();
          auto fit = [&](const Layout& l) {
            Layout out = l;
            if (out.pad.size() > rank) out.pad.erase(out.pad.begin(), out.pad.end() - rank);
            if (dtype == DType::kInt64 && out.misalign == 3) out.misalign = 5;
            return out;
          };
          RandomCase c{dtype,
                       size.shape,
                       size.s,
                       in_place,
                       inverse,
                       fit(layouts[iteration % layouts.size()]),
                       fit(layouts[(iteration + 1) % layouts.size()]),
                       fit(layouts[(iteration + 2) % layouts.size()])};
          SCOPED_TRACE(::testing::Message()
                       << "shape " << ::testing::PrintToString(size.shape) << " S=" << size.s
                       << " int64=" << (dtype == DType::kInt64) << " in_place=" << in_place
                       << " inverse=" << inverse);
          RunRandom(c, rng);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// More rows x S than the kept-bitmap budget (dense rows): the re-marking path.
TEST(SortTokensTest, LargeBitmapPath) {
  constexpr int64_t kRows = 600, kR = 1024, kS = int64_t{1} << 20;  // 16384 words = 16 R
  std::mt19937_64 rng(99);
  RandomCase c{DType::kInt32, {kRows, kR}, kS, false, false, {}, {{0, 1}, 2}, {}};
  RunRandom(c, rng);
  // An error in the last row: nothing written.
  std::vector<int64_t> in;
  for (int64_t row = 0; row < kRows; ++row) {
    for (int64_t i = 0; i < kR; ++i)
      in.push_back(row == kRows - 1 && i == kR - 1 ? 5 : i * 1000 + 5);
  }
  ThreadPool pool(3);
  TestTensor ids = MakeIds(DType::kInt64, {kRows, kR}, in);
  const auto before = ids.Bytes();
  EXPECT_THAT(SortTokens({ids.view(), kS, std::nullopt, std::nullopt}, &pool),
              StatusIs(kInvalid, "ids[599,1023] = 5 duplicates ids[599,0]"));
  EXPECT_EQ(ids.Bytes(), before);
}

// Tiny rows with the largest S: work and memory must not scale with S (the
// bitmap would be 256 MiB per row and 2^25 words to scan; found by the long
// fuzz run as a 13 s request). Result checked against std::sort.
TEST(SortTokensTest, HugeSTinyRowsAreSortedByComparison) {
  constexpr int64_t kS = (int64_t{1} << 31) - 1;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> id(0, kS - 1);
  for (const DType dtype : {DType::kInt32, DType::kInt64}) {
    std::vector<int64_t> in;
    for (int row = 0; row < 4000; ++row) {
      const int64_t a = id(rng);
      int64_t b = id(rng);
      if (b == a) b = (a + 1) % kS;
      in.push_back(a);
      in.push_back(b);
      in.push_back(row % 2 == 0 ? kS - 1 - row : row);  // the ends of the range too
      if (in.back() == a || in.back() == b) in.back() = (std::max(a, b) + 1) % kS;
    }
    std::vector<int64_t> want = in;
    for (size_t row = 0; row < want.size(); row += 3) {
      std::sort(want.begin() + static_cast<ptrdiff_t>(row),
                want.begin() + static_cast<ptrdiff_t>(row + 3));
    }
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      TestTensor ids = MakeIds(dtype, {2, 2000, 3}, in);
      ASSERT_OK(SortTokens({ids.view(), kS, std::nullopt, std::nullopt}, &pool));
      EXPECT_EQ(tt::ReadIndices(ids), want);
    }
  }
}

// The first error of sparse rows is the same as the bitmap path's: lowest row,
// then lowest position; nothing written.
TEST(SortTokensTest, SparseRowsReportTheFirstError) {
  constexpr int64_t kS = int64_t{1} << 30;
  const std::vector<int64_t> in = {
      7,  kS - 1, 3,    // row 0 valid
      kS, 4,      4,    // row 1: out of range at 0 (before the duplicate)
      9,  9,      -1};  // row 2
  ThreadPool pool(3);
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    TestTensor ids = MakeIds(dtype, {3, 3}, in);
    const auto before = ids.Bytes();
    EXPECT_THAT(SortTokens({ids.view(), kS, std::nullopt, std::nullopt}, &pool),
                StatusIs(kInvalid, "ids[1,0] = 1073741824 is out of range [0, 1073741824)"));
    EXPECT_EQ(ids.Bytes(), before);
    TestTensor dup = MakeIds(dtype, {2, 4}, {0, 1, 2, 3, 8, kS - 2, 8, 8});
    const auto dup_before = dup.Bytes();
    EXPECT_THAT(SortTokens({dup.view(), kS, std::nullopt, std::nullopt}, &pool),
                StatusIs(kInvalid, "ids[1,2] = 8 duplicates ids[1,0] (indices must be"));
    EXPECT_EQ(dup.Bytes(), dup_before);
  }
}

}  // namespace
}  // namespace tokensel::kernels::cpu
