// Backend conformance, part 2: every op refuses bad data with nothing
// written, and the views the kernels accept beyond the plain case (int64
// indices, strided inputs) give the same results on every backend.
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "kernels/tensor_view.h"
#include "tests/server/backends/backend_conformance.h"

namespace tokensel::testing {
namespace {

using kernels::DType;
using kernels::TensorView;

// Runs `args` and expects INVALID_ARGUMENT whose message contains `what`.
template <typename Args>
void ExpectInvalid(core::Backend& backend, const Args& args, const char* what) {
  const absl::Status status = backend.Run(args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr(what));
}

TEST_P(BackendConformanceTest, SortTokensRefusesADuplicateIdAndWritesNothing) {
  const std::vector<int32_t> ids = {3, 0, 4, 1, 2, 1};  // row 1 repeats 1
  StagedTensor t = StagedTensor::Upload(backend(), ids, DType::kInt32, {2, 3});
  const std::vector<int32_t> poison(2 * 5, 99);
  StagedTensor inv = StagedTensor::Upload(backend(), poison, DType::kInt32, {2, 5});
  kernels::SortTokensArgs args;
  args.ids = t.view();
  args.original_tokens = 5;
  args.inverse = inv.view();
  ExpectInvalid(backend(), args, "ids[1,2] = 1 duplicates ids[1,0]");
  EXPECT_EQ(t.Download<int32_t>(backend()), ids);
  EXPECT_EQ(inv.Download<int32_t>(backend()), poison);
}

TEST_P(BackendConformanceTest, ScatterTokensRefusesADuplicateIndexAndWritesNothing) {
  std::vector<float> all(2 * 4 * 2);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i);
  const std::vector<float> layer(2 * 2 * 2, -5.f);
  const std::vector<int32_t> idx = {3, 1, 2, 2};  // row 1 writes token 2 twice
  StagedTensor a = StagedTensor::Upload(backend(), all, DType::kFloat32, {2, 4, 2});
  StagedTensor l = StagedTensor::Upload(backend(), layer, DType::kFloat32, {2, 2, 2});
  StagedTensor i = StagedTensor::Upload(backend(), idx, DType::kInt32, {2, 2});
  ExpectInvalid(backend(), kernels::ScatterTokensArgs{a.view(), l.view(), i.view(), true},
                "indices[1,1] = 2 duplicates indices[1,0]");
  EXPECT_EQ(a.Download<float>(backend()), all);
}

TEST_P(BackendConformanceTest, GatherBertMaskRefusesAnIndexOutOfRangeAndWritesNothing) {
  const std::vector<float> mask(1 * 2 * 3 * 3, 1.f);
  const std::vector<int32_t> idx = {2, 0, 1, 3};  // [L=2,B=1,R=2]; 3 >= S
  const std::vector<float> poison(2 * 1 * 2 * 2 * 2, -3.f);
  StagedTensor m = StagedTensor::Upload(backend(), mask, DType::kFloat32, {1, 2, 3, 3});
  StagedTensor i = StagedTensor::Upload(backend(), idx, DType::kInt32, {2, 1, 2});
  StagedTensor o = StagedTensor::Upload(backend(), poison, DType::kFloat32, {2, 1, 2, 2, 2});
  ExpectInvalid(backend(), kernels::GatherBertMaskArgs{m.view(), i.view(), o.view()},
                "indices[1,0,1] = 3 is out of range [0, 3)");
  EXPECT_EQ(o.Download<float>(backend()), poison);
}

TEST_P(BackendConformanceTest, SegmentSeqlensRefusesAnIdAboveMaxSegmentsAndWritesNothing) {
  const std::vector<int32_t> ids = {1, 1, 2, 0, 1, 2, 4, 3};  // 4 > NS = 3
  StagedTensor q = StagedTensor::Upload(backend(), ids, DType::kInt32, {2, 4});
  const std::vector<int32_t> poison_seqlen(2 * 3, 77), poison_offset(2 * 4, 78);
  StagedTensor seqlen = StagedTensor::Upload(backend(), poison_seqlen, DType::kInt32, {2, 3});
  StagedTensor offset = StagedTensor::Upload(backend(), poison_offset, DType::kInt32, {2, 4});
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = q.view();
  args.max_segments = 3;
  args.q.seqlen = seqlen.view();
  args.q.offset = offset.view();
  ExpectInvalid(backend(), args, "segment_ids_q[1,2] = 4");
  EXPECT_EQ(seqlen.Download<int32_t>(backend()), poison_seqlen);
  EXPECT_EQ(offset.Download<int32_t>(backend()), poison_offset);
}

// Shape errors: found from metadata alone, before any byte is read.
TEST_P(BackendConformanceTest, ShapeErrorsWriteNothing) {
  const std::vector<float> poison(1 * 2 * 4 * 4, -2.f);
  {  // SliceGptMask: R = 4 > S = 3
    StagedTensor m = StagedTensor::Upload(backend(), std::vector<float>(1 * 2 * 3 * 3, 1.f),
                                          DType::kFloat32, {1, 2, 3, 3});
    StagedTensor o = StagedTensor::Upload(backend(), poison, DType::kFloat32, {1, 2, 4, 4});
    EXPECT_FALSE(backend().Run(kernels::SliceGptMaskArgs{m.view(), o.view()}).ok());
    EXPECT_EQ(o.Download<float>(backend()), poison);
  }
  {  // TopKTokens: R = 6 > S = 5
    StagedTensor sc =
        StagedTensor::Upload(backend(), std::vector<float>(2 * 5, 1.f), DType::kFloat32, {2, 5});
    const std::vector<int32_t> ids_poison(2 * 6, -9);
    StagedTensor ids = StagedTensor::Upload(backend(), ids_poison, DType::kInt32, {2, 6});
    EXPECT_FALSE(backend().Run(kernels::TopKTokensArgs{sc.view(), ids.view()}).ok());
    EXPECT_EQ(ids.Download<int32_t>(backend()), ids_poison);
  }
  {  // SampleTokens: R = 6 > S = 5
    const std::vector<int32_t> ids_poison(1 * 2 * 6, -9);
    StagedTensor ids = StagedTensor::Upload(backend(), ids_poison, DType::kInt32, {1, 2, 6});
    kernels::SampleTokensArgs args;
    args.layers = 1;
    args.batch = 2;
    args.original_tokens = 5;
    args.retained_tokens = 6;
    args.ids = ids.view();
    EXPECT_FALSE(backend().Run(args).ok());
    EXPECT_EQ(ids.Download<int32_t>(backend()), ids_poison);
  }
}

// GatherTokens with int64 indices and activations seen through strides (a
// [B,S,C] view of memory laid out [S,B,C]), against the definition.
TEST_P(BackendConformanceTest, GatherTokensTakesInt64IndicesAndStridedActivations) {
  constexpr int64_t B = 3, S = 7, C = 5, R = 4;
  std::vector<float> act(S * B * C);  // physical [S,B,C]
  for (size_t i = 0; i < act.size(); ++i) act[i] = static_cast<float>(i) * 0.25f - 3.f;
  const std::vector<int64_t> idx = {6, 0, 3, 2, 1, 5, 4, 0, 0, 6, 2, 3};  // [B,R]
  StagedTensor a = StagedTensor::Upload(backend(), act, DType::kFloat32, {S * B * C});
  StagedTensor i = StagedTensor::Upload(backend(), idx, DType::kInt64, {B, R});
  StagedTensor o = StagedTensor::Upload(backend(), std::vector<float>(B * R * C, -1.f),
                                        DType::kFloat32, {B, R, C});
  const TensorView strided =
      TensorView::Strided(a.view().data, DType::kFloat32, {B, S, C}, {C, B * C, 1});
  ASSERT_OK(backend().Run(kernels::GatherTokensArgs{strided, i.view(), o.view(), true}));
  const std::vector<float> out = o.Download<float>(backend());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t s = idx[b * R + r];
        EXPECT_EQ(out[(b * R + r) * C + c], act[(s * B + b) * C + c])
            << "b=" << b << " r=" << r << " c=" << c;
      }
    }
  }
}

}  // namespace
}  // namespace tokensel::testing
