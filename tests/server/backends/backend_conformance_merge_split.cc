// Backend conformance, part 3: MergeTokens and SplitTokens on every backend,
// out of place and in place, against the spec's definitions written as
// loops here, and a duplicate index refused with nothing written.
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "tests/server/backends/backend_conformance.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using kernels::DType;

constexpr int64_t kB = 2, kS = 5, kR = 2, kC = 3;

std::vector<float> Tokens(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(kB * n * kC));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i);
  return v;
}

// out[b,s,:] = layer[b,r,:] where idx[b,r] == s, else x[b,s,:] (batch-first).
std::vector<float> Merged(const std::vector<float>& x, const std::vector<float>& layer,
                          const std::vector<int32_t>& idx) {
  std::vector<float> out = x;
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t r = 0; r < kR; ++r)
      for (int64_t c = 0; c < kC; ++c)
        out[(b * kS + idx[b * kR + r]) * kC + c] = layer[(b * kR + r) * kC + c];
  return out;
}

const std::vector<int32_t> kIdx = {4, 1, 0, 3};

TEST_P(BackendConformanceTest, MergeTokensOutOfPlaceAndInPlace) {
  const std::vector<float> x = Tokens(kS, 0.5f), layer = Tokens(kR, -100.f);
  StagedTensor sx = StagedTensor::Upload(backend(), x, DType::kFloat32, {kB, kS, kC});
  StagedTensor sl = StagedTensor::Upload(backend(), layer, DType::kFloat32, {kB, kR, kC});
  StagedTensor si = StagedTensor::Upload(backend(), kIdx, DType::kInt32, {kB, kR});
  StagedTensor so = StagedTensor::Upload(backend(), std::vector<float>(x.size(), -1.f),
                                         DType::kFloat32, {kB, kS, kC});
  ASSERT_OK(backend().Run(kernels::MergeTokensArgs{sx.view(), sl.view(), si.view(), so.view()}));
  EXPECT_EQ(so.Download<float>(backend()), Merged(x, layer, kIdx));
  EXPECT_EQ(sx.Download<float>(backend()), x) << "x is an input";
  ASSERT_OK(backend().Run(kernels::MergeTokensArgs{sx.view(), sl.view(), si.view(), sx.view()}));
  EXPECT_EQ(sx.Download<float>(backend()), Merged(x, layer, kIdx));
}

TEST_P(BackendConformanceTest, SplitTokensOutOfPlaceAndInPlace) {
  const std::vector<float> grad = Tokens(kS, 1.f);
  std::vector<float> want_layer(static_cast<size_t>(kB * kR * kC));
  std::vector<float> want_rest = grad;
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t r = 0; r < kR; ++r) {
      for (int64_t c = 0; c < kC; ++c) {
        const int64_t at = (b * kS + kIdx[b * kR + r]) * kC + c;
        want_layer[(b * kR + r) * kC + c] = grad[at];
        want_rest[at] = 0.f;
      }
    }
  }
  StagedTensor sg = StagedTensor::Upload(backend(), grad, DType::kFloat32, {kB, kS, kC});
  StagedTensor si = StagedTensor::Upload(backend(), kIdx, DType::kInt32, {kB, kR});
  StagedTensor sl = StagedTensor::Upload(backend(), std::vector<float>(want_layer.size(), -1.f),
                                         DType::kFloat32, {kB, kR, kC});
  StagedTensor sr = StagedTensor::Upload(backend(), std::vector<float>(grad.size(), -1.f),
                                         DType::kFloat32, {kB, kS, kC});
  ASSERT_OK(backend().Run(kernels::SplitTokensArgs{sg.view(), si.view(), sl.view(), sr.view()}));
  EXPECT_EQ(sl.Download<float>(backend()), want_layer);
  EXPECT_EQ(sr.Download<float>(backend()), want_rest);
  ASSERT_OK(backend().Run(kernels::SplitTokensArgs{sg.view(), si.view(), sl.view(), sg.view()}));
  EXPECT_EQ(sl.Download<float>(backend()), want_layer) << "gathered before the rows were zeroed";
  EXPECT_EQ(sg.Download<float>(backend()), want_rest);
}

TEST_P(BackendConformanceTest, MergeAndSplitRefuseADuplicateIndexAndWriteNothing) {
  const std::vector<float> x = Tokens(kS, 0.5f), layer = Tokens(kR, -100.f);
  const std::vector<int32_t> idx = {4, 1, 3, 3};  // row 1 names token 3 twice
  const std::vector<float> poison(x.size(), -1.f);
  StagedTensor sx = StagedTensor::Upload(backend(), x, DType::kFloat32, {kB, kS, kC});
  StagedTensor sl = StagedTensor::Upload(backend(), layer, DType::kFloat32, {kB, kR, kC});
  StagedTensor si = StagedTensor::Upload(backend(), idx, DType::kInt32, {kB, kR});
  StagedTensor so = StagedTensor::Upload(backend(), poison, DType::kFloat32, {kB, kS, kC});
  const char* kWant = "indices[1,1] = 3 duplicates indices[1,0]";
  EXPECT_THAT(backend().Run(kernels::MergeTokensArgs{sx.view(), sl.view(), si.view(), so.view()}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(kWant)));
  EXPECT_THAT(backend().Run(kernels::SplitTokensArgs{sx.view(), si.view(), sl.view(), sx.view()}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(kWant)));
  EXPECT_EQ(so.Download<float>(backend()), poison);
  EXPECT_EQ(sx.Download<float>(backend()), x);
  EXPECT_EQ(sl.Download<float>(backend()), layer);
}

}  // namespace
}  // namespace tokensel::testing
