// TensorView, dtype and the shared metadata validation helpers.
#include "kernels/tensor_view.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/validate.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::kernels {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::StatusIs;

TEST(DTypeTest, SizesAndNamesRoundTrip) {
  const std::vector<std::pair<DType, int64_t>> expected = {
      {DType::kBool, 1},       {DType::kInt8, 1},    {DType::kUInt8, 1},    {DType::kFloat8E4M3, 1},
      {DType::kFloat8E5M2, 1}, {DType::kFloat16, 2}, {DType::kBFloat16, 2}, {DType::kInt16, 2},
      {DType::kFloat32, 4},    {DType::kInt32, 4},   {DType::kFloat64, 8},  {DType::kInt64, 8}};
  ASSERT_EQ(expected.size(), static_cast<size_t>(kNumDTypes));
  for (const auto& [dtype, size] : expected) {
    EXPECT_EQ(ElementSize(dtype), size) << DTypeName(dtype);
    auto parsed = ParseDType(DTypeName(dtype));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_THAT(ParseDType("complex64"), StatusIs(StatusCode::kInvalidArgument, "complex64"));
}

TEST(TensorViewTest, ContiguousStridesAndRowOffsets) {
  TensorView v = TensorView::Contiguous(nullptr, DType::kFloat32, {2, 3, 4});
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.NumElements(), 24);
  EXPECT_EQ(v.NumRows(), 6);
  EXPECT_TRUE(v.IsContiguous());
  // Row r of [2,3,4] starts at 4r when contiguous.
  for (int64_t r = 0; r < 6; ++r) EXPECT_EQ(RowOffset(v, r), 4 * r);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(LinearToOffset(v, i), i);
  EXPECT_EQ(FormatIndex(v, 23), "[1,2,3]");
  EXPECT_EQ(v.ShapeString(), "[2,3,4]");
}

// Found by the op fuzzer: an empty inline output whose other dims multiply
// past int64 used to overflow (UB) while computing strides.
TEST(TensorViewTest, ContiguousEmptyViewWithHugeDimsDoesNotOverflow) {
  TensorView v = TensorView::Contiguous(nullptr, DType::kInt32, {0, int64_t{1} << 40, 1 << 30});
  EXPECT_EQ(v.NumElements(), 0);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.strides[1], 1 << 30);
  // Saturated (never used) where its byte value still fits int64.
  EXPECT_EQ(v.strides[0], std::numeric_limits<int64_t>::max() / 4);
  EXPECT_OK(CheckView(v, "out"));
}

TEST(TensorViewTest, StridedOffsetsMatchNaiveUnravel) {
  const std::vector<int64_t> shape = {3, 5, 2};
  const std::vector<int64_t> strides = {40, 7, 3};
  TensorView v = TensorView::Strided(nullptr, DType::kInt16, shape, strides);
  EXPECT_FALSE(v.IsContiguous());
  int64_t linear = 0;
  for (int64_t a = 0; a < 3; ++a) {
    for (int64_t b = 0; b < 5; ++b) {
      EXPECT_EQ(RowOffset(v, a * 5 + b), a * 40 + b * 7);
      for (int64_t c = 0; c < 2; ++c)
        EXPECT_EQ(LinearToOffset(v, linear++), a * 40 + b * 7 + c * 3);
    }
  }
}

TEST(TensorViewTest, UnitAndEmptyDimsAreContiguous) {
  const std::vector<int64_t> shape = {1, 4};
  const std::vector<int64_t> strides = {999, 1};
  EXPECT_TRUE(TensorView::Strided(nullptr, DType::kInt8, shape, strides).IsContiguous());
  const std::vector<int64_t> empty = {0, 4};
  const std::vector<int64_t> odd = {3, 5};
  EXPECT_TRUE(TensorView::Strided(nullptr, DType::kInt8, empty, odd).IsContiguous());
}

TEST(ValidateTest, CheckViewRejectsBadMetadata) {
  int64_t storage = 0;
  TensorView v = TensorView::Contiguous(&storage, DType::kInt64, {1});
  EXPECT_OK(CheckView(v, "x"));
  EXPECT_THAT(CheckView(v, "x", 2), StatusIs(StatusCode::kInvalidArgument, "x: rank is 1"));

  TensorView neg = TensorView::Contiguous(&storage, DType::kInt64, {2, -1});
  EXPECT_THAT(CheckView(neg, "ids"), StatusIs(StatusCode::kInvalidArgument, "ids: dim 1 is -1"));

  const std::vector<int64_t> shape = {2, 2};
  const std::vector<int64_t> bad_stride = {-2, 1};
  EXPECT_THAT(CheckView(TensorView::Strided(&storage, DType::kInt8, shape, bad_stride), "m"),
              StatusIs(StatusCode::kInvalidArgument, "m: stride 0 is -2"));

  TensorView null_data = TensorView::Contiguous(nullptr, DType::kInt8, {3});
  EXPECT_THAT(CheckView(null_data, "out"), StatusIs(StatusCode::kInvalidArgument, "null data"));
  TensorView empty = TensorView::Contiguous(nullptr, DType::kInt8, {0, 3});
  EXPECT_OK(CheckView(empty, "out"));

  TensorView rank0;
  EXPECT_THAT(CheckView(rank0, "t"), StatusIs(StatusCode::kInvalidArgument, "rank 0"));
}

TEST(ValidateTest, ExtentOverflowIsAnErrorNotAWrap) {
  int8_t storage = 0;
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max() / 2;
  const std::vector<int64_t> shape = {3, 2};
  const std::vector<int64_t> strides = {kBig, 1};
  EXPECT_THAT(CheckView(TensorView::Strided(&storage, DType::kInt8, shape, strides), "act"),
              StatusIs(StatusCode::kInvalidArgument, "spans more than 2^63"));
  // Fits in elements but not in bytes.
  const std::vector<int64_t> shape2 = {2};
  const std::vector<int64_t> strides2 = {std::numeric_limits<int64_t>::max() / 4};
  EXPECT_THAT(CheckView(TensorView::Strided(&storage, DType::kInt64, shape2, strides2), "act"),
              StatusIs(StatusCode::kInvalidArgument, "2^63 bytes"));
  const std::vector<int64_t> huge = {1LL << 32, 1LL << 32};
  const std::vector<int64_t> ones = {0, 0};
  EXPECT_THAT(CheckView(TensorView::Strided(&storage, DType::kInt8, huge, ones), "x"),
              StatusIs(StatusCode::kInvalidArgument, "2^63 elements"));
  // A dim of size 1 or 0 adds nothing to the extent, but its byte stride is
  // still formed by the kernels (found by the long fuzz run: TopKTokens ids
  // [1, 1] with stride 5532897305016349498, times 4 bytes).
  for (const int64_t size : {1, 0}) {
    const std::vector<int64_t> one = {2, size};
    const std::vector<int64_t> absurd = {1, 5532897305016349498};
    EXPECT_THAT(CheckView(TensorView::Strided(&storage, DType::kInt32, one, absurd), "ids"),
                StatusIs(StatusCode::kInvalidArgument,
                         "ids: stride 1 is 5532897305016349498 elements, more than 2^63 bytes"));
  }
  const std::vector<int64_t> one = {1};
  const std::vector<int64_t> widest = {std::numeric_limits<int64_t>::max() / 4};
  EXPECT_OK(CheckView(TensorView::Strided(&storage, DType::kInt32, one, widest), "ids"));
}

TEST(ValidateTest, ExtentIsLastElementPlusOne) {
  float storage[64];
  const std::vector<int64_t> shape = {2, 3};
  const std::vector<int64_t> strides = {10, 2};
  auto extent = ComputeExtent(TensorView::Strided(storage, DType::kFloat32, shape, strides), "x");
  ASSERT_OK(extent);
  EXPECT_EQ(extent->begin, 0);
  EXPECT_EQ(extent->end, (10 + 2 * 2 + 1) * 4);
}

TEST(ValidateTest, NonOverlappingOutputs) {
  float s[64];
  auto view = [&](std::vector<int64_t> shape, std::vector<int64_t> strides) {
    return TensorView::Strided(s, DType::kFloat32, shape, strides);
  };
  EXPECT_OK(CheckNonOverlapping(view({2, 3}, {3, 1}), "out"));
  EXPECT_OK(CheckNonOverlapping(view({2, 3}, {1, 2}), "out"));  // column-major
  EXPECT_OK(CheckNonOverlapping(view({2, 3}, {5, 1}), "out"));  // padded rows
  EXPECT_OK(CheckNonOverlapping(view({1, 3}, {0, 1}), "out"));  // unit dim, any stride
  EXPECT_THAT(CheckNonOverlapping(view({2, 3}, {0, 1}), "out"),
              StatusIs(StatusCode::kInvalidArgument, "out: output strides [0,1]"));
  EXPECT_THAT(CheckNonOverlapping(view({2, 3}, {2, 1}), "out"),
              StatusIs(StatusCode::kInvalidArgument, "overlap"));
}

TEST(ValidateTest, DisjointViews) {
  float s[64];
  TensorView a = TensorView::Contiguous(s, DType::kFloat32, {8});
  TensorView b = TensorView::Contiguous(s + 8, DType::kFloat32, {8});
  TensorView c = TensorView::Contiguous(s + 7, DType::kFloat32, {2});
  EXPECT_OK(CheckDisjoint(a, "out", b, "activations"));
  EXPECT_THAT(CheckDisjoint(a, "out", c, "activations"),
              StatusIs(StatusCode::kInvalidArgument, "out: overlaps activations"));
  TensorView empty = TensorView::Contiguous(s, DType::kFloat32, {0});
  EXPECT_OK(CheckDisjoint(empty, "out", a, "activations"));
}

TEST(ValidateTest, DimAndDTypeMessagesNameTheField) {
  int32_t s[8];
  TensorView idx = TensorView::Contiguous(s, DType::kInt32, {2, 4});
  EXPECT_OK(CheckIndexDType(idx, "indices"));
  EXPECT_OK(CheckDim(idx, "indices", 0, "B", 2, "activations B"));
  EXPECT_THAT(CheckDim(idx, "indices", 0, "B", 3, "activations B"),
              StatusIs(StatusCode::kInvalidArgument,
                       "indices: dim 0 (B) is 2, expected 3 (activations B)"));
  TensorView f = TensorView::Contiguous(s, DType::kFloat32, {2, 4});
  EXPECT_THAT(CheckIndexDType(f, "indices"),
              StatusIs(StatusCode::kInvalidArgument, "indices: dtype float32 is not supported"));
  EXPECT_THAT(
      CheckSameDType(f, "layer", idx, "all"),
      StatusIs(StatusCode::kInvalidArgument, "layer: dtype float32 differs from all dtype int32"));
}

TEST(ValidateTest, DataErrorMessagesUseMultiIndex) {
  int32_t s[12];
  TensorView ids = TensorView::Contiguous(s, DType::kInt32, {1, 3, 4});
  EXPECT_EQ(IndexOutOfRange(ids, "ids", 6, 9, 5).message(),
            "ids[0,1,2] = 9 is out of range [0, 5)");
  EXPECT_THAT(DuplicateIndex(ids, "ids", 7, 3, 5),
              StatusIs(StatusCode::kInvalidArgument, "ids[0,1,3] = 3 duplicates ids[0,1,1]"));
}

}  // namespace
}  // namespace tokensel::kernels
