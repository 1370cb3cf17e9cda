// SamplePackedTokens through the Executor: inline (T' computed from inline
// cu_seqlens), by buffer reference (T' from kept_tokens or the outputs'
// shapes), the fused gather, the errors of sizing T' and bad data writing
// nothing, compared with the naive reference of
// tests/kernels/sample_packed_reference.h (independent of kernels/cpu).
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/sample_packed_reference.h"
#include "tests/server/core/executor_test_util.h"

namespace tokensel::testing {
namespace {

using kernels::DType;

const std::vector<int64_t> kCu = {0, 3, 3, 8, 20, 21};  // N = 5, T = 23
constexpr int64_t kT = 23;
const PackedRule kRule{1, 2, 1};  // r = [2, 0, 3, 6, 1]: T' = 12
constexpr int64_t kKept = 12;

std::vector<int32_t> Int32s(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

std::vector<int32_t> Flat(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int32_t> out;
  for (const auto& row : rows) out.insert(out.end(), row.begin(), row.end());
  return out;
}

class ExecutorSamplePackedTest : public ExecutorTest {
 protected:
  core::SamplePackedTokensRequest Request(core::TensorSpec cu, int64_t layers) {
    core::SamplePackedTokensRequest req;
    req.cu_seqlens = std::move(cu);
    req.total_tokens = kT;
    req.keep_num = kRule.keep_num;
    req.keep_den = kRule.keep_den;
    req.min_tokens = kRule.min_tokens;
    req.layers = layers;
    req.seed = 77;
    req.step = 5;
    return req;
  }
  HostTensor cu_ = Int32Host({6}, Int32s(kCu));
};

TEST_F(ExecutorSamplePackedTest, InlineEverythingMatchesTheReference) {
  core::SamplePackedTokensRequest req = Request(Inline(cu_), 3);
  req.positions = core::TensorSpec{};
  req.inverse = core::TensorSpec{};
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  const PackedExpected e = ReferenceSamplePacked(kCu, kT, kRule, 3, 77, 5);
  ExpectInline(*result, "cu_seqlens_kept", Int32Host({6}, Int32s(e.cu_kept)));
  ExpectInline(*result, "ids", Int32Host({3, kKept}, Flat(e.ids)));
  ExpectInline(*result, "positions", Int32Host({3, kKept}, Flat(e.positions)));
  ExpectInline(*result, "inverse", Int32Host({3, kT}, Flat(e.inverse)));
  EXPECT_EQ(result->outputs.size(), 4u);
}

TEST_F(ExecutorSamplePackedTest, FusedGatherFromABufferWithTFromActivations) {
  AddBuffer("acts", kT * 7 * 2);
  AddBuffer("cu", 6 * 4);
  std::memcpy(View(Buf("cu", 0, DType::kInt32, {6})).data, cu_.bytes.data(), 24);
  core::SamplePackedTokensRequest req = Request(Buf("cu", 0, DType::kInt32, {6}), 1);
  req.total_tokens.reset();  // T = activations' dim 0
  req.kept_tokens = kKept;   // cu_seqlens is in a buffer: T' for the inline outputs
  req.activations = Buf("acts", 0, DType::kBFloat16, {kT, 7});
  req.out = core::TensorSpec{};
  const PackedExpected e = ReferenceSamplePacked(kCu, kT, kRule, 1, 77, 5);
  HostTensor expected{DType::kBFloat16, {kKept, 7}, std::string(kKept * 7 * 2, '\0')};
  const auto* acts = static_cast<const char*>(View(*req.activations).data);
  for (int64_t k = 0; k < kKept; ++k) {
    std::memcpy(&expected.bytes[k * 14], acts + e.ids[0][k] * 14, 14);
  }
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ExpectInline(*result, "ids", Int32Host({1, kKept}, Flat(e.ids)));
  ExpectInline(*result, "out", expected);
}

TEST_F(ExecutorSamplePackedTest, OutputsInBuffersNeedNoKeptTokens) {
  AddBuffer("cu", 6 * 4);
  AddBuffer("outs", 6 * 4 + 2 * kKept * 4);
  std::memcpy(View(Buf("cu", 0, DType::kInt32, {6})).data, cu_.bytes.data(), 24);
  core::SamplePackedTokensRequest req = Request(Buf("cu", 0, DType::kInt32, {6}), 2);
  req.cu_seqlens_kept = Buf("outs", 0, DType::kInt32, {6});
  req.ids = Buf("outs", 24, DType::kInt32, {2, kKept});
  ASSERT_OK(Run(req));
  const PackedExpected e = ReferenceSamplePacked(kCu, kT, kRule, 2, 77, 5);
  const auto* outs = static_cast<const int32_t*>(View(Buf("outs", 0, DType::kInt32, {6})).data);
  EXPECT_EQ(std::vector<int32_t>(outs, outs + 6), Int32s(e.cu_kept));
  EXPECT_EQ(std::vector<int32_t>(outs + 6, outs + 6 + 2 * kKept), Flat(e.ids));
}

TEST_F(ExecutorSamplePackedTest, SizingErrorsNameTheField) {
  AddBuffer("cu", 6 * 4);
  std::memcpy(View(Buf("cu", 0, DType::kInt32, {6})).data, cu_.bytes.data(), 24);
  core::SamplePackedTokensRequest req = Request(Buf("cu", 0, DType::kInt32, {6}), 1);
  EXPECT_THAT(Run(req), StatusIs(absl::StatusCode::kInvalidArgument, "kept_tokens: required"));
  req.kept_tokens = kKept + 1;  // wrong: the kernel's check on its own copy
  EXPECT_THAT(Run(req), StatusIs(absl::StatusCode::kInvalidArgument, "ids: dim 1"));
  core::SamplePackedTokensRequest no_t = Request(Inline(cu_), 1);
  no_t.total_tokens.reset();
  EXPECT_THAT(Run(no_t), StatusIs(absl::StatusCode::kInvalidArgument, "total_tokens: required"));
  core::SamplePackedTokensRequest out_no_act = Request(Inline(cu_), 1);
  out_no_act.out = core::TensorSpec{};
  EXPECT_THAT(Run(out_no_act), StatusIs(absl::StatusCode::kInvalidArgument, "out: requires"));
}

TEST_F(ExecutorSamplePackedTest, BadDataNamesTheSequenceAndWritesNothing) {
  // Inline cu_seqlens decreasing at i = 2: the sizing of the inline outputs
  // reports it with the kernel's message.
  const HostTensor bad = Int32Host({4}, {0, 3, 5, 4});
  core::SamplePackedTokensRequest req = Request(Inline(bad), 1);
  EXPECT_THAT(Run(req), StatusIs(absl::StatusCode::kInvalidArgument,
                                 "decreasing at sequence i = 2: cu_seqlens[2] = 5"));
  // In a buffer, with outputs in buffers: the kernel's check, nothing written.
  AddBuffer("cu", 4 * 4);
  AddBuffer("outs", 4 * 4 + 64 * 4);
  std::memcpy(View(Buf("cu", 0, DType::kInt32, {4})).data, bad.bytes.data(), 16);
  req = Request(Buf("cu", 0, DType::kInt32, {4}), 1);
  req.cu_seqlens_kept = Buf("outs", 0, DType::kInt32, {4});
  req.ids = Buf("outs", 16, DType::kInt32, {1, 4});
  const Memory before = Snapshot();
  EXPECT_THAT(Run(req),
              StatusIs(absl::StatusCode::kInvalidArgument, "decreasing at sequence i = 2"));
  EXPECT_EQ(Snapshot(), before);
}

// The work bound counts a task per (layer, sequence), empty sequences too:
// N zeros cost 4 bytes as a broadcast view but L * N block iterations.
TEST_F(ExecutorSamplePackedTest, WorkCountsEverySequenceOfEveryLayer) {
  core::SamplePackedTokensRequest req =
      Request(Buf("cu", 0, DType::kInt32, {(int64_t{1} << 26) + 1}, {0}), int64_t{1} << 26);
  req.total_tokens = 1;
  EXPECT_GE(core::EstimateOpWork(req), uint64_t{1} << 52);
  req.layers = 3;
  req.cu_seqlens.shape = {11};
  req.total_tokens = 1000;  // T > N: T counts
  EXPECT_GE(core::EstimateOpWork(req), 3000u);
  EXPECT_LT(core::EstimateOpWork(req), 3100u);
}

}  // namespace
}  // namespace tokensel::testing
