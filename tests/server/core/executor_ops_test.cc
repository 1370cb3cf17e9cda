// Every op through the Executor, by buffer reference and inline, compared
// with kernels::cpu called directly on copies (the oracle).
#include <algorithm>

#include "gtest/gtest.h"
#include "tests/server/core/executor_test_util.h"

namespace tokensel::testing {
namespace {

using core::TensorSpec;
using kernels::DType;
namespace cpu = kernels::cpu;

TensorSpec InlineOut(std::optional<DType> dtype = std::nullopt) {
  TensorSpec spec;  // Source::kNone: return inline
  spec.dtype = dtype;
  return spec;
}

// ---------------------------------------------------------------- SortTokens

TEST_F(ExecutorTest, SortTokensInPlaceInBufferWithInverse) {
  AddBuffer("ids", 400);
  AddBuffer("inv", 224);
  // ids int64 [2,3,5], rows padded to 8 elements, 16 bytes in.
  core::SortTokensRequest req;
  req.ids = Buf("ids", 16, DType::kInt64, {2, 3, 5}, {24, 8, 1});
  req.original_tokens = 9;
  req.inverse = Buf("inv", 4, DType::kInt32, {2, 3, 9});
  FillIds(View(req.ids), 9, /*unique_rows=*/true, rng_);
  Memory expected = Snapshot();
  ASSERT_OK(cpu::SortTokens(
      {View(req.ids, &expected), 9, std::nullopt, View(*req.inverse, &expected)}, nullptr));
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  EXPECT_TRUE(result->outputs.empty());
  EXPECT_EQ(Snapshot(), expected);
  EXPECT_EQ(result->bytes_moved, 2u * 30 * 8 + 54 * 4);
}

TEST_F(ExecutorTest, SortTokensToSeparateOutBuffer) {
  AddBuffer("ids", 4 * 12);
  AddBuffer("out", 4 * 12 + 8);
  core::SortTokensRequest req;
  req.ids = Buf("ids", 0, DType::kInt32, {3, 4});
  req.original_tokens = 20;
  req.out = Buf("out", 8, DType::kInt32, {3, 4});
  FillIds(View(req.ids), 20, true, rng_);
  Memory expected = Snapshot();
  ASSERT_OK(cpu::SortTokens({View(req.ids, &expected), 20, View(*req.out, &expected)}, nullptr));
  ASSERT_OK(Run(req));
  EXPECT_EQ(Snapshot(), expected);
}

TEST_F(ExecutorTest, SortTokensInlineIdsComeBackAsOut) {
  HostTensor ids = RandomHost(DType::kInt32, {4, 6}, rng_);
  FillIds(ids.view(), 10, true, rng_);
  core::SortTokensRequest req;
  req.ids = Inline(ids);
  req.original_tokens = 10;
  req.inverse = InlineOut();
  HostTensor sorted = ids;
  HostTensor inverse = RandomHost(DType::kInt32, {4, 10}, rng_);
  ASSERT_OK(cpu::SortTokens({sorted.view(), 10, std::nullopt, inverse.view()}, nullptr));
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ASSERT_EQ(result->outputs.size(), 2u);
  ExpectInline(*result, "out", sorted);
  ExpectInline(*result, "inverse", inverse);
}

// -------------------------------------------------------------- GatherTokens

TEST_F(ExecutorTest, GatherTokensByBufferBothLayouts) {
  for (bool batch_first : {true, false}) {
    SCOPED_TRACE(batch_first ? "batch_first" : "seq_first");
    registry_.UnregisterAll(session_);
    buffers_.clear();
    AddBuffer("acts", 2000);
    AddBuffer("idx", 200);
    AddBuffer("out", 600);
    core::GatherTokensRequest req;
    req.batch_first = batch_first;
    // fp16 [3,7,5] / [7,3,5], channels padded to 8, misaligned by 6 bytes.
    req.activations = batch_first ? Buf("acts", 6, DType::kFloat16, {3, 7, 5}, {56, 8, 1})
                                  : Buf("acts", 6, DType::kFloat16, {7, 3, 5}, {24, 8, 1});
    req.indices = Buf("idx", 8, DType::kInt64, {3, 4});
    req.out = batch_first ? Buf("out", 2, DType::kFloat16, {3, 4, 5}, {24, 6, 1})
                          : Buf("out", 2, DType::kFloat16, {4, 3, 5});
    FillIds(View(req.indices), 7, /*unique_rows=*/false, rng_);
    Memory expected = Snapshot();
    ASSERT_OK(cpu::GatherTokens({View(req.activations, &expected), View(req.indices, &expected),
                                 View(*req.out, &expected), batch_first},
                                nullptr));
    absl::StatusOr<core::OpResult> result = Run(req);
    ASSERT_OK(result);
    EXPECT_EQ(Snapshot(), expected);
    EXPECT_EQ(result->bytes_moved, 12u * 8 + 2 * 60 * 2);
  }
}

TEST_F(ExecutorTest, GatherTokensInline) {
  for (bool batch_first : {true, false}) {
    HostTensor acts = RandomHost(
        DType::kFloat32,
        batch_first ? std::vector<int64_t>{2, 6, 3} : std::vector<int64_t>{6, 2, 3}, rng_);
    HostTensor idx = RandomHost(DType::kInt32, {2, 4}, rng_);
    FillIds(idx.view(), 6, false, rng_);
    core::GatherTokensRequest req;
    req.activations = Inline(acts);
    req.indices = Inline(idx);
    req.batch_first = batch_first;
    HostTensor expected = RandomHost(
        DType::kFloat32,
        batch_first ? std::vector<int64_t>{2, 4, 3} : std::vector<int64_t>{4, 2, 3}, rng_);
    ASSERT_OK(cpu::GatherTokens({acts.view(), idx.view(), expected.view(), batch_first}, nullptr));
    absl::StatusOr<core::OpResult> result = Run(req);
    ASSERT_OK(result);
    ASSERT_EQ(result->outputs.size(), 1u);
    ExpectInline(*result, "out", expected);
  }
}

// ------------------------------------------------------------- ScatterTokens

TEST_F(ExecutorTest, ScatterTokensByBuffer) {
  AddBuffer("all", 2 * 7 * 4 * 4);
  AddBuffer("layer", 2 * 3 * 4 * 4);
  AddBuffer("idx", 2 * 3 * 4);
  core::ScatterTokensRequest req;
  req.all = Buf("all", 0, DType::kFloat32, {2, 7, 4});
  req.layer = Buf("layer", 0, DType::kFloat32, {2, 3, 4});
  req.indices = Buf("idx", 0, DType::kInt32, {2, 3});
  FillIds(View(req.indices), 7, true, rng_);
  Memory expected = Snapshot();
  ASSERT_OK(cpu::ScatterTokens(
      {View(req.all, &expected), View(req.layer, &expected), View(req.indices, &expected), true},
      nullptr));
  ASSERT_OK(Run(req));
  EXPECT_EQ(Snapshot(), expected);
}

TEST_F(ExecutorTest, ScatterTokensInlineAllComesBack) {
  HostTensor all = RandomHost(DType::kBFloat16, {5, 2, 3}, rng_);  // seq-first [S,B,C]
  HostTensor layer = RandomHost(DType::kBFloat16, {2, 2, 3}, rng_);
  HostTensor idx = RandomHost(DType::kInt64, {2, 2}, rng_);
  FillIds(idx.view(), 5, true, rng_);
  core::ScatterTokensRequest req;
  req.all = Inline(all);
  req.layer = Inline(layer);
  req.indices = Inline(idx);
  req.batch_first = false;
  HostTensor expected = all;
  ASSERT_OK(cpu::ScatterTokens({expected.view(), layer.view(), idx.view(), false}, nullptr));
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ExpectInline(*result, "all", expected);
}

// ------------------------------------------------------------------- masks

TEST_F(ExecutorTest, GatherBertMaskByBuffer) {
  AddBuffer("mask", 2 * 3 * 6 * 6);
  AddBuffer("idx", 2 * 2 * 4 * 4);
  AddBuffer("out", 2 * 2 * 3 * 16 + 1);
  core::GatherBertMaskRequest req;
  req.mask = Buf("mask", 0, DType::kUInt8, {2, 3, 6, 6});
  req.indices = Buf("idx", 0, DType::kInt32, {2, 2, 4});
  req.out = Buf("out", 1, DType::kUInt8, {2, 2, 3, 4, 4});
  FillIds(View(req.indices), 6, true, rng_);
  Memory expected = Snapshot();
  ASSERT_OK(cpu::GatherBertMask(
      {View(req.mask, &expected), View(req.indices, &expected), View(*req.out, &expected)},
      nullptr));
  ASSERT_OK(Run(req));
  EXPECT_EQ(Snapshot(), expected);
}

TEST_F(ExecutorTest, GatherBertMaskInlineBroadcastRow) {
  HostTensor mask = RandomHost(DType::kFloat16, {2, 1, 1, 6}, rng_);  // Sq = 1
  HostTensor idx = RandomHost(DType::kInt64, {3, 2, 4}, rng_);
  FillIds(idx.view(), 6, true, rng_);
  core::GatherBertMaskRequest req;
  req.mask = Inline(mask);
  req.indices = Inline(idx);
  HostTensor expected = RandomHost(DType::kFloat16, {3, 2, 1, 4, 4}, rng_);
  ASSERT_OK(cpu::GatherBertMask({mask.view(), idx.view(), expected.view()}, nullptr));
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ExpectInline(*result, "out", expected);
}

TEST_F(ExecutorTest, SliceGptMaskByBufferAndInline) {
  AddBuffer("mask", 2 * 2 * 6 * 6 * 2);
  AddBuffer("out", 2 * 2 * 3 * 3 * 2);
  core::SliceGptMaskRequest req;
  req.mask = Buf("mask", 0, DType::kBFloat16, {2, 2, 6, 6});
  req.out = Buf("out", 0, DType::kBFloat16, {2, 2, 3, 3});
  Memory expected = Snapshot();
  ASSERT_OK(cpu::SliceGptMask({View(req.mask, &expected), View(*req.out, &expected)}, nullptr));
  ASSERT_OK(Run(req));
  EXPECT_EQ(Snapshot(), expected);

  HostTensor mask = RandomHost(DType::kFloat32, {1, 2, 5, 5}, rng_);
  core::SliceGptMaskRequest inline_req;
  inline_req.mask = Inline(mask);
  inline_req.retained_tokens = 4;
  HostTensor corner = RandomHost(DType::kFloat32, {1, 2, 4, 4}, rng_);
  ASSERT_OK(cpu::SliceGptMask({mask.view(), corner.view()}, nullptr));
  absl::StatusOr<core::OpResult> result = Run(inline_req);
  ASSERT_OK(result);
  ExpectInline(*result, "out", corner);
}

// ------------------------------------------------------------ SegmentSeqlens

// The B=2 vector of the spec: [[1,1,1,0,2,2],[1,1,2,2,2,2]], NS = 2.
const std::vector<int32_t> kSegIds = {1, 1, 1, 0, 2, 2, 1, 1, 2, 2, 2, 2};

TEST_F(ExecutorTest, SegmentSeqlensByBufferPacked) {
  AddBuffer("seg", 12 * 4);
  AddBuffer("outs", 256);
  std::memcpy(buffers_["seg"].first, kSegIds.data(), 48);
  core::SegmentSeqlensRequest req;
  req.segment_ids_q = Buf("seg", 0, DType::kInt32, {2, 6});
  req.max_segments = 2;
  req.packed = true;
  req.q_seqlen = Buf("outs", 0, DType::kInt32, {2, 2});
  req.q_offset = Buf("outs", 16, DType::kInt32, {2, 3});
  req.q_packed_seqlens = Buf("outs", 40, DType::kInt32, {4});
  req.q_packed_offsets = Buf("outs", 56, DType::kInt32, {6});
  req.q_cu_seqlens = Buf("outs", 80, DType::kInt32, {5});
  Memory expected = Snapshot();
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = View(req.segment_ids_q, &expected);
  args.max_segments = 2;
  args.q = {View(*req.q_seqlen, &expected), View(*req.q_offset, &expected),
            kernels::PackedSeqlens{View(*req.q_packed_seqlens, &expected),
                                   View(*req.q_packed_offsets, &expected),
                                   View(*req.q_cu_seqlens, &expected)}};
  ASSERT_OK(cpu::SegmentSeqlens(args, nullptr));
  ASSERT_OK(Run(req));
  EXPECT_EQ(Snapshot(), expected);
  std::vector<int32_t> packed_offsets(6);
  std::memcpy(packed_offsets.data(), buffers_["outs"].first + 56, 24);
  EXPECT_EQ(packed_offsets, (std::vector<int32_t>{0, 4, 6, 8, 12, 12}));
}

TEST_F(ExecutorTest, SegmentSeqlensInlineMatchesSpecVector) {
  HostTensor ids = Int32Host({2, 6}, kSegIds);
  core::SegmentSeqlensRequest req;
  req.segment_ids_q = Inline(ids);
  req.max_segments = 2;
  req.packed = true;
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ASSERT_EQ(result->outputs.size(), 5u);
  ExpectInline(*result, "q_seqlen", Int32Host({2, 2}, {3, 2, 2, 4}));
  ExpectInline(*result, "q_offset", Int32Host({2, 3}, {0, 4, -1, 0, 2, -1}));
  ExpectInline(*result, "q_packed_seqlens", Int32Host({4}, {3, 2, 2, 4}));
  ExpectInline(*result, "q_packed_offsets", Int32Host({6}, {0, 4, 6, 8, 12, 12}));
  ExpectInline(*result, "q_cu_seqlens", Int32Host({5}, {0, 3, 5, 7, 11}));
}

TEST_F(ExecutorTest, SegmentSeqlensInlineCrossAttention) {
  // The spec's BRCM vector: q [1,1,1,1] pos 0..3, kv [1,1] pos 0..1, NS = 1.
  HostTensor q = Int32Host({1, 4}, {1, 1, 1, 1});
  HostTensor q_pos = Int32Host({1, 4}, {0, 1, 2, 3});
  HostTensor kv = Int32Host({1, 2}, {1, 1});
  HostTensor kv_pos = Int32Host({1, 2}, {0, 1});
  core::SegmentSeqlensRequest req;
  req.segment_ids_q = Inline(q);
  req.segment_pos_q = Inline(q_pos);
  req.segment_ids_kv = Inline(kv);
  req.segment_pos_kv = Inline(kv_pos);
  req.max_segments = 1;
  req.mask = kernels::AttnMaskType::kCausalBottomRight;
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ASSERT_EQ(result->outputs.size(), 4u);
  ExpectInline(*result, "q_seqlen", Int32Host({1, 1}, {2}));
  ExpectInline(*result, "q_offset", Int32Host({1, 2}, {2, -1}));
  ExpectInline(*result, "kv_seqlen", Int32Host({1, 1}, {2}));
  ExpectInline(*result, "kv_offset", Int32Host({1, 2}, {0, -1}));
}

// -------------------------------------------------------------- SampleTokens

TEST_F(ExecutorTest, SampleTokensByBufferWithBertMask) {
  AddBuffer("ids", 2 * 3 * 4 * 8);
  AddBuffer("inv", 2 * 3 * 10 * 4);
  AddBuffer("mask", 3 * 2 * 10 * 2);
  AddBuffer("bert", 2 * 3 * 2 * 16 * 2);
  core::SampleTokensRequest req;
  req.layers = 2;
  req.batch = 3;
  req.original_tokens = 10;
  req.retained_tokens = 4;
  req.seed = 1234;
  req.step = 7;
  req.ids = Buf("ids", 0, DType::kInt64, {2, 3, 4});
  req.inverse = Buf("inv", 0, DType::kInt32, {2, 3, 10});
  req.mask = Buf("mask", 0, DType::kFloat16, {3, 2, 1, 10});
  req.bert_mask = Buf("bert", 0, DType::kFloat16, {2, 3, 2, 4, 4});
  Memory expected = Snapshot();
  kernels::SampleTokensArgs args{2, 3, 10, 4, 1234, 7, View(*req.ids, &expected)};
  args.inverse = View(*req.inverse, &expected);
  args.mask = View(*req.mask, &expected);
  args.bert_mask = View(*req.bert_mask, &expected);
  ASSERT_OK(cpu::SampleTokens(args, nullptr));
  ASSERT_OK(Run(req));
  EXPECT_EQ(Snapshot(), expected);
}

TEST_F(ExecutorTest, SampleTokensInlineDefaultsToInt32AndHonoursInt64) {
  HostTensor mask = RandomHost(DType::kUInt8, {3, 2, 10, 10}, rng_);
  core::SampleTokensRequest req;
  req.layers = 2;
  req.batch = 3;
  req.original_tokens = 10;
  req.retained_tokens = 4;
  req.seed = 99;
  req.inverse = InlineOut();
  req.mask = Inline(mask);
  req.gpt_mask = InlineOut();
  HostTensor ids = RandomHost(DType::kInt32, {2, 3, 4}, rng_);
  HostTensor inverse = RandomHost(DType::kInt32, {2, 3, 10}, rng_);
  HostTensor gpt = RandomHost(DType::kUInt8, {3, 2, 4, 4}, rng_);
  kernels::SampleTokensArgs args{2, 3, 10, 4, 99, 0, ids.view()};
  args.inverse = inverse.view();
  args.mask = mask.view();
  args.gpt_mask = gpt.view();
  ASSERT_OK(cpu::SampleTokens(args, nullptr));
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  ASSERT_EQ(result->outputs.size(), 3u);
  ExpectInline(*result, "ids", ids);
  ExpectInline(*result, "inverse", inverse);
  ExpectInline(*result, "gpt_mask", gpt);
  // Independent of the oracle: every row is ascending and inside [0, S).
  const std::vector<int32_t> got = AsInt32(FindOutput(*result, "ids")->data);
  for (size_t row = 0; row < 6; ++row) {
    for (size_t j = 0; j < 4; ++j) {
      EXPECT_GE(got[row * 4 + j], 0);
      EXPECT_LT(got[row * 4 + j], 10);
      if (j > 0) {
        EXPECT_LT(got[row * 4 + j - 1], got[row * 4 + j]);
      }
    }
  }

  req = core::SampleTokensRequest{2, 3, 10, 4, 99};
  req.ids = InlineOut(DType::kInt64);
  absl::StatusOr<core::OpResult> wide = Run(req);
  ASSERT_OK(wide);
  const core::InlineOutput* ids64 = FindOutput(*wide, "ids");
  ASSERT_NE(ids64, nullptr);
  EXPECT_EQ(ids64->dtype, DType::kInt64);
  ASSERT_EQ(ids64->data.size(), 24u * 8);
  for (size_t i = 0; i < 24; ++i) {
    int64_t v;
    std::memcpy(&v, ids64->data.data() + i * 8, 8);
    EXPECT_EQ(v, got[i]) << i;
  }
}

// ---------------------------------------------------------------- TopKTokens

TEST_F(ExecutorTest, TopKTokensByBufferAndInline) {
  AddBuffer("scores", 3 * 12 * 4);
  AddBuffer("ids", 3 * 4 * 8);
  core::TopKTokensRequest req;
  req.scores = Buf("scores", 0, DType::kFloat32, {3, 10}, {12, 1});
  req.retained_tokens = 4;
  req.ids = Buf("ids", 0, DType::kInt64, {3, 4});
  Memory expected = Snapshot();
  ASSERT_OK(cpu::TopKTokens({View(req.scores, &expected), View(*req.ids, &expected)}, nullptr));
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  EXPECT_EQ(Snapshot(), expected);
  EXPECT_EQ(result->bytes_moved, 30u * 4 + 12 * 8);

  HostTensor scores = RandomHost(DType::kBFloat16, {2, 2, 9}, rng_);
  core::TopKTokensRequest inline_req;
  inline_req.scores = Inline(scores);
  inline_req.retained_tokens = 3;
  HostTensor ids = RandomHost(DType::kInt32, {2, 2, 3}, rng_);
  ASSERT_OK(cpu::TopKTokens({scores.view(), ids.view()}, nullptr));
  absl::StatusOr<core::OpResult> inline_result = Run(inline_req);
  ASSERT_OK(inline_result);
  ExpectInline(*inline_result, "ids", ids);
}

}  // namespace
}  // namespace tokensel::testing
