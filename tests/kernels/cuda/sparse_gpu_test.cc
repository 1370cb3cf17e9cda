// GPU conformance of the sparse-row path of SortTokens and ScatterTokens
// (issue 12 item 5; kernels/cuda/sparse_sort.h): shapes where
// PreferSortingToBitmap(R, S) holds, so the CPU twin sorts by comparison and
// the CUDA op sorts in O(rows * R) workspace instead of S-bit bitmaps. The
// CUDA op and the CPU op run on byte-identical host tensors; the whole
// backing stores must end up byte-identical and the statuses equal (code
// and message), errors included (then nothing is written). Covers S =
// 2^31-1 with [192, 3] ids, R = 1, rows needing merge passes (R > 1024),
// duplicates (also across tiles), out-of-range and negative ids, both id
// dtypes, strided and misaligned views, in place, out, and the inverse.
// Skips with "no CUDA device: ..." when there is no device.
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <unordered_set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/sparse_rows.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/gpu_twins.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::kernels::cuda {
namespace {

using gputest::IndexError;
using gputest::MakeIndices;
using gputest::MakeTwin;
using gputest::Twin;
using testing::Layout;

constexpr int64_t kMaxS = (int64_t{1} << 31) - 1;

// `rows` rows of `n` distinct ids drawn from [0, s) (n << s: no S-sized
// buffer), then one error injected at a random position.
std::vector<int64_t> SparseIds(int64_t rows, int64_t n, int64_t s, IndexError error,
                               std::mt19937_64& rng) {
  std::vector<int64_t> values;
  for (int64_t row = 0; row < rows; ++row) {
    std::unordered_set<int64_t> seen;
    while (static_cast<int64_t>(seen.size()) < n) {
      const int64_t v = static_cast<int64_t>(rng() % static_cast<uint64_t>(s));
      if (seen.insert(v).second) values.push_back(v);
    }
  }
  gputest::InjectIndexError(&values, n, s, error, rng);
  return values;
}

struct SortCase {
  DType dtype;
  std::vector<int64_t> rows;  // leading dims
  int64_t s;
  int64_t r;
  int mode;  // 0 in place (out absent), 1 out, 2 out = ids view (in place)
  bool inverse;
  Layout layout;  // of the ids
  IndexError error = IndexError::kNone;
  std::vector<int64_t> values = {};  // given ids (rows * r); empty: random SparseIds
  int64_t out_step = 1;              // last stride of out (mode 1)
  int64_t inverse_misalign = 4;      // bytes
};

void RunSort(const SortCase& c, std::mt19937_64& rng) {
  ASSERT_TRUE(PreferSortingToBitmap(c.r, c.s)) << "not a sparse shape";
  std::vector<int64_t> shape = c.rows;
  shape.push_back(c.r);
  int64_t rows = 1;
  for (int64_t n : c.rows) rows *= n;
  auto ids = MakeIndices(c.dtype, shape,
                         c.values.empty() ? SparseIds(rows, c.r, c.s, c.error, rng) : c.values,
                         c.layout, rng);
  std::vector<Twin*> twins = {ids.get()};
  std::unique_ptr<Twin> out, inv;
  if (c.mode == 1) {
    out = MakeTwin(c.dtype, shape, {}, c.out_step, rng);
    twins.push_back(out.get());
  }
  if (c.inverse) {
    std::vector<int64_t> inv_shape = c.rows;
    inv_shape.push_back(c.s);
    inv = MakeTwin(DType::kInt32, inv_shape, {.pad = {}, .misalign = c.inverse_misalign}, 1, rng);
    twins.push_back(inv.get());
  }
  const int mode = c.mode;
  const bool has_inv = c.inverse;
  const int64_t s = c.s;
  gputest::Compare<SortTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        SortTokensArgs a;
        a.ids = v[0];
        a.original_tokens = s;
        if (mode == 1) a.out = v[1];
        if (mode == 2) a.out = v[0];
        if (has_inv) a.inverse = v.back();
        return a;
      },
      twins, [](const SortTokensArgs& a) { return cpu::SortTokens(a, nullptr); },
      SortTokensWorkspaceBytes, SortTokensAsync, SortTokensFinish);
}

struct ScatterCase {
  DType dtype;
  DType index_dtype;
  bool batch_first;
  int64_t b, s, r, c;
  IndexError error = IndexError::kNone;
};

std::vector<int64_t> TokenShape(bool bf, int64_t b, int64_t s, int64_t c) {
  return bf ? std::vector<int64_t>{b, s, c} : std::vector<int64_t>{s, b, c};
}

void RunScatter(const ScatterCase& k, std::mt19937_64& rng) {
  ASSERT_TRUE(PreferSortingToBitmap(k.r, k.s)) << "not a sparse shape";
  auto all = MakeTwin(k.dtype, TokenShape(k.batch_first, k.b, k.s, k.c), {}, 1, rng);
  auto layer = MakeTwin(k.dtype, TokenShape(k.batch_first, k.b, k.r, k.c), {}, 1, rng);
  auto idx =
      MakeIndices(k.index_dtype, {k.b, k.r}, SparseIds(k.b, k.r, k.s, k.error, rng), {}, rng);
  const bool bf = k.batch_first;
  gputest::Compare<ScatterTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        return ScatterTokensArgs{v[0], v[1], v[2], bf};
      },
      {all.get(), layer.get(), idx.get()},
      [](const ScatterTokensArgs& a) { return cpu::ScatterTokens(a, nullptr); },
      ScatterTokensWorkspaceBytes, ScatterTokensAsync, ScatterTokensFinish);
}

class SparseGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
  std::mt19937_64 rng_{20261126};
};

constexpr DType kIdTypes[] = {DType::kInt32, DType::kInt64};

// The issue's shape: [192, 3] ids with S = 2^31-1 (48 GiB of bitmaps before).
TEST_F(SparseGpuTest, SortIssueShape) {
  for (DType dtype : kIdTypes) {
    for (int mode : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " mode " << mode);
      RunSort({dtype, {192}, kMaxS, 3, mode, false, {}}, rng_);
      RunSort({dtype, {12, 16}, kMaxS, 3, mode, false, {.pad = {1, 3}, .misalign = 2}}, rng_);
    }
  }
}

TEST_F(SparseGpuTest, SortOneIdPerRow) {
  for (DType dtype : kIdTypes) {
    RunSort({dtype, {12, 16}, kMaxS, 1, 0, false, {}}, rng_);
    RunSort({dtype, {5}, 2000, 1, 1, true, {}}, rng_);
  }
}

// Rows longer than one 1024-id tile: merge passes (1, 2 and 3).
TEST_F(SparseGpuTest, SortMergePasses) {
  for (DType dtype : kIdTypes) {
    RunSort({dtype, {3}, kMaxS, 1025, 0, false, {}}, rng_);
    RunSort({dtype, {2}, int64_t{1} << 22, 2049, 1, true, {}}, rng_);
    RunSort({dtype, {2}, kMaxS, 5000, 2, false, {.pad = {0, 7}, .misalign = 0}}, rng_);
  }
}

TEST_F(SparseGpuTest, SortInverse) {
  for (DType dtype : kIdTypes) {
    for (int mode : {0, 1}) {
      RunSort({dtype, {3, 5}, 100000, 5, mode, true, {}}, rng_);
      RunSort({dtype, {4}, 65536, 3, mode, true, {.pad = {2}, .misalign = 1}}, rng_);
    }
  }
}

TEST_F(SparseGpuTest, SortErrorsWriteNothing) {
  for (DType dtype : kIdTypes) {
    for (IndexError e : {IndexError::kDuplicate, IndexError::kOutOfRange, IndexError::kNegative}) {
      SCOPED_TRACE(::testing::Message()
                   << "dtype " << static_cast<int>(dtype) << " error " << static_cast<int>(e));
      RunSort({dtype, {192}, kMaxS, 3, 0, false, {}, e}, rng_);
      RunSort({dtype, {192}, kMaxS, 3, 1, false, {}, e}, rng_);
      RunSort({dtype, {2}, kMaxS, 5000, 1, false, {}, e}, rng_);
      RunSort({dtype, {3, 5}, 100000, 5, 1, true, {}, e}, rng_);
      if (e != IndexError::kDuplicate) RunSort({dtype, {7}, kMaxS, 1, 0, false, {}, e}, rng_);
    }
  }
}

// Fixed edge cases (review of the first version): duplicates that meet only
// in the last merge pass, tile-exact rows, int64 ids that would be valid if
// truncated to 32 bits,
// the padding value and the extremes as ids, a strided out, an unaligned
// inverse.
TEST_F(SparseGpuTest, SortFixedEdges) {
  auto distinct = [&](int64_t n, int64_t s) { return SparseIds(1, n, s, IndexError::kNone, rng_); };
  for (DType dtype : kIdTypes) {
    SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype));
    for (int64_t r : {1023, 1024, 2048}) {
      RunSort({dtype, {1}, kMaxS, r, 1, false, {}, IndexError::kNone, distinct(r, kMaxS)}, rng_);
    }
    std::vector<int64_t> v = distinct(2048, kMaxS);
    v[2047] = v[0];  // tiles 0 and 1
    RunSort({dtype, {1}, kMaxS, 2048, 1, false, {}, IndexError::kNone, v}, rng_);
    v = distinct(5000, kMaxS);
    v[4500] = v[10];  // tiles 0 and 4: adjacent only after the last merge pass
    RunSort({dtype, {1}, kMaxS, 5000, 0, false, {}, IndexError::kNone, v}, rng_);
    RunSort({dtype, {1}, kMaxS, 3, 1, false, {}, IndexError::kNone, {5, kMaxS, 7}}, rng_);
    RunSort({dtype, {1}, kMaxS, 3, 1, false, {}, IndexError::kNone, {5, kMaxS - 1, 7}}, rng_);
    RunSort({dtype, {2}, 100000, 3, 1, true, {}, IndexError::kNone, {9, 3, 99999, 0, 1, 2}, 2, 2},
            rng_);
  }
  // int64 ids that a 32-bit truncation would make valid (2^32+5 -> 5,
  // INT64_MIN -> 0) and the int64 padding value; S <= INT32_MAX by contract.
  const int64_t k32 = int64_t{1} << 32;
  for (const std::vector<int64_t>& v :
       std::vector<std::vector<int64_t>>{{k32 + 5, 6, 7},
                                         {5, std::numeric_limits<int64_t>::min(), 7},
                                         {5, std::numeric_limits<int64_t>::max(), 7}}) {
    RunSort({DType::kInt64, {1}, kMaxS, 3, 1, false, {}, IndexError::kNone, v}, rng_);
  }
  RunSort({DType::kInt32,
           {1},
           kMaxS,
           3,
           0,
           false,
           {},
           IndexError::kNone,
           {5, std::numeric_limits<int32_t>::min(), 7}},
          rng_);
}

TEST_F(SparseGpuTest, ScatterSparseRows) {
  for (DType index_dtype : kIdTypes) {
    for (bool bf : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << "index " << static_cast<int>(index_dtype) << " bf " << bf);
      RunScatter({DType::kFloat32, index_dtype, bf, 4, 4096, 3, 8}, rng_);
      RunScatter({DType::kBFloat16, index_dtype, bf, 2, 70000, 1, 3}, rng_);
      RunScatter({DType::kUInt8, index_dtype, bf, 2, 3000000, 1500, 4}, rng_);
      // The issue's shape with an empty payload: the check alone.
      RunScatter({DType::kFloat32, index_dtype, bf, 192, kMaxS, 3, 0}, rng_);
    }
  }
}

TEST_F(SparseGpuTest, ScatterErrorsWriteNothing) {
  for (DType index_dtype : kIdTypes) {
    for (IndexError e : {IndexError::kDuplicate, IndexError::kOutOfRange, IndexError::kNegative}) {
      SCOPED_TRACE(::testing::Message() << "index " << static_cast<int>(index_dtype) << " error "
                                        << static_cast<int>(e));
      RunScatter({DType::kFloat16, index_dtype, true, 3, 50000, 20, 16, e}, rng_);
      RunScatter({DType::kFloat16, index_dtype, false, 2, 3000000, 1500, 2, e}, rng_);
      RunScatter({DType::kFloat32, index_dtype, true, 192, kMaxS, 3, 0, e}, rng_);
    }
  }
}

}  // namespace
}  // namespace tokensel::kernels::cuda
