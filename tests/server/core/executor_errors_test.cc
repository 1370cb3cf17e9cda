// Bad input through the Executor: each case returns a precise status naming
// the field, and writes nothing.
#include <cstring>
#include <functional>
#include <limits>
#include <variant>

#include "gtest/gtest.h"
#include "server/core/service_metrics.h"
#include "tests/server/core/executor_test_util.h"
#include "tests/server/core/forwarding_backend.h"
#include "tests/server/core/metric_reader.h"

namespace tokensel::testing {
namespace {

using absl::StatusCode;
using core::TensorSpec;
using kernels::DType;

class ExecutorErrorsTest : public ExecutorTest {
 protected:
  // A valid GatherTokens on buffers: acts fp32 [2,8,4], idx int32 [2,3],
  // out fp32 [2,3,4].
  core::GatherTokensRequest ValidGather() {
    AddBuffer("acts", 2 * 8 * 4 * 4);
    AddBuffer("idx", 2 * 3 * 4);
    AddBuffer("out", 2 * 3 * 4 * 4);
    core::GatherTokensRequest req;
    req.activations = Buf("acts", 0, DType::kFloat32, {2, 8, 4});
    req.indices = Buf("idx", 0, DType::kInt32, {2, 3});
    req.out = Buf("out", 0, DType::kFloat32, {2, 3, 4});
    FillIds(View(req.indices), 8, false, rng_);
    return req;
  }

  // Runs `op`, expects `code` + `substr`, and that no buffer changed.
  void ExpectFailsCleanly(const core::OpRequest& op, StatusCode code, const std::string& substr) {
    const Memory before = Snapshot();
    EXPECT_THAT(Run(op), StatusIs(code, substr));
    EXPECT_TRUE(Snapshot() == before) << "a failed op wrote to a buffer";
  }
};

TEST_F(ExecutorErrorsTest, OffsetPastTheBufferIsOutOfRange) {
  AddBuffer("acts", 32768);
  AddBuffer("idx", 64);
  core::GatherTokensRequest req;
  req.activations = Buf("acts", 4096, DType::kFloat32, {4, 64, 64});
  req.indices = Buf("idx", 0, DType::kInt32, {4, 2});
  ExpectFailsCleanly(req, StatusCode::kOutOfRange,
                     "activations: byte_offset 4096 + extent 65536 exceeds buffer 'acts' size "
                     "32768");
}

TEST_F(ExecutorErrorsTest, OffsetOverflowIsOutOfRange) {
  core::GatherTokensRequest req = ValidGather();
  req.activations.byte_offset = std::numeric_limits<uint64_t>::max() - 7;
  ExpectFailsCleanly(req, StatusCode::kOutOfRange,
                     "activations: byte_offset 18446744073709551608 + extent 256");
  req.activations.byte_offset = std::numeric_limits<uint64_t>::max();
  ExpectFailsCleanly(req, StatusCode::kOutOfRange, "exceeds buffer 'acts'");
}

TEST_F(ExecutorErrorsTest, ExtentExactlyAtTheEndFitsOneMoreByteDoesNot) {
  AddBuffer("acts", 2 * 8 * 4 * 4 + 3);
  AddBuffer("idx", 2 * 3 * 4);
  core::GatherTokensRequest req;
  req.activations = Buf("acts", 3, DType::kFloat32, {2, 8, 4});
  req.indices = Buf("idx", 0, DType::kInt32, {2, 3});
  FillIds(View(req.indices), 8, false, rng_);
  EXPECT_OK(Run(req));
  req.activations.byte_offset = 4;
  ExpectFailsCleanly(req, StatusCode::kOutOfRange, "byte_offset 4 + extent 256 exceeds");
}

TEST_F(ExecutorErrorsTest, StridesThatLeaveTheBufferAreOutOfRange) {
  core::GatherTokensRequest req = ValidGather();
  req.activations.strides = {64, 4, 1};  // extent (64 + 28 + 3 + 1) * 4 = 384 > 256
  ExpectFailsCleanly(req, StatusCode::kOutOfRange, "activations: byte_offset 0 + extent 384");
  req.activations.strides = {std::numeric_limits<int64_t>::max() / 2, 4, 1};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "activations: shape [2,8,4]");
  req.activations.strides = {32, -4, 1};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "activations: stride 1 is -4");
  req.activations.strides = {32, 4};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "activations: 2 strides given");
}

TEST_F(ExecutorErrorsTest, BadDims) {
  core::GatherTokensRequest req = ValidGather();
  req.activations.shape = {2, -8, 4};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "activations: dim 1 is -8 (negative)");
  req.activations.shape = {};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "activations: shape is required");
  req.activations.shape = {1, 1, 1, 1, 1, 1, 1};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "activations: rank 7");
  req.activations.shape = {2, 8};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "activations: rank is 2");

  // A zero R is rejected by the op's own rules ...
  core::SortTokensRequest sort;
  sort.ids = Buf("idx", 0, DType::kInt32, {2, 0});
  sort.original_tokens = 8;
  ExpectFailsCleanly(sort, StatusCode::kInvalidArgument, "ids: R must be >= 1");
  // ... while an empty batch is a valid, empty gather.
  HostTensor acts = RandomHost(DType::kFloat32, {0, 5, 4}, rng_);
  HostTensor idx = RandomHost(DType::kInt32, {0, 3}, rng_);
  core::GatherTokensRequest empty;
  empty.activations = Inline(acts);
  empty.indices = Inline(idx);
  absl::StatusOr<core::OpResult> result = Run(empty);
  ASSERT_OK(result);
  ExpectInline(*result, "out", HostTensor{DType::kFloat32, {0, 3, 4}, ""});
}

TEST_F(ExecutorErrorsTest, InlineDataMustMatchTheShapeAndBeRowMajor) {
  HostTensor idx = RandomHost(DType::kInt32, {2, 2}, rng_);
  FillIds(idx.view(), 4, false, rng_);
  core::GatherTokensRequest req = ValidGather();
  req.indices = Inline(idx);
  req.indices.inline_data = req.indices.inline_data.substr(0, 15);
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument,
                     "indices: inline data is 15 bytes, expected 16");
  req.indices = Inline(idx);
  req.indices.strides = {2, 1};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "indices: inline data is row-major");
}

TEST_F(ExecutorErrorsTest, MissingInputsAndMetadata) {
  const core::GatherTokensRequest valid = ValidGather();
  core::GatherTokensRequest req = valid;
  req.activations = TensorSpec();
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "activations: missing");
  req = valid;
  req.indices.dtype.reset();
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "indices: dtype is required");
  req = valid;
  req.out->dtype.reset();
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "out: dtype is required");
  req.out = Buf("out", 0, DType::kFloat32, {});
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "out: shape is required");
  HostTensor junk = RandomHost(DType::kFloat32, {2, 3, 4}, rng_);
  req.out = Inline(junk);
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "out: an output cannot carry inline data");
}

TEST_F(ExecutorErrorsTest, InlineOutputSpecMustAgreeWithTheOp) {
  core::GatherTokensRequest req = ValidGather();
  req.out = TensorSpec();
  req.out->dtype = DType::kInt32;
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "out: dtype int32 differs from float32");
  req.out = TensorSpec();
  req.out->shape = {2, 3, 5};
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument,
                     "out: shape [2,3,5] differs from the shape this op produces, [2,3,4]");
  req.out->shape = {2, 3, 4};  // equal: fine
  EXPECT_OK(Run(req));

  HostTensor scores = RandomHost(DType::kFloat32, {2, 5}, rng_);
  core::TopKTokensRequest topk;
  topk.scores = Inline(scores);
  topk.retained_tokens = 2;
  topk.ids = TensorSpec();
  topk.ids->dtype = DType::kFloat32;
  ExpectFailsCleanly(topk, StatusCode::kInvalidArgument,
                     "ids: dtype float32 differs from int32|int64");
  topk.retained_tokens = -1;
  topk.ids.reset();
  ExpectFailsCleanly(topk, StatusCode::kInvalidArgument, "retained_tokens: -1 is negative");
}

TEST_F(ExecutorErrorsTest, ScatterDtypeMismatchWritesNothing) {
  AddBuffer("all", 2 * 6 * 4 * 4);
  AddBuffer("layer", 2 * 2 * 4 * 2);
  AddBuffer("idx", 2 * 2 * 4);
  core::ScatterTokensRequest req;
  req.all = Buf("all", 0, DType::kFloat32, {2, 6, 4});
  req.layer = Buf("layer", 0, DType::kFloat16, {2, 2, 4});
  req.indices = Buf("idx", 0, DType::kInt32, {2, 2});
  FillIds(View(req.indices), 6, true, rng_);
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "layer: dtype float16 differs from all");
}

TEST_F(ExecutorErrorsTest, IndexOutOfRangeAndDuplicatesWriteNothing) {
  core::GatherTokensRequest req = ValidGather();
  kernels::StoreIndex(View(req.indices), 4, 8);  // [1,1] = 8 = S
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "indices[1,1] = 8");

  AddBuffer("all", 2 * 8 * 4 * 4);
  core::ScatterTokensRequest scatter;
  scatter.all = Buf("all", 0, DType::kFloat32, {2, 8, 4});
  scatter.layer = Buf("out", 0, DType::kFloat32, {2, 3, 4});
  scatter.indices = Buf("idx", 0, DType::kInt32, {2, 3});
  FillIds(View(scatter.indices), 8, true, rng_);
  const int64_t first = kernels::LoadIndex(View(scatter.indices), 3);
  kernels::StoreIndex(View(scatter.indices), 5, first);  // row 1 repeats its first index
  ExpectFailsCleanly(scatter, StatusCode::kInvalidArgument, "indices[1,2]");
}

TEST_F(ExecutorErrorsTest, UnknownAndForeignBuffers) {
  core::GatherTokensRequest req = ValidGather();
  req.activations.buffer = "nope";
  ExpectFailsCleanly(req, StatusCode::kNotFound, "activations: buffer 'nope' is not registered");
  mapper_.AddObject("theirs", 1024);
  ASSERT_OK(registry_.Register("session-b", "theirs", mapper_.Spec("theirs", 0, 1024)));
  req.activations.buffer = "theirs";
  ExpectFailsCleanly(req, StatusCode::kPermissionDenied,
                     "activations: buffer 'theirs' belongs to another session");
}

TEST_F(ExecutorErrorsTest, MemoryTheBackendCannotAccessIsFailedPrecondition) {
  core::GatherTokensRequest req = ValidGather();
  const std::string handle(64, 'h');
  device_mapper_.AddObject(handle, 4096);
  ASSERT_OK(registry_.Register(session_, "dev", core::CudaIpcSpec{handle, "GPU-fake", 0, 4096}));
  req.activations.buffer = "dev";
  ExpectFailsCleanly(req, StatusCode::kFailedPrecondition,
                     "activations: buffer 'dev' is in CUDA device memory, which the cpu backend "
                     "cannot access");
}

TEST_F(ExecutorErrorsTest, SegmentOutputsThatDoNotApply) {
  HostTensor ids = Int32Host({1, 3}, {1, 1, 2});
  AddBuffer("o", 64);
  core::SegmentSeqlensRequest req;
  req.segment_ids_q = Inline(ids);
  req.max_segments = 2;
  req.kv_seqlen = Buf("o", 0, DType::kInt32, {1, 2});
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument,
                     "kv_seqlen: given, but segment_ids_kv is absent");
  req.kv_seqlen.reset();
  req.q_cu_seqlens = Buf("o", 0, DType::kInt32, {3});
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "q_cu_seqlens: given, but packed is false");
  req.q_cu_seqlens.reset();
  req.max_segments = 0;
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "max_segments");
}

TEST_F(ExecutorErrorsTest, SliceGptRetainedTokens) {
  HostTensor mask = RandomHost(DType::kFloat32, {1, 1, 4, 4}, rng_);
  core::SliceGptMaskRequest req;
  req.mask = Inline(mask);
  req.retained_tokens = 5;
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "retained_tokens: R = 5 exceeds mask S");
  AddBuffer("o", 64);
  req.out = Buf("o", 0, DType::kFloat32, {1, 1, 2, 2});
  req.retained_tokens = 3;
  ExpectFailsCleanly(req, StatusCode::kInvalidArgument, "retained_tokens: 3 differs from out");
  req.retained_tokens = 0;  // R from `out`
  EXPECT_OK(Run(req));
}

TEST_F(ExecutorErrorsTest, InlineOutputsAreBoundedByMaxInlineBytes) {
  core::Executor small(&backend_, &registry_, nullptr, Limits(/*max_inline=*/96));
  core::GatherTokensRequest req = ValidGather();
  req.out.reset();  // 2*3*4 fp32 = 96 bytes inline: fits exactly
  EXPECT_OK(small.Run(session_, req));
  req.activations.shape = {2, 8, 5};
  req.activations.strides = {32, 3, 1};  // rows overlap: fine for an input
  EXPECT_THAT(small.Run(session_, req),
              StatusIs(StatusCode::kResourceExhausted, "out: returning 120 bytes inline"));

  // The total counts: SegmentSeqlens q_seqlen (16 bytes) + q_offset (24) > 32.
  core::Executor tiny(&backend_, &registry_, nullptr, Limits(/*max_inline=*/32));
  HostTensor ids = Int32Host({2, 3}, {1, 1, 2, 1, 2, 2});
  core::SegmentSeqlensRequest seg;
  seg.segment_ids_q = Inline(ids);
  seg.max_segments = 2;
  EXPECT_THAT(tiny.Run(session_, seg),
              StatusIs(StatusCode::kResourceExhausted, "q_offset: returning 24 bytes inline (16"));
  // In-place inline results count too.
  HostTensor sort_ids = Int32Host({1, 9}, {8, 7, 6, 5, 4, 3, 2, 1, 0});
  core::SortTokensRequest sort;
  sort.ids = Inline(sort_ids);
  sort.original_tokens = 9;
  EXPECT_THAT(tiny.Run(session_, sort), StatusIs(StatusCode::kResourceExhausted, "out:"));
}

// Rows the kernels check by sorting (kernels::PreferSortingToBitmap, on both
// backends) cost their ids, not a bitmap of S bits each: [192,3] ids with
// S = 2^31-1 (charged 192 * 2^25 before, refused by the default 2^27 limit)
// now run under it. Dense rows keep the bitmap's cost.
TEST_F(ExecutorErrorsTest, SparseRowsCostTheirIdsNotABitmapOfS) {
  constexpr int64_t kS = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> values;
  for (int32_t row = 0; row < 192; ++row) {
    // Unique in each row but row 0, whose two zeros are mended below.
    for (int32_t v : {static_cast<int32_t>(kS) - 1 - row, row * 1000003, row}) values.push_back(v);
  }
  values[1] = 7;
  HostTensor ids = Int32Host({192, 3}, values);
  core::SortTokensRequest sort;
  sort.ids = Inline(ids);
  sort.original_tokens = kS;
  const uint64_t work = 192 * 3 + 192 * (16 * 3 + 64);  // the ids, then the sort path
  EXPECT_EQ(core::EstimateOpWork(sort), work);
  core::Executor bounded(&backend_, &registry_, nullptr,
                         Limits(1 << 20, /*max_work=*/uint64_t{1} << 27));
  EXPECT_OK(bounded.Run(session_, sort));
  // Dense rows: S = 2048 for 3 ids is a bitmap of 33 words per row.
  sort.original_tokens = 2048;
  EXPECT_EQ(core::EstimateOpWork(sort), 192 * 3 + 192 * (2048 / 64 + 1));
  // ScatterTokens: the same rule on its indices against `all`'s S.
  core::ScatterTokensRequest scatter;
  scatter.all = sort.ids;  // only shapes matter to the estimate
  scatter.all.shape = {2, kS, 0};
  scatter.layer = sort.ids;
  scatter.layer.shape = {2, 3, 0};
  scatter.indices = sort.ids;
  scatter.indices.shape = {2, 3};
  scatter.batch_first = true;
  EXPECT_EQ(core::EstimateOpWork(scatter), 0 + 6 + 2 * (16 * 3 + 64));
}

// The work bound counts every tensor's shape (not its bytes), so zero-strided
// views with huge shapes and few bytes are refused before anything runs.
TEST_F(ExecutorErrorsTest, WorkAboveMaxOpWorkIsResourceExhaustedBeforeAnythingRuns) {
  core::GatherTokensRequest req = ValidGather();
  const core::GatherTokensRequest valid = req;
  const uint64_t work = 2 * 3 + 2 * 3 * 4;  // indices + the rows copied (out)
  EXPECT_EQ(core::EstimateOpWork(req), work);
  core::Executor exact(&backend_, &registry_, nullptr, Limits(1 << 20, /*max_work=*/work));
  EXPECT_OK(exact.Run(session_, req));
  core::Executor below(&backend_, &registry_, nullptr, Limits(1 << 20, /*max_work=*/work - 1));
  const Memory before = Snapshot();
  EXPECT_THAT(below.Run(session_, req),
              StatusIs(StatusCode::kResourceExhausted,
                       "GatherTokens: about 30 elements of work (what it reads and writes), "
                       "above the per-op limit of 29 (--max_op_elements)"));
  // Rows of 2^40 broadcast channels: 4 bytes of buffer, hours of copying.
  req.activations.shape = {2, 8, int64_t{1} << 40};
  req.activations.strides = {0, 0, 0};
  core::Executor bounded(&backend_, &registry_, nullptr, Limits(1 << 20, uint64_t{1} << 34));
  EXPECT_THAT(bounded.Run(session_, req),
              StatusIs(StatusCode::kResourceExhausted, "GatherTokens: about 6597069766662 "));
  // A huge S costs a gather nothing: it copies R rows whatever S is.
  req.activations.shape = {2, int64_t{1} << 40, 4};
  EXPECT_EQ(core::EstimateOpWork(req), work);
  EXPECT_TRUE(Snapshot() == before) << "a refused op wrote to a buffer";

  // SampleTokens counts L * B * max(S, 1) besides its tensors.
  core::SampleTokensRequest sample;
  sample.layers = 3;
  sample.batch = 5;
  sample.original_tokens = 7;
  sample.retained_tokens = 2;
  EXPECT_EQ(core::EstimateOpWork(sample), 3u * 5 * 7);
  EXPECT_OK(
      core::Executor(&backend_, &registry_, nullptr, Limits(1 << 20, 105)).Run(session_, sample));
  EXPECT_THAT(
      core::Executor(&backend_, &registry_, nullptr, Limits(1 << 20, 104)).Run(session_, sample),
      StatusIs(StatusCode::kResourceExhausted, "SampleTokens: about 105 elements"));
  sample.original_tokens = 0;
  sample.retained_tokens = 0;
  sample.layers = int64_t{1} << 40;  // S = 0 still costs a row each
  EXPECT_EQ(core::EstimateOpWork(sample), (uint64_t{1} << 40) * 5);
  sample.batch = int64_t{1} << 40;  // saturates instead of wrapping
  EXPECT_EQ(core::EstimateOpWork(sample), UINT64_MAX);
  // SortTokens and ScatterTokens count a bitmap of S bits per row.
  core::SortTokensRequest sort;
  sort.ids.shape = {4, 5, 3};
  sort.original_tokens = 640;
  EXPECT_EQ(core::EstimateOpWork(sort), 4u * 5 * 3 + 4 * 5 * (640 / 64 + 1));
  core::ScatterTokensRequest scatter;
  scatter.all.shape = {int64_t{1} << 40, 2, 0};  // seq-first, no bytes
  scatter.layer.shape = {3, 2, 0};
  scatter.indices.shape = {2, 3};
  scatter.batch_first = false;
  // (sparse rows: sorted, 16 per id and 64 per row; see SparseRowsCost...)
  EXPECT_EQ(core::EstimateOpWork(scatter), 6u + 2 * (16 * 3 + 64));
  scatter.indices.shape = {2, int64_t{1} << 36};  // dense again: the bitmap of S bits
  EXPECT_EQ(core::EstimateOpWork(scatter),
            2 * (uint64_t{1} << 36) + 2 * ((uint64_t{1} << 40) / 64 + 1));
  // Negative dims count 0 (validation rejects them later with a precise error).
  req = valid;
  req.indices.shape = {-2, 3};
  EXPECT_EQ(core::EstimateOpWork(req), 0u);
  // The mask copies count what they write.
  core::GatherBertMaskRequest bert;
  bert.indices.shape = {2, 3, 5};                 // L, B, R
  bert.mask.shape = {3, 4, 1, int64_t{1} << 40};  // B, H, Sq, S: S costs nothing
  EXPECT_EQ(core::EstimateOpWork(bert), 2u * 3 * 5 + 2 * 3 * 5 * 4 * 5);
  core::SliceGptMaskRequest slice;
  slice.mask.shape = {3, 4, 100, 100};
  slice.retained_tokens = 7;
  EXPECT_EQ(core::EstimateOpWork(slice), 3u * 4 * 7 * 7);
}

TEST_F(ExecutorErrorsTest, RunAllStopsAtTheFailingOpWithItsPosition) {
  core::GatherTokensRequest gather = ValidGather();
  AddBuffer("sort", 5 * 4);
  const std::vector<int32_t> unsorted = {4, 0, 3, 1, 2};
  std::memcpy(buffers_["sort"].first, unsorted.data(), 20);
  core::SortTokensRequest sort;
  sort.ids = Buf("sort", 0, DType::kInt32, {1, 5});
  sort.original_tokens = 5;
  core::GatherTokensRequest bad = gather;
  bad.indices.byte_offset = 4;  // past the end
  const Memory before = Snapshot();

  std::vector<core::OpRequest> ops = {sort, bad, gather};
  absl::StatusOr<std::vector<core::OpResult>> results = executor_.RunAll(session_, ops);
  EXPECT_THAT(results, StatusIs(StatusCode::kOutOfRange, "ops[1] (GatherTokens): indices: "));
  // The first op's effect remains; the third never ran.
  std::vector<int32_t> sorted(5);
  std::memcpy(sorted.data(), buffers_["sort"].first, 20);
  EXPECT_EQ(sorted, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(Snapshot()["out"] == before.at("out"));

  ops = {sort, gather};
  results = executor_.RunAll(session_, ops);
  ASSERT_OK(results);
  EXPECT_EQ(results->size(), 2u);
}

// The CPU backend, running `during_run` inside Run(GatherTokensArgs).
class HookedBackend : public testing::ForwardingBackend {
 public:
  std::function<void()> during_run;

  absl::Status RunOp(core::OpArgs args) override {
    if (during_run && std::holds_alternative<const kernels::GatherTokensArgs*>(args)) during_run();
    return cpu_.RunOp(args);
  }
};

TEST_F(ExecutorErrorsTest, UnregisterDuringAnOpIsDeferred) {
  core::GatherTokensRequest req = ValidGather();
  HookedBackend backend;
  core::Executor executor(&backend, &registry_, nullptr, Limits());
  Memory expected = Snapshot();
  ASSERT_OK(
      kernels::cpu::GatherTokens({View(req.activations, &expected), View(req.indices, &expected),
                                  View(*req.out, &expected), true},
                                 nullptr));
  int live_during_run = -1;
  backend.during_run = [&] {
    ASSERT_OK(registry_.Unregister(session_, "acts"));
    live_during_run = mapper_.live_mappings();
  };
  const int live_before = mapper_.live_mappings();
  ASSERT_OK(executor.Run(session_, req));
  EXPECT_EQ(live_during_run, live_before);              // still mapped during the op
  EXPECT_EQ(mapper_.live_mappings(), live_before - 1);  // unmapped once it finished
  EXPECT_TRUE(Snapshot()["out"] == expected["out"]);
  EXPECT_THAT(Run(req), StatusIs(StatusCode::kNotFound, "activations"));
}

TEST_F(ExecutorErrorsTest, SuccessfulOpsAreObservedInMetrics) {
  core::ServiceMetrics metrics("test", "cpu");
  core::Executor executor(&backend_, &registry_, &metrics, Limits());
  core::GatherTokensRequest req = ValidGather();
  absl::StatusOr<core::OpResult> result = executor.Run(session_, req);
  ASSERT_OK(result);
  EXPECT_EQ(HistogramCount(metrics, "tokensel_op_duration_seconds", "op", "GatherTokens"), 1);
  EXPECT_EQ(CounterValue(metrics, "tokensel_bytes_moved_total", "op", "GatherTokens"),
            static_cast<double>(result->bytes_moved));
  req.activations.buffer = "nope";
  EXPECT_FALSE(executor.Run(session_, req).ok());
  EXPECT_EQ(HistogramCount(metrics, "tokensel_op_duration_seconds", "op", "GatherTokens"), 1);
}

}  // namespace
}  // namespace tokensel::testing
