#include "tests/server/backends/backend_conformance.h"

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "kernels/tensor_view.h"
#include "server/backends/cpu_backend.h"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_devices.h"
#include "tests/testing/gpu_device.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {

absl::StatusOr<std::unique_ptr<core::Backend>> MakeConformanceBackend(const std::string& kind) {
  if (kind == "cpu") return std::unique_ptr<core::Backend>(new backends::CpuBackend(2));
  if (kind == "cuda") {
    const std::vector<core::DeviceDescription> devices = backends::ListCudaDevices();
    if (devices.empty()) return absl::FailedPreconditionError("no CUDA device");
    return backends::MakeCudaBackend(devices[0].uuid);
  }
  return absl::InvalidArgumentError("unknown backend kind " + kind);
}

void BackendConformanceTest::SetUp() {
  // Skip without a GPU, fail on a broken one; with a device the backend must come up.
  if (GetParam() == "cuda") TOKENSEL_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<core::Backend>> backend = MakeConformanceBackend(GetParam());
  ASSERT_OK(backend);
  backend_ = *std::move(backend);
}

namespace {

using kernels::DType;
using kernels::TensorView;

TEST_P(BackendConformanceTest, StagingRoundTripsEverySize) {
  for (uint64_t size : {0, 1, 63, 64, 1000}) {
    absl::StatusOr<std::unique_ptr<core::Backend::Staging>> staging =
        backend().AllocateStaging(size);
    ASSERT_OK(staging);
    EXPECT_NE((*staging)->data(), nullptr);
    EXPECT_EQ((*staging)->size(), size);
    std::string in(size, '\0');
    for (uint64_t i = 0; i < size; ++i) in[i] = static_cast<char>(i * 7 + 1);
    ASSERT_OK(backend().CopyToStaging(**staging, in.data(), size));
    std::string out(size, 'x');
    ASSERT_OK(backend().CopyFromStaging(out.data(), **staging, size));
    EXPECT_EQ(in, out);
  }
}

TEST_P(BackendConformanceTest, StagingCopiesBeyondTheSizeAreInvalid) {
  absl::StatusOr<std::unique_ptr<core::Backend::Staging>> staging = backend().AllocateStaging(8);
  ASSERT_OK(staging);
  char buf[16] = {};
  EXPECT_THAT(backend().CopyToStaging(**staging, buf, 16),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(backend().CopyFromStaging(buf, **staging, 16),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// GatherTokens [B=2,S=5,C=3] fp32, R=2, both layouts.
TEST_P(BackendConformanceTest, GatherTokensMatchesTheDefinition) {
  for (const bool batch_first : {true, false}) {
    std::vector<float> act(2 * 5 * 3);
    for (size_t i = 0; i < act.size(); ++i) act[i] = static_cast<float>(i) + 0.5f;
    const std::vector<int32_t> idx = {4, 0, 2, 2};
    StagedTensor a = StagedTensor::Upload(backend(), act, DType::kFloat32,
                                          batch_first ? std::initializer_list<int64_t>{2, 5, 3}
                                                      : std::initializer_list<int64_t>{5, 2, 3});
    StagedTensor i = StagedTensor::Upload(backend(), idx, DType::kInt32, {2, 2});
    // out [B,R,C] or [R,B,C]: both [2,2,3] here.
    StagedTensor o = StagedTensor::Upload(backend(), std::vector<float>(2 * 2 * 3, -1.f),
                                          DType::kFloat32, {2, 2, 3});
    kernels::GatherTokensArgs args{a.view(), i.view(), o.view(), batch_first};
    ASSERT_OK(backend().Run(args));
    const std::vector<float> out = o.Download<float>(backend());
    for (int b = 0; b < 2; ++b) {
      for (int r = 0; r < 2; ++r) {
        for (int c = 0; c < 3; ++c) {
          const int s = idx[b * 2 + r];
          const float want = batch_first ? act[(b * 5 + s) * 3 + c] : act[(s * 2 + b) * 3 + c];
          const float got = batch_first ? out[(b * 2 + r) * 3 + c] : out[(r * 2 + b) * 3 + c];
          EXPECT_EQ(got, want) << "batch_first=" << batch_first << " b=" << b << " r=" << r;
        }
      }
    }
  }
}

TEST_P(BackendConformanceTest, AnErrorLeavesTheOutputUntouched) {
  const std::vector<float> act(2 * 5 * 3, 1.f);
  const std::vector<int32_t> idx = {4, 0, 2, 5};  // 5 is out of [0, S)
  const std::vector<float> poison(2 * 2 * 3, -7.f);
  StagedTensor a = StagedTensor::Upload(backend(), act, DType::kFloat32, {2, 5, 3});
  StagedTensor i = StagedTensor::Upload(backend(), idx, DType::kInt32, {2, 2});
  StagedTensor o = StagedTensor::Upload(backend(), poison, DType::kFloat32, {2, 2, 3});
  EXPECT_THAT(backend().Run(kernels::GatherTokensArgs{a.view(), i.view(), o.view(), true}),
              StatusIs(absl::StatusCode::kInvalidArgument, "indices"));
  EXPECT_EQ(o.Download<float>(backend()), poison);
}

TEST_P(BackendConformanceTest, SortTokensSortsInPlaceAndWritesTheInverse) {
  const std::vector<int32_t> ids = {3, 0, 4, 1, 2, 0};  // [2,3], S=5
  StagedTensor t = StagedTensor::Upload(backend(), ids, DType::kInt32, {2, 3});
  StagedTensor inv =
      StagedTensor::Upload(backend(), std::vector<int32_t>(2 * 5, 99), DType::kInt32, {2, 5});
  kernels::SortTokensArgs args;
  args.ids = t.view();
  args.original_tokens = 5;
  args.inverse = inv.view();
  ASSERT_OK(backend().Run(args));
  EXPECT_EQ(t.Download<int32_t>(backend()), (std::vector<int32_t>{0, 3, 4, 0, 1, 2}));
  EXPECT_EQ(inv.Download<int32_t>(backend()),
            (std::vector<int32_t>{0, -1, -1, 1, 2, 0, 1, 2, -1, -1}));
}

// ScatterTokens [B=2,S=4,C=2] in place: rows idx[b,r] of `all` take layer[b,r,:].
TEST_P(BackendConformanceTest, ScatterTokensWritesOnlyTheIndexedRows) {
  std::vector<float> all(2 * 4 * 2);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i);
  const std::vector<float> layer = {-1, -2, -3, -4, -5, -6, -7, -8};  // [2,2,2]
  const std::vector<int32_t> idx = {3, 1, 0, 2};
  StagedTensor a = StagedTensor::Upload(backend(), all, DType::kFloat32, {2, 4, 2});
  StagedTensor l = StagedTensor::Upload(backend(), layer, DType::kFloat32, {2, 2, 2});
  StagedTensor i = StagedTensor::Upload(backend(), idx, DType::kInt32, {2, 2});
  ASSERT_OK(backend().Run(kernels::ScatterTokensArgs{a.view(), l.view(), i.view(), true}));
  std::vector<float> want = all;
  for (int b = 0; b < 2; ++b) {
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 2; ++c)
        want[(b * 4 + idx[b * 2 + r]) * 2 + c] = layer[(b * 2 + r) * 2 + c];
    }
  }
  EXPECT_EQ(a.Download<float>(backend()), want);
}

// SliceGptMask: the top-left R x R corner of each [S,S] mask.
TEST_P(BackendConformanceTest, SliceGptMaskTakesTheTopLeftCorner) {
  std::vector<float> mask(1 * 2 * 3 * 3);  // [B=1,H=2,S=3,S=3]
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<float>(i);
  StagedTensor m = StagedTensor::Upload(backend(), mask, DType::kFloat32, {1, 2, 3, 3});
  StagedTensor o = StagedTensor::Upload(backend(), std::vector<float>(1 * 2 * 2 * 2, -1.f),
                                        DType::kFloat32, {1, 2, 2, 2});
  ASSERT_OK(backend().Run(kernels::SliceGptMaskArgs{m.view(), o.view()}));
  EXPECT_EQ(o.Download<float>(backend()), (std::vector<float>{0, 1, 3, 4, 9, 10, 12, 13}));
}

// TopKTokens: the R best positions per row, ascending; ties to the lower one.
TEST_P(BackendConformanceTest, TopKTokensPicksTheBestPositionsInOrder) {
  const std::vector<float> scores = {0.5f, 2.f, -1.f, 2.f, 1.f,    // row 0
                                     3.f,  0.f, 0.f,  1.f, -2.f};  // row 1
  StagedTensor sc = StagedTensor::Upload(backend(), scores, DType::kFloat32, {2, 5});
  StagedTensor ids =
      StagedTensor::Upload(backend(), std::vector<int32_t>(2 * 3, -9), DType::kInt32, {2, 3});
  ASSERT_OK(backend().Run(kernels::TopKTokensArgs{sc.view(), ids.view()}));
  EXPECT_EQ(ids.Download<int32_t>(backend()), (std::vector<int32_t>{1, 3, 4, 0, 1, 3}));
}

// GatherBertMask: out[l,b,h,i,j] = mask[b, h, Sq==1 ? 0 : idx[l,b,i], idx[l,b,j]].
TEST_P(BackendConformanceTest, GatherBertMaskMatchesTheDefinition) {
  constexpr int L = 2, B = 1, H = 2, S = 3, R = 2;
  std::vector<float> mask(B * H * S * S);  // Sq = S
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<float>(i);
  const std::vector<int32_t> idx = {2, 0, 1, 2};  // [L,B,R]
  StagedTensor m = StagedTensor::Upload(backend(), mask, DType::kFloat32, {B, H, S, S});
  StagedTensor i = StagedTensor::Upload(backend(), idx, DType::kInt32, {L, B, R});
  StagedTensor o = StagedTensor::Upload(backend(), std::vector<float>(L * B * H * R * R, -1.f),
                                        DType::kFloat32, {L, B, H, R, R});
  ASSERT_OK(backend().Run(kernels::GatherBertMaskArgs{m.view(), i.view(), o.view()}));
  std::vector<float> want;
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < H; ++h) {
      for (int a = 0; a < R; ++a) {
        for (int c = 0; c < R; ++c)
          want.push_back(mask[(h * S + idx[l * R + a]) * S + idx[l * R + c]]);
      }
    }
  }
  EXPECT_EQ(o.Download<float>(backend()), want);
}

// SegmentSeqlens and SampleTokens against the CPU twin run on host copies
// (the oracle of every backend; for the CPU backend this checks the plumbing).
TEST_P(BackendConformanceTest, SegmentSeqlensMatchesTheCpuTwin) {
  const std::vector<int32_t> ids = {1, 1, 2, 0, 1, 2, 2, 3};  // [B=2,T=4], NS=3
  StagedTensor q = StagedTensor::Upload(backend(), ids, DType::kInt32, {2, 4});
  StagedTensor seqlen =
      StagedTensor::Upload(backend(), std::vector<int32_t>(2 * 3, 77), DType::kInt32, {2, 3});
  StagedTensor offset =
      StagedTensor::Upload(backend(), std::vector<int32_t>(2 * 4, 77), DType::kInt32, {2, 4});
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = q.view();
  args.max_segments = 3;
  args.q.seqlen = seqlen.view();
  args.q.offset = offset.view();
  ASSERT_OK(backend().Run(args));

  std::vector<int32_t> host_ids = ids, want_seqlen(2 * 3, 77), want_offset(2 * 4, 77);
  kernels::SegmentSeqlensArgs host = args;
  host.segment_ids_q = TensorView::Contiguous(host_ids.data(), DType::kInt32, {2, 4});
  host.q.seqlen = TensorView::Contiguous(want_seqlen.data(), DType::kInt32, {2, 3});
  host.q.offset = TensorView::Contiguous(want_offset.data(), DType::kInt32, {2, 4});
  ASSERT_OK(kernels::cpu::SegmentSeqlens(host, nullptr));
  EXPECT_EQ(seqlen.Download<int32_t>(backend()), want_seqlen);
  EXPECT_EQ(offset.Download<int32_t>(backend()), want_offset);
}

TEST_P(BackendConformanceTest, SampleTokensMatchesTheCpuTwinBitForBit) {
  constexpr int64_t L = 2, B = 3, S = 17, R = 5;
  StagedTensor ids = StagedTensor::Upload(backend(), std::vector<int32_t>(L * B * R, -1),
                                          DType::kInt32, {L, B, R});
  kernels::SampleTokensArgs args;
  args.layers = L;
  args.batch = B;
  args.original_tokens = S;
  args.retained_tokens = R;
  args.seed = 1234;
  args.step = 7;
  args.ids = ids.view();
  ASSERT_OK(backend().Run(args));

  std::vector<int32_t> want(L * B * R, -1);
  kernels::SampleTokensArgs host = args;
  host.ids = TensorView::Contiguous(want.data(), DType::kInt32, {L, B, R});
  ASSERT_OK(kernels::cpu::SampleTokens(host, nullptr));
  EXPECT_EQ(ids.Download<int32_t>(backend()), want);
}

TEST_P(BackendConformanceTest, ScratchBytesIsSafeOnInvalidArgs) {
  // Metadata alone, never a dereference: null data, empty and absurd views.
  kernels::GatherTokensArgs gather;
  gather.activations = TensorView::Contiguous(nullptr, DType::kFloat32, {1 << 20, 1 << 20, 64});
  gather.indices = TensorView::Contiguous(nullptr, DType::kInt32, {3});
  (void)backend().ScratchBytes(gather);
  kernels::SortTokensArgs sort;
  sort.original_tokens = -1;
  (void)backend().ScratchBytes(sort);
  kernels::SegmentSeqlensArgs seg;
  seg.max_segments = INT64_MAX;
  (void)backend().ScratchBytes(seg);
  kernels::TopKTokensArgs topk;
  (void)backend().ScratchBytes(topk);
  kernels::MergeTokensArgs merge;
  merge.x = TensorView::Contiguous(nullptr, DType::kFloat32, {1 << 20, INT32_MAX, 0});
  (void)backend().ScratchBytes(merge);
  kernels::SplitTokensArgs split;
  split.grad = merge.x;
  split.indices = TensorView::Contiguous(nullptr, DType::kInt64, {1 << 20, 7});
  (void)backend().ScratchBytes(split);
  kernels::SampleTokensArgs sample;
  sample.layers = INT64_MAX;
  sample.batch = INT64_MAX;
  (void)backend().ScratchBytes(sample);
}

}  // namespace
}  // namespace tokensel::testing
