// MergeTokens and SplitTokens through the Executor: by buffer reference
// (out of place and in place: an output spec naming the same bytes as the
// input) and inline, compared with the naive references of
// tests/kernels/merge_split_reference.h (independent of kernels/cpu).
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/merge_split_reference.h"
#include "tests/server/core/executor_test_util.h"

namespace tokensel::testing {
namespace {

using kernels::DType;

// B=3, S=11, R=4, C=5 fp32, batch-first, out/rest at a padded stride.
class ExecutorMergeSplitTest : public ExecutorTest {
 protected:
  void SetUp() override {
    AddBuffer("x", 3 * 11 * 5 * 4);
    AddBuffer("layer", 3 * 4 * 5 * 4);
    AddBuffer("idx", 3 * 4 * 8);
    AddBuffer("out", 3 * 11 * 6 * 4);
    x_ = Buf("x", 0, DType::kFloat32, {3, 11, 5});
    layer_ = Buf("layer", 0, DType::kFloat32, {3, 4, 5});
    idx_ = Buf("idx", 0, DType::kInt64, {3, 4});
    out_ = Buf("out", 0, DType::kFloat32, {3, 11, 5}, {66, 6, 1});
    FillIds(View(idx_), 11, /*unique_rows=*/true, rng_);
  }
  core::TensorSpec x_, layer_, idx_, out_;
};

TEST_F(ExecutorMergeSplitTest, MergeTokensByBufferOutOfPlaceThenInPlace) {
  core::MergeTokensRequest req{x_, layer_, idx_, out_, true};
  Memory expected = Snapshot();
  RefMerge(View(x_, &expected), View(layer_, &expected), View(idx_, &expected),
           View(out_, &expected), true);
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  EXPECT_EQ(Snapshot(), expected);
  EXPECT_TRUE(result->outputs.empty());
  EXPECT_EQ(result->bytes_moved, 3u * 4 * 8 + 2 * (3 * 11 * 5 * 4));

  req.out = x_;  // the same bytes, shape and strides: in place
  RefMerge(View(x_, &expected), View(layer_, &expected), View(idx_, &expected), View(x_, &expected),
           true);
  result = Run(req);
  ASSERT_OK(result);
  EXPECT_EQ(Snapshot(), expected);
  EXPECT_EQ(result->bytes_moved, 3u * 4 * 8 + 2 * (3 * 4 * 5 * 4)) << "only the retained rows";
}

TEST_F(ExecutorMergeSplitTest, MergeTokensInlineOutComesBack) {
  HostTensor x = RandomHost(DType::kBFloat16, {7, 2, 3}, rng_);  // seq-first [S,B,C]
  HostTensor layer = RandomHost(DType::kBFloat16, {4, 2, 3}, rng_);
  HostTensor idx = RandomHost(DType::kInt32, {2, 4}, rng_);
  FillIds(idx.view(), 7, true, rng_);
  core::MergeTokensRequest req{Inline(x), Inline(layer), Inline(idx), std::nullopt, false};
  HostTensor expected = RandomHost(DType::kBFloat16, {7, 2, 3}, rng_);
  RefMerge(x.view(), layer.view(), idx.view(), expected.view(), false);
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ExpectInline(*result, "out", expected);
}

TEST_F(ExecutorMergeSplitTest, SplitTokensByBufferOutOfPlaceThenInPlace) {
  // grad = x, layer_grad = layer, rest_grad = out.
  core::SplitTokensRequest req{x_, idx_, layer_, out_, true};
  Memory expected = Snapshot();
  RefSplit(View(x_, &expected), View(idx_, &expected), View(layer_, &expected),
           View(out_, &expected), true);
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  EXPECT_EQ(Snapshot(), expected);
  EXPECT_EQ(result->bytes_moved, 3u * 4 * 8 + 2 * (3 * 4 * 5 * 4) + 2 * (3 * 11 * 5 * 4));

  req.rest_grad = x_;  // zero the retained rows of grad in place
  RefSplit(View(x_, &expected), View(idx_, &expected), View(layer_, &expected), View(x_, &expected),
           true);
  result = Run(req);
  ASSERT_OK(result);
  EXPECT_EQ(Snapshot(), expected);
}

TEST_F(ExecutorMergeSplitTest, SplitTokensInlineOutputsComeBack) {
  HostTensor grad = RandomHost(DType::kFloat64, {2, 9, 3}, rng_);
  HostTensor idx = RandomHost(DType::kInt64, {2, 5}, rng_);
  FillIds(idx.view(), 9, true, rng_);
  core::SplitTokensRequest req{Inline(grad), Inline(idx), std::nullopt, std::nullopt, true};
  HostTensor layer_grad = RandomHost(DType::kFloat64, {2, 5, 3}, rng_);
  HostTensor rest_grad = RandomHost(DType::kFloat64, {2, 9, 3}, rng_);
  RefSplit(grad.view(), idx.view(), layer_grad.view(), rest_grad.view(), true);
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ASSERT_EQ(result->outputs.size(), 2u);
  EXPECT_EQ(result->outputs[0].name, "layer_grad");
  ExpectInline(*result, "layer_grad", layer_grad);
  ExpectInline(*result, "rest_grad", rest_grad);
}

TEST_F(ExecutorMergeSplitTest, ABadIndexNamesItAndWritesNothing) {
  kernels::TensorView idx = View(idx_);
  kernels::StoreIndex(idx, 2 * 4 + 1, kernels::LoadIndex(idx, 2 * 4 + 0));  // duplicate in row 2
  const Memory before = Snapshot();
  core::MergeTokensRequest merge{x_, layer_, idx_, out_, true};
  EXPECT_THAT(Run(merge), StatusIs(absl::StatusCode::kInvalidArgument, "indices[2,1]"));
  core::SplitTokensRequest split{x_, idx_, layer_, x_, true};
  EXPECT_THAT(Run(split), StatusIs(absl::StatusCode::kInvalidArgument, "indices[2,1]"));
  EXPECT_EQ(Snapshot(), before);
}

}  // namespace
}  // namespace tokensel::testing
