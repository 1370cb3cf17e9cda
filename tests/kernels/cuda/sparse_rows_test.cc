// Host tests of the sparse-row path of SortTokens and ScatterTokens on the
// GPU (issue 12 item 5): the path rule shared with the CPU twins
// (kernels/sparse_rows.h), the merge pass count and the O(rows * R)
// workspace layouts (kernels/cuda/workspace_layout.h). No device is needed.
// Label static-gpu (needs nvcc, not a GPU).
#include "kernels/sparse_rows.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/ops.h"
#include "kernels/validate_sort.h"
#include "tests/kernels/cuda/layout_test_util.h"

namespace tokensel::kernels::cuda {
namespace {

using layout_test::Bytes;
using layout_test::ExpectSections;
using layout_test::Section;
using layout_test::View;

// The path rule of kernels/sparse_rows.h, shared with the CPU twins: the
// bitmap while ceil(S/64) <= 16 * max(R, 1), sorting beyond, overflow-free.
TEST(SparseRowsTest, PathRule) {
  for (int64_t r : {0, 1, 3, 100}) {
    const int64_t edge = 64 * 16 * (r > 1 ? r : 1);  // the largest dense S
    EXPECT_FALSE(PreferSortingToBitmap(r, edge)) << r;
    EXPECT_TRUE(PreferSortingToBitmap(r, edge + 1)) << r;
  }
  // The CPU's former expression, on a grid small enough not to overflow it.
  for (int64_t r = 0; r < 40; ++r) {
    for (int64_t s = 0; s < 70000; s += 61) {
      const bool former = (s + 63) / 64 > 16 * (r > 1 ? r : 1);
      ASSERT_EQ(PreferSortingToBitmap(r, s), former) << r << " " << s;
    }
  }
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(PreferSortingToBitmap(3, max));
  EXPECT_FALSE(PreferSortingToBitmap(max, max));
  EXPECT_FALSE(PreferSortingToBitmap(max, 0));
  EXPECT_TRUE(PreferSortingToBitmap(3, (int64_t{1} << 31) - 1));
}

TEST(SparseRowsTest, MergePasses) {
  EXPECT_EQ(SparseSortPasses(0), 0);
  EXPECT_EQ(SparseSortPasses(1), 0);
  EXPECT_EQ(SparseSortPasses(kSparseSortTile), 0);
  EXPECT_EQ(SparseSortPasses(kSparseSortTile + 1), 1);
  EXPECT_EQ(SparseSortPasses(2 * kSparseSortTile), 1);
  EXPECT_EQ(SparseSortPasses(2 * kSparseSortTile + 1), 2);
  EXPECT_EQ(SparseSortPasses(5000), 3);
  EXPECT_EQ(SparseSortPasses(std::numeric_limits<int64_t>::max()), 53);
}

// Issue 12 item 5: [192, 3] ids with S = 2^31-1 needed 48 GiB of bitmaps;
// the sparse layout is the snapshot and one sorted copy.
TEST(WorkspaceLayoutTest, SortTokensSparseRows) {
  const int64_t s = (int64_t{1} << 31) - 1;
  struct Case {
    std::vector<int64_t> rows;
    int64_t r;
  };
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    for (const Case& c : {Case{{192}, 3}, Case{{12, 16}, 1}, Case{{3}, 1025}, Case{{2}, 5000}}) {
      for (bool in_place : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " R " << c.r
                                          << " in place " << in_place);
        std::vector<int64_t> shape = c.rows;
        shape.push_back(c.r);
        int64_t rows = 1;
        for (int64_t n : c.rows) rows *= n;
        SortTokensArgs args;
        args.ids = View(0, dtype, shape);
        args.original_tokens = s;
        if (!in_place) args.out = View(1, dtype, shape);
        ASSERT_TRUE(ValidateSortTokens(args).ok()) << ValidateSortTokens(args);
        const SortLayout l = SortTokensLayout(args);
        ASSERT_TRUE(l.sparse.used);
        EXPECT_EQ(l.rows, rows);
        EXPECT_EQ(l.r, c.r);
        EXPECT_EQ(l.bitmap_bytes, 0u);
        EXPECT_EQ(l.words, 0);
        EXPECT_EQ(l.chunks, 0);
        EXPECT_EQ(l.sparse.rows, rows);
        EXPECT_EQ(l.sparse.r, c.r);
        EXPECT_EQ(l.sparse.passes, SparseSortPasses(c.r));
        const uint64_t keys = Bytes(args.ids);
        std::vector<Section> sections = {{"snapshot", l.snapshot, keys},
                                         {"keys0", l.sparse.keys[0], keys}};
        if (l.sparse.passes > 0) {
          sections.push_back({"keys1", l.sparse.keys[1], keys});
        } else {
          EXPECT_EQ(l.sparse.keys[1], 0u);
        }
        ExpectSections(sections, l.total);
        // O(rows * R): the status block and 2 or 3 copies of the ids.
        const uint64_t copies = l.sparse.passes > 0 ? 3 : 2;
        EXPECT_LE(l.total, kDeviceStatusBytes + copies * (keys + 255));
        EXPECT_EQ(SortTokensWorkspaceBytes(args), l.total);
      }
    }
  }
  // The issue's shape, int32: the status block, the snapshot and one sorted
  // copy of 192 * 3 * 4 = 2304 bytes (a multiple of 256): 4864 bytes.
  SortTokensArgs issue;
  issue.ids = View(0, DType::kInt32, {192, 3});
  issue.original_tokens = s;
  EXPECT_EQ(SortTokensWorkspaceBytes(issue), 256u + 2 * 2304u);
}

// The same choice for SortTokens and ScatterTokens, at the boundary.
TEST(WorkspaceLayoutTest, SparseChoiceFollowsTheRule) {
  for (int64_t r : {1, 3, 70}) {
    for (int64_t delta : {0, 1}) {
      const int64_t s = 64 * 16 * r + delta;
      SCOPED_TRACE(::testing::Message() << "R " << r << " S " << s);
      SortTokensArgs sort;
      sort.ids = View(0, DType::kInt64, {4, r});
      sort.original_tokens = s;
      EXPECT_EQ(SortTokensLayout(sort).sparse.used, PreferSortingToBitmap(r, s));
      EXPECT_EQ(SortTokensLayout(sort).sparse.used, delta == 1);
      const ScatterTokensArgs sc{View(0, DType::kFloat32, {4, s, 2}),
                                 View(2, DType::kFloat32, {4, r, 2}),
                                 View(1, DType::kInt32, {4, r}), true};
      ASSERT_TRUE(ValidateScatterTokens(sc).ok()) << ValidateScatterTokens(sc);
      const IndexOpLayout sl = ScatterTokensLayout(sc);
      EXPECT_EQ(sl.sparse.used, delta == 1);
      if (sl.sparse.used) {
        EXPECT_EQ(sl.bitmap, 0u);
        ExpectSections({{"snapshot", sl.snapshot, 4 * static_cast<uint64_t>(4 * r)},
                        {"keys0", sl.sparse.keys[0], 4 * static_cast<uint64_t>(4 * r)}},
                       sl.total);
      }
    }
  }
}

}  // namespace
}  // namespace tokensel::kernels::cuda
