// MergeTokens and SplitTokens through a real tokensel-server: by reference
// (out of place, and in place: an output naming the same bytes as the
// input) and inline over both transports, compared with the naive
// references of tests/kernels/merge_split_reference.h (independent of
// kernels/cpu) run on copies in this process.
#include <vector>

#include "tests/kernels/merge_split_reference.h"
#include "tests/server/integration/ops_fixture.h"

namespace tokensel::itest {
namespace {

using ::tokensel::testing::RefMerge;
using ::tokensel::testing::RefSplit;

TEST_P(OpsByReferenceTest, MergeTokensByReferenceOutOfPlaceThenInPlace) {
  Arena a(kArenaBytes);
  const Placed x = a.Place(DType::kFloat32, {2, 30, 8}, {.pad = {0, 0, 1}});
  const Placed layer = a.Place(DType::kFloat32, {2, 6, 8}, {.misalign = 4});
  const Placed idx = a.Place(DType::kInt32, {2, 6});
  const Placed out = a.Place(DType::kFloat32, {2, 30, 8}, {.misalign = 2});
  FillIndices(idx.View(shm_.data()), 30, /*unique=*/true, rng_);
  auto oracle = Snapshot();
  RefMerge(x.View(oracle.data()), layer.View(oracle.data()), idx.View(oracle.data()),
           out.View(oracle.data()), true);
  v1::MergeTokensRequest req;
  *req.mutable_x() = x.Ref("arena");
  *req.mutable_layer() = layer.Ref("arena");
  *req.mutable_indices() = idx.Ref("arena");
  *req.mutable_out() = out.Ref("arena");
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::MergeTokens, req, &resp));
  ExpectShmEquals(oracle);
  EXPECT_EQ(resp.outputs_size(), 0);

  *req.mutable_out() = x.Ref("arena");  // in place
  RefMerge(x.View(oracle.data()), layer.View(oracle.data()), idx.View(oracle.data()),
           x.View(oracle.data()), true);
  ASSERT_OK(client_->Call(&Stub::MergeTokens, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsByReferenceTest, SplitTokensByReferenceInPlace) {
  Arena a(kArenaBytes);
  const Placed grad = a.Place(DType::kBFloat16, {17, 3, 5});  // seq-first [S,B,C]
  const Placed idx = a.Place(DType::kInt64, {3, 9});
  const Placed layer_grad = a.Place(DType::kBFloat16, {9, 3, 5}, {.pad = {1, 0, 0}});
  FillIndices(idx.View(shm_.data()), 17, /*unique=*/true, rng_);
  auto oracle = Snapshot();
  RefSplit(grad.View(oracle.data()), idx.View(oracle.data()), layer_grad.View(oracle.data()),
           grad.View(oracle.data()), false);
  v1::SplitTokensRequest req;
  *req.mutable_grad() = grad.Ref("arena");
  *req.mutable_indices() = idx.Ref("arena");
  *req.mutable_layer_grad() = layer_grad.Ref("arena");
  *req.mutable_rest_grad() = grad.Ref("arena");
  req.set_batch_first(false);
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SplitTokens, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsTest, MergeAndSplitInline) {
  auto local = Local();
  Arena a(local.size());
  const Placed x = a.Place(DType::kFloat16, {3, 21, 7});
  const Placed layer = a.Place(DType::kFloat16, {3, 10, 7});
  const Placed idx = a.Place(DType::kInt32, {3, 10});
  FillIndices(idx.View(local.data()), 21, true, rng_);
  const Placed out = a.Place(DType::kFloat16, {3, 21, 7});
  RefMerge(x.View(local.data()), layer.View(local.data()), idx.View(local.data()),
           out.View(local.data()), true);
  v1::MergeTokensRequest merge;
  *merge.mutable_x() = Inline(x, local);
  *merge.mutable_layer() = Inline(layer, local);
  *merge.mutable_indices() = Inline(idx, local);
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::MergeTokens, merge, &resp));
  ExpectInline(resp, "out", out, local);

  const Placed layer_grad = a.Place(DType::kFloat16, {3, 10, 7});
  const Placed rest_grad = a.Place(DType::kFloat16, {3, 21, 7});
  RefSplit(out.View(local.data()), idx.View(local.data()), layer_grad.View(local.data()),
           rest_grad.View(local.data()), true);
  v1::SplitTokensRequest split;
  *split.mutable_grad() = Inline(out, local);
  *split.mutable_indices() = Inline(idx, local);
  ASSERT_OK(client_->Call(&Stub::SplitTokens, split, &resp));
  ExpectInline(resp, "layer_grad", layer_grad, local);
  ExpectInline(resp, "rest_grad", rest_grad, local);
}

}  // namespace
}  // namespace tokensel::itest
