// Every documented default and every optional-absent path of the
// proto -> core conversion (server/grpc/convert.cc), request by request, as
// proto/tokensel/v1/tokensel.proto's comments and docs/ops.md state them:
//  - Tensor: DTYPE_UNSPECIFIED = no dtype; empty strides = row-major (kept
//    empty for the core); no data = an output asked for inline; a buffer
//    slice without byte_offset starts at 0.
//  - `optional bool batch_first`: absent = true (GatherTokens, ScatterTokens),
//    and an explicit false / true is kept.
//  - every optional tensor absent -> std::nullopt (not computed / in place /
//    inline, as each op documents), present without data -> Source::kNone.
//  - scalars absent = 0 (SampleTokens step and seed, counts), the mask enum
//    absent = ATTN_MASK_PADDING, packed absent = false.
// convert_test.cc sets most fields explicitly; here nothing is set that the
// case does not name. Each case goes through the per-request overload and
// through v1::Op (the path the handlers take).
#include <variant>

#include "gtest/gtest.h"
#include "server/grpc/convert.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

using Source = core::TensorSpec::Source;

// An input tensor with only what an input needs: dtype, shape, inline data.
v1::Tensor MinimalInput() {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_INT32);
  t.add_shape(1);
  t.set_inline_data(std::string(4, '\0'));
  return t;
}

// Converts `req` through the oneof of v1::Op and returns the core request.
template <typename Core, typename Req>
Core ThroughOp(const Req& req, Req* (v1::Op::*mutable_field)()) {
  v1::Op op;
  *(op.*mutable_field)() = req;
  absl::StatusOr<core::OpRequest> converted = OpFromProto(op);
  EXPECT_OK(converted);
  if (!converted.ok() || !std::holds_alternative<Core>(*converted)) {
    ADD_FAILURE() << "wrong operator";
    return Core{};
  }
  return std::get<Core>(*converted);
}

TEST(ConvertDefaultsTest, TensorUnsetFields) {
  v1::Tensor t;  // nothing at all: an output asked for inline, type derived
  absl::StatusOr<core::TensorSpec> spec = TensorFromProto(t, "out");
  ASSERT_OK(spec);
  EXPECT_FALSE(spec->dtype.has_value());
  EXPECT_TRUE(spec->shape.empty());
  EXPECT_TRUE(spec->strides.empty());
  EXPECT_EQ(spec->source, Source::kNone);

  t.set_dtype(v1::DTYPE_FLOAT16);
  t.add_shape(2);
  t.add_shape(3);
  t.mutable_buffer()->set_buffer("b");  // no byte_offset: element 0 at byte 0
  spec = TensorFromProto(t, "out");
  ASSERT_OK(spec);
  EXPECT_EQ(spec->source, Source::kBuffer);
  EXPECT_EQ(spec->buffer, "b");
  EXPECT_EQ(spec->byte_offset, 0u);
  EXPECT_TRUE(spec->strides.empty());  // row-major, decided by the core
  EXPECT_EQ(spec->shape, (std::vector<int64_t>{2, 3}));
}

TEST(ConvertDefaultsTest, SortTokensOutAndInverseAbsent) {
  v1::SortTokensRequest req;
  *req.mutable_ids() = MinimalInput();
  for (const core::SortTokensRequest& op :
       {*OpFromProto(req), ThroughOp<core::SortTokensRequest>(req, &v1::Op::mutable_sort_tokens)}) {
    EXPECT_EQ(op.ids.source, Source::kInline);
    EXPECT_FALSE(op.out.has_value());  // absent = sort in place
    EXPECT_FALSE(op.inverse.has_value());
    EXPECT_EQ(op.original_tokens, 0);
  }
}

TEST(ConvertDefaultsTest, GatherTokensBatchFirstAbsentIsTrueAndOutAbsent) {
  v1::GatherTokensRequest req;
  *req.mutable_activations() = MinimalInput();
  *req.mutable_indices() = MinimalInput();
  ASSERT_FALSE(req.has_batch_first());
  for (const core::GatherTokensRequest& op :
       {*OpFromProto(req),
        ThroughOp<core::GatherTokensRequest>(req, &v1::Op::mutable_gather_tokens)}) {
    EXPECT_TRUE(op.batch_first) << "absent batch_first must mean [B,S,C]";
    EXPECT_FALSE(op.out.has_value());  // absent = inline
  }
  req.set_batch_first(false);
  EXPECT_FALSE(OpFromProto(req)->batch_first);
  EXPECT_FALSE(
      ThroughOp<core::GatherTokensRequest>(req, &v1::Op::mutable_gather_tokens).batch_first);
  req.set_batch_first(true);
  EXPECT_TRUE(OpFromProto(req)->batch_first);
}

TEST(ConvertDefaultsTest, ScatterTokensBatchFirstAbsentIsTrue) {
  v1::ScatterTokensRequest req;
  *req.mutable_all() = MinimalInput();
  *req.mutable_layer() = MinimalInput();
  *req.mutable_indices() = MinimalInput();
  ASSERT_FALSE(req.has_batch_first());
  for (const core::ScatterTokensRequest& op :
       {*OpFromProto(req),
        ThroughOp<core::ScatterTokensRequest>(req, &v1::Op::mutable_scatter_tokens)}) {
    EXPECT_TRUE(op.batch_first) << "absent batch_first must mean [B,S,C]";
  }
  req.set_batch_first(false);
  EXPECT_FALSE(OpFromProto(req)->batch_first);
  EXPECT_FALSE(
      ThroughOp<core::ScatterTokensRequest>(req, &v1::Op::mutable_scatter_tokens).batch_first);
}

TEST(ConvertDefaultsTest, MaskOpsOutAbsent) {
  v1::GatherBertMaskRequest bert;
  *bert.mutable_mask() = MinimalInput();
  *bert.mutable_indices() = MinimalInput();
  EXPECT_FALSE(OpFromProto(bert)->out.has_value());
  EXPECT_FALSE(ThroughOp<core::GatherBertMaskRequest>(bert, &v1::Op::mutable_gather_bert_mask)
                   .out.has_value());
  bert.mutable_out();  // present without data: inline
  ASSERT_TRUE(OpFromProto(bert)->out.has_value());
  EXPECT_EQ(OpFromProto(bert)->out->source, Source::kNone);

  v1::SliceGptMaskRequest gpt;
  *gpt.mutable_mask() = MinimalInput();
  for (const core::SliceGptMaskRequest& op :
       {*OpFromProto(gpt),
        ThroughOp<core::SliceGptMaskRequest>(gpt, &v1::Op::mutable_slice_gpt_mask)}) {
    EXPECT_FALSE(op.out.has_value());
    EXPECT_EQ(op.retained_tokens, 0);
  }
}

TEST(ConvertDefaultsTest, SegmentSeqlensSelfAttentionPaddingUnpackedAllInline) {
  v1::SegmentSeqlensRequest req;
  *req.mutable_segment_ids_q() = MinimalInput();
  req.set_max_segments(3);
  for (const core::SegmentSeqlensRequest& op :
       {*OpFromProto(req),
        ThroughOp<core::SegmentSeqlensRequest>(req, &v1::Op::mutable_segment_seqlens)}) {
    EXPECT_EQ(op.segment_ids_q.source, Source::kInline);
    EXPECT_FALSE(op.segment_pos_q.has_value());
    EXPECT_FALSE(op.segment_ids_kv.has_value());  // absent = self-attention
    EXPECT_FALSE(op.segment_pos_kv.has_value());
    EXPECT_EQ(op.max_segments, 3);
    EXPECT_EQ(op.mask, kernels::AttnMaskType::kPadding);  // enum value 0
    EXPECT_FALSE(op.packed);
    for (const auto* out : {&op.q_seqlen, &op.q_offset, &op.kv_seqlen, &op.kv_offset,
                            &op.q_packed_seqlens, &op.q_packed_offsets, &op.q_cu_seqlens,
                            &op.kv_packed_seqlens, &op.kv_packed_offsets, &op.kv_cu_seqlens}) {
      EXPECT_FALSE(out->has_value());
    }
  }
  // Each optional input alone: only that one becomes present.
  req.mutable_segment_pos_q()->CopyFrom(MinimalInput());
  absl::StatusOr<core::SegmentSeqlensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  EXPECT_TRUE(op->segment_pos_q.has_value());
  EXPECT_FALSE(op->segment_ids_kv.has_value());
  EXPECT_FALSE(op->segment_pos_kv.has_value());
  req.clear_segment_pos_q();
  req.mutable_segment_ids_kv()->CopyFrom(MinimalInput());
  op = OpFromProto(req);
  ASSERT_OK(op);
  EXPECT_FALSE(op->segment_pos_q.has_value());
  EXPECT_TRUE(op->segment_ids_kv.has_value());
  EXPECT_FALSE(op->segment_pos_kv.has_value());
}

TEST(ConvertDefaultsTest, SampleTokensScalarsZeroAndEveryTensorAbsent) {
  v1::SampleTokensRequest req;
  req.set_layers(2);
  req.set_batch(3);
  req.set_original_tokens(8);
  req.set_retained_tokens(4);
  for (const core::SampleTokensRequest& op :
       {*OpFromProto(req),
        ThroughOp<core::SampleTokensRequest>(req, &v1::Op::mutable_sample_tokens)}) {
    EXPECT_EQ(op.layers, 2);
    EXPECT_EQ(op.batch, 3);
    EXPECT_EQ(op.original_tokens, 8);
    EXPECT_EQ(op.retained_tokens, 4);
    EXPECT_EQ(op.seed, 0u);
    EXPECT_EQ(op.step, 0u);            // absent step = 0
    EXPECT_FALSE(op.ids.has_value());  // absent = inline int32
    EXPECT_FALSE(op.inverse.has_value());
    EXPECT_FALSE(op.mask.has_value());
    EXPECT_FALSE(op.bert_mask.has_value());
    EXPECT_FALSE(op.gpt_mask.has_value());
  }
}

// total_tokens and kept_tokens absent stay absent (not 0: T and T' are
// then derived, docs/ops.md section 11); every output absent.
TEST(ConvertDefaultsTest, SamplePackedTokensOptionalCountsAbsentAndEveryOutputAbsent) {
  v1::SamplePackedTokensRequest req;
  *req.mutable_cu_seqlens() = v1::Tensor();
  req.mutable_cu_seqlens()->set_inline_data(std::string(8, '\0'));
  for (const core::SamplePackedTokensRequest& op :
       {*OpFromProto(req),
        ThroughOp<core::SamplePackedTokensRequest>(req, &v1::Op::mutable_sample_packed_tokens)}) {
    EXPECT_FALSE(op.total_tokens.has_value());
    EXPECT_FALSE(op.kept_tokens.has_value());
    EXPECT_EQ(op.keep_num, 0);
    EXPECT_EQ(op.keep_den, 0);  // absent: the kernel's "keep_den: 0" error
    EXPECT_EQ(op.min_tokens, 0);
    EXPECT_EQ(op.layers, 0);
    EXPECT_EQ(op.seed, 0u);
    EXPECT_EQ(op.step, 0u);
    EXPECT_FALSE(op.activations.has_value());
    EXPECT_FALSE(op.cu_seqlens_kept.has_value());  // absent = inline
    EXPECT_FALSE(op.ids.has_value());              // absent = inline
    EXPECT_FALSE(op.positions.has_value());
    EXPECT_FALSE(op.inverse.has_value());
    EXPECT_FALSE(op.out.has_value());
  }
  req.set_total_tokens(0);  // present 0 is not absent
  req.set_kept_tokens(0);
  const core::SamplePackedTokensRequest op = *OpFromProto(req);
  EXPECT_EQ(op.total_tokens, 0);
  EXPECT_EQ(op.kept_tokens, 0);
}

TEST(ConvertDefaultsTest, TopKTokensIdsAbsent) {
  v1::TopKTokensRequest req;
  *req.mutable_scores() = MinimalInput();
  req.set_retained_tokens(1);
  for (const core::TopKTokensRequest& op :
       {*OpFromProto(req),
        ThroughOp<core::TopKTokensRequest>(req, &v1::Op::mutable_top_k_tokens)}) {
    EXPECT_FALSE(op.ids.has_value());  // absent = inline int32
    EXPECT_EQ(op.retained_tokens, 1);
  }
}

TEST(ConvertDefaultsTest, EmptyExecuteIsNoOps) {
  v1::ExecuteRequest req;
  absl::StatusOr<std::vector<core::OpRequest>> ops = OpsFromProto(req);
  ASSERT_OK(ops);
  EXPECT_TRUE(ops->empty());
}

}  // namespace
}  // namespace tokensel::server
