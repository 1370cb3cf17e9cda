#include "server/grpc/convert.h"

#include <string>
#include <variant>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

using ::tokensel::testing::StatusIs;
using Source = core::TensorSpec::Source;

// A buffer-backed tensor whose every field is distinct: dtype, shape
// {tag, tag+1}, strides {tag+2, 1}, buffer "buf<tag>", offset 1000+tag.
v1::Tensor BufferTensor(int tag, v1::DType dtype = v1::DTYPE_INT32) {
  v1::Tensor t;
  t.set_dtype(dtype);
  t.add_shape(tag);
  t.add_shape(tag + 1);
  t.add_strides(tag + 2);
  t.add_strides(1);
  t.mutable_buffer()->set_buffer("buf" + std::to_string(tag));
  t.mutable_buffer()->set_byte_offset(1000 + tag);
  return t;
}

void ExpectBufferTensor(const core::TensorSpec& spec, int tag,
                        kernels::DType dtype = kernels::DType::kInt32) {
  SCOPED_TRACE(tag);
  EXPECT_EQ(spec.source, Source::kBuffer);
  ASSERT_TRUE(spec.dtype.has_value());
  EXPECT_EQ(*spec.dtype, dtype);
  EXPECT_EQ(spec.shape, (std::vector<int64_t>{tag, tag + 1}));
  EXPECT_EQ(spec.strides, (std::vector<int64_t>{tag + 2, 1}));
  EXPECT_EQ(spec.buffer, "buf" + std::to_string(tag));
  EXPECT_EQ(spec.byte_offset, 1000u + tag);
}

void ExpectBufferTensor(const std::optional<core::TensorSpec>& spec, int tag) {
  ASSERT_TRUE(spec.has_value()) << tag;
  ExpectBufferTensor(*spec, tag);
}

TEST(DTypeTest, EveryProtoDTypeMapsToTheKernelDTypeOfTheSameName) {
  const std::pair<v1::DType, kernels::DType> cases[] = {
      {v1::DTYPE_BOOL, kernels::DType::kBool},
      {v1::DTYPE_INT8, kernels::DType::kInt8},
      {v1::DTYPE_UINT8, kernels::DType::kUInt8},
      {v1::DTYPE_FLOAT8_E4M3FN, kernels::DType::kFloat8E4M3},
      {v1::DTYPE_FLOAT8_E5M2, kernels::DType::kFloat8E5M2},
      {v1::DTYPE_FLOAT16, kernels::DType::kFloat16},
      {v1::DTYPE_BFLOAT16, kernels::DType::kBFloat16},
      {v1::DTYPE_INT16, kernels::DType::kInt16},
      {v1::DTYPE_FLOAT32, kernels::DType::kFloat32},
      {v1::DTYPE_INT32, kernels::DType::kInt32},
      {v1::DTYPE_FLOAT64, kernels::DType::kFloat64},
      {v1::DTYPE_INT64, kernels::DType::kInt64},
  };
  ASSERT_EQ(std::size(cases), static_cast<size_t>(kernels::kNumDTypes));
  for (const auto& [proto, kernel] : cases) {
    SCOPED_TRACE(v1::DType_Name(proto));
    absl::StatusOr<std::optional<kernels::DType>> d = DTypeFromProto(proto, "f");
    ASSERT_OK(d);
    ASSERT_TRUE(d->has_value());
    EXPECT_EQ(**d, kernel);
    EXPECT_EQ(DTypeToProto(kernel), proto);
    // The names agree too (kernels spell them numpy-style).
    std::string name(kernels::DTypeName(kernel));
    for (char& c : name) c = static_cast<char>(std::toupper(c));
    EXPECT_EQ(v1::DType_Name(proto), "DTYPE_" + name);
  }
}

TEST(DTypeTest, UnspecifiedIsNoneAndUnknownIsAnError) {
  absl::StatusOr<std::optional<kernels::DType>> d = DTypeFromProto(v1::DTYPE_UNSPECIFIED, "f");
  ASSERT_OK(d);
  EXPECT_FALSE(d->has_value());
  EXPECT_THAT(DTypeFromProto(13, "ids.dtype"),
              StatusIs(absl::StatusCode::kInvalidArgument, "ids.dtype: unknown dtype value 13"));
  EXPECT_THAT(DTypeFromProto(-1, "x"), StatusIs(absl::StatusCode::kInvalidArgument, "-1"));
}

TEST(TensorTest, InlineDataIsAViewIntoTheMessage) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FLOAT16);
  t.add_shape(2);
  t.set_inline_data(std::string("\x01\x02\x03\x04", 4));
  absl::StatusOr<core::TensorSpec> spec = TensorFromProto(t, "x");
  ASSERT_OK(spec);
  EXPECT_EQ(spec->source, Source::kInline);
  EXPECT_EQ(spec->inline_data.data(), t.inline_data().data());
  EXPECT_EQ(spec->inline_data.size(), 4u);
  EXPECT_TRUE(spec->strides.empty());
  EXPECT_TRUE(spec->buffer.empty());
}

TEST(TensorTest, NoDataIsNoneAndEmptyInlineIsStillInline) {
  v1::Tensor none;
  none.add_shape(3);
  absl::StatusOr<core::TensorSpec> spec = TensorFromProto(none, "x");
  ASSERT_OK(spec);
  EXPECT_EQ(spec->source, Source::kNone);
  EXPECT_FALSE(spec->dtype.has_value());
  EXPECT_EQ(spec->shape, std::vector<int64_t>{3});

  v1::Tensor empty_inline;
  empty_inline.set_inline_data("");
  spec = TensorFromProto(empty_inline, "x");
  ASSERT_OK(spec);
  EXPECT_EQ(spec->source, Source::kInline);
}

TEST(TensorTest, BadDTypeNamesTheField) {
  v1::GatherTokensRequest req;
  *req.mutable_activations() = BufferTensor(1);
  req.mutable_indices()->set_dtype(static_cast<v1::DType>(42));
  EXPECT_THAT(OpFromProto(req), StatusIs(absl::StatusCode::kInvalidArgument, "indices.dtype"));
  v1::Op op;
  *op.mutable_gather_tokens() = req;
  EXPECT_THAT(OpFromProto(op, "ops[3]."),
              StatusIs(absl::StatusCode::kInvalidArgument, "ops[3].gather_tokens.indices.dtype"));
}

TEST(OpTest, SortTokensEveryField) {
  v1::SortTokensRequest req;
  *req.mutable_ids() = BufferTensor(1);
  req.set_original_tokens(77);
  *req.mutable_out() = BufferTensor(2);
  *req.mutable_inverse() = BufferTensor(3);
  absl::StatusOr<core::SortTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->ids, 1);
  EXPECT_EQ(op->original_tokens, 77);
  ExpectBufferTensor(op->out, 2);
  ExpectBufferTensor(op->inverse, 3);

  req.clear_out();
  req.clear_inverse();
  op = OpFromProto(req);
  ASSERT_OK(op);
  EXPECT_FALSE(op->out.has_value());
  EXPECT_FALSE(op->inverse.has_value());
}

TEST(OpTest, GatherTokensEveryFieldAndInlineOut) {
  v1::GatherTokensRequest req;
  *req.mutable_activations() = BufferTensor(1, v1::DTYPE_BFLOAT16);
  *req.mutable_indices() = BufferTensor(2);
  req.mutable_out();  // present without data: returned inline
  req.set_batch_first(false);
  absl::StatusOr<core::GatherTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->activations, 1, kernels::DType::kBFloat16);
  ExpectBufferTensor(op->indices, 2);
  ASSERT_TRUE(op->out.has_value());
  EXPECT_EQ(op->out->source, Source::kNone);
  EXPECT_FALSE(op->batch_first);
  req.set_batch_first(true);
  EXPECT_TRUE(OpFromProto(req)->batch_first);
}

TEST(OpTest, ScatterTokensEveryField) {
  v1::ScatterTokensRequest req;
  *req.mutable_all() = BufferTensor(1);
  *req.mutable_layer() = BufferTensor(2);
  *req.mutable_indices() = BufferTensor(3);
  req.set_batch_first(true);
  absl::StatusOr<core::ScatterTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->all, 1);
  ExpectBufferTensor(op->layer, 2);
  ExpectBufferTensor(op->indices, 3);
  EXPECT_TRUE(op->batch_first);
}

TEST(OpTest, MissingRequiredInputIsNoneForTheCoreToReject) {
  v1::ScatterTokensRequest req;  // nothing set
  absl::StatusOr<core::ScatterTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  EXPECT_EQ(op->all.source, Source::kNone);
  EXPECT_EQ(op->layer.source, Source::kNone);
}

TEST(OpTest, MaskOpsEveryField) {
  v1::GatherBertMaskRequest bert;
  *bert.mutable_mask() = BufferTensor(1);
  *bert.mutable_indices() = BufferTensor(2);
  *bert.mutable_out() = BufferTensor(3);
  absl::StatusOr<core::GatherBertMaskRequest> b = OpFromProto(bert);
  ASSERT_OK(b);
  ExpectBufferTensor(b->mask, 1);
  ExpectBufferTensor(b->indices, 2);
  ExpectBufferTensor(b->out, 3);

  v1::SliceGptMaskRequest gpt;
  *gpt.mutable_mask() = BufferTensor(4);
  gpt.set_retained_tokens(9);
  absl::StatusOr<core::SliceGptMaskRequest> g = OpFromProto(gpt);
  ASSERT_OK(g);
  ExpectBufferTensor(g->mask, 4);
  EXPECT_EQ(g->retained_tokens, 9);
  EXPECT_FALSE(g->out.has_value());
}

TEST(OpTest, SegmentSeqlensEveryField) {
  v1::SegmentSeqlensRequest req;
  *req.mutable_segment_ids_q() = BufferTensor(1);
  *req.mutable_segment_pos_q() = BufferTensor(2);
  *req.mutable_segment_ids_kv() = BufferTensor(3);
  *req.mutable_segment_pos_kv() = BufferTensor(4);
  req.set_max_segments(5);
  req.set_mask(v1::ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
  req.set_packed(true);
  *req.mutable_q_seqlen() = BufferTensor(8);
  *req.mutable_q_offset() = BufferTensor(9);
  *req.mutable_kv_seqlen() = BufferTensor(10);
  *req.mutable_kv_offset() = BufferTensor(11);
  *req.mutable_q_packed_seqlens() = BufferTensor(12);
  *req.mutable_q_packed_offsets() = BufferTensor(13);
  *req.mutable_q_cu_seqlens() = BufferTensor(14);
  *req.mutable_kv_packed_seqlens() = BufferTensor(15);
  *req.mutable_kv_packed_offsets() = BufferTensor(16);
  *req.mutable_kv_cu_seqlens() = BufferTensor(17);
  absl::StatusOr<core::SegmentSeqlensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->segment_ids_q, 1);
  ExpectBufferTensor(op->segment_pos_q, 2);
  ExpectBufferTensor(op->segment_ids_kv, 3);
  ExpectBufferTensor(op->segment_pos_kv, 4);
  EXPECT_EQ(op->max_segments, 5);
  EXPECT_EQ(op->mask, kernels::AttnMaskType::kCausalBottomRight);
  EXPECT_TRUE(op->packed);
  ExpectBufferTensor(op->q_seqlen, 8);
  ExpectBufferTensor(op->q_offset, 9);
  ExpectBufferTensor(op->kv_seqlen, 10);
  ExpectBufferTensor(op->kv_offset, 11);
  ExpectBufferTensor(op->q_packed_seqlens, 12);
  ExpectBufferTensor(op->q_packed_offsets, 13);
  ExpectBufferTensor(op->q_cu_seqlens, 14);
  ExpectBufferTensor(op->kv_packed_seqlens, 15);
  ExpectBufferTensor(op->kv_packed_offsets, 16);
  ExpectBufferTensor(op->kv_cu_seqlens, 17);

  req.set_mask(v1::ATTN_MASK_PADDING);
  EXPECT_EQ(OpFromProto(req)->mask, kernels::AttnMaskType::kPadding);
  req.set_mask(v1::ATTN_MASK_CAUSAL);
  EXPECT_EQ(OpFromProto(req)->mask, kernels::AttnMaskType::kCausal);
  req.set_mask(static_cast<v1::AttnMaskType>(7));
  EXPECT_THAT(OpFromProto(req), StatusIs(absl::StatusCode::kInvalidArgument, "mask"));
}

TEST(OpTest, SampleTokensEveryField) {
  v1::SampleTokensRequest req;
  req.set_layers(2);
  req.set_batch(3);
  req.set_original_tokens(64);
  req.set_retained_tokens(16);
  req.set_seed(0xdeadbeefcafeULL);
  req.set_step(41);
  *req.mutable_ids() = BufferTensor(7);
  *req.mutable_inverse() = BufferTensor(8);
  *req.mutable_mask() = BufferTensor(9);
  *req.mutable_bert_mask() = BufferTensor(10);
  *req.mutable_gpt_mask() = BufferTensor(11);
  absl::StatusOr<core::SampleTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  EXPECT_EQ(op->layers, 2);
  EXPECT_EQ(op->batch, 3);
  EXPECT_EQ(op->original_tokens, 64);
  EXPECT_EQ(op->retained_tokens, 16);
  EXPECT_EQ(op->seed, 0xdeadbeefcafeULL);
  EXPECT_EQ(op->step, 41u);
  ExpectBufferTensor(op->ids, 7);
  ExpectBufferTensor(op->inverse, 8);
  ExpectBufferTensor(op->mask, 9);
  ExpectBufferTensor(op->bert_mask, 10);
  ExpectBufferTensor(op->gpt_mask, 11);
}

TEST(OpTest, TopKTokensEveryField) {
  v1::TopKTokensRequest req;
  *req.mutable_scores() = BufferTensor(1, v1::DTYPE_FLOAT32);
  req.set_retained_tokens(4);
  absl::StatusOr<core::TopKTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->scores, 1, kernels::DType::kFloat32);
  EXPECT_EQ(op->retained_tokens, 4);
  EXPECT_FALSE(op->ids.has_value());
}

TEST(OpTest, MergeTokensEveryFieldAndTheDefaults) {
  v1::MergeTokensRequest req;
  *req.mutable_x() = BufferTensor(1);
  *req.mutable_layer() = BufferTensor(2);
  *req.mutable_indices() = BufferTensor(3);
  absl::StatusOr<core::MergeTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->x, 1);
  ExpectBufferTensor(op->layer, 2);
  ExpectBufferTensor(op->indices, 3);
  EXPECT_FALSE(op->out.has_value()) << "absent out = inline";
  EXPECT_TRUE(op->batch_first) << "absent batch_first = true";
  *req.mutable_out() = BufferTensor(4);
  req.set_batch_first(false);
  op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->out, 4);
  EXPECT_FALSE(op->batch_first);
  req.set_batch_first(true);
  EXPECT_TRUE(OpFromProto(req)->batch_first);
}

TEST(OpTest, SplitTokensEveryFieldAndTheDefaults) {
  v1::SplitTokensRequest req;
  *req.mutable_grad() = BufferTensor(1);
  *req.mutable_indices() = BufferTensor(2);
  absl::StatusOr<core::SplitTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->grad, 1);
  ExpectBufferTensor(op->indices, 2);
  EXPECT_FALSE(op->layer_grad.has_value()) << "absent layer_grad = inline";
  EXPECT_FALSE(op->rest_grad.has_value()) << "absent rest_grad = inline";
  EXPECT_TRUE(op->batch_first) << "absent batch_first = true";
  *req.mutable_layer_grad() = BufferTensor(3);
  *req.mutable_rest_grad() = BufferTensor(4);
  req.set_batch_first(false);
  op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->layer_grad, 3);
  ExpectBufferTensor(op->rest_grad, 4);
  EXPECT_FALSE(op->batch_first);
}

TEST(OpTest, SamplePackedTokensEveryField) {
  v1::SamplePackedTokensRequest req;
  *req.mutable_cu_seqlens() = BufferTensor(1);
  req.set_total_tokens(40);
  req.set_kept_tokens(17);
  req.set_keep_num(3);
  req.set_keep_den(7);
  req.set_min_tokens(2);
  req.set_layers(4);
  req.set_seed(0xFFFFFFFFFFull);
  req.set_step(9);
  *req.mutable_activations() = BufferTensor(2);
  *req.mutable_cu_seqlens_kept() = BufferTensor(3);
  *req.mutable_ids() = BufferTensor(4);
  *req.mutable_positions() = BufferTensor(5);
  *req.mutable_inverse() = BufferTensor(6);
  *req.mutable_out() = BufferTensor(7);
  absl::StatusOr<core::SamplePackedTokensRequest> op = OpFromProto(req);
  ASSERT_OK(op);
  ExpectBufferTensor(op->cu_seqlens, 1);
  EXPECT_EQ(op->total_tokens, 40);
  EXPECT_EQ(op->kept_tokens, 17);
  EXPECT_EQ(op->keep_num, 3);
  EXPECT_EQ(op->keep_den, 7);
  EXPECT_EQ(op->min_tokens, 2);
  EXPECT_EQ(op->layers, 4);
  EXPECT_EQ(op->seed, 0xFFFFFFFFFFull);
  EXPECT_EQ(op->step, 9u);
  ExpectBufferTensor(op->activations, 2);
  ExpectBufferTensor(op->cu_seqlens_kept, 3);
  ExpectBufferTensor(op->ids, 4);
  ExpectBufferTensor(op->positions, 5);
  ExpectBufferTensor(op->inverse, 6);
  ExpectBufferTensor(op->out, 7);
}

TEST(OpTest, OneofPicksTheOperatorAndUnsetIsAnError) {
  v1::Op op;
  op.mutable_top_k_tokens()->set_retained_tokens(3);
  absl::StatusOr<core::OpRequest> r = OpFromProto(op);
  ASSERT_OK(r);
  ASSERT_TRUE(std::holds_alternative<core::TopKTokensRequest>(*r));
  EXPECT_EQ(std::get<core::TopKTokensRequest>(*r).retained_tokens, 3);

  const struct {
    void (*set)(v1::Op*);
    size_t index;
  } cases[] = {
      {[](v1::Op* o) { o->mutable_sort_tokens(); }, 0},
      {[](v1::Op* o) { o->mutable_gather_tokens(); }, 1},
      {[](v1::Op* o) { o->mutable_scatter_tokens(); }, 2},
      {[](v1::Op* o) { o->mutable_gather_bert_mask(); }, 3},
      {[](v1::Op* o) { o->mutable_slice_gpt_mask(); }, 4},
      {[](v1::Op* o) { o->mutable_segment_seqlens(); }, 5},
      {[](v1::Op* o) { o->mutable_sample_tokens(); }, 6},
      {[](v1::Op* o) { o->mutable_top_k_tokens(); }, 7},
      {[](v1::Op* o) { o->mutable_merge_tokens(); }, 8},
      {[](v1::Op* o) { o->mutable_split_tokens(); }, 9},
      {[](v1::Op* o) { o->mutable_sample_packed_tokens(); }, 10},
  };
  for (const auto& c : cases) {
    v1::Op o;
    c.set(&o);
    absl::StatusOr<core::OpRequest> converted = OpFromProto(o);
    ASSERT_OK(converted);
    EXPECT_EQ(converted->index(), c.index);
  }
  EXPECT_THAT(OpFromProto(v1::Op(), "op."),
              StatusIs(absl::StatusCode::kInvalidArgument, "op.op: no operator set"));
}

TEST(OpTest, ExecuteOpsInOrderWithIndexedErrors) {
  v1::ExecuteRequest req;
  req.add_ops()->mutable_sort_tokens()->set_original_tokens(1);
  req.add_ops()->mutable_top_k_tokens()->set_retained_tokens(2);
  absl::StatusOr<std::vector<core::OpRequest>> ops = OpsFromProto(req);
  ASSERT_OK(ops);
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ(std::get<core::SortTokensRequest>((*ops)[0]).original_tokens, 1);
  EXPECT_EQ(std::get<core::TopKTokensRequest>((*ops)[1]).retained_tokens, 2);
  req.add_ops();
  EXPECT_THAT(OpsFromProto(req), StatusIs(absl::StatusCode::kInvalidArgument, "ops[2].op"));
}

TEST(RegionTest, HostShmByNameIsRefusedCudaIpcConvertsAndSourceIsRequired) {
  v1::RegisterBufferRequest req;
  req.set_name("acts");
  req.mutable_host_shm()->set_shm_name("/tokensel-a");
  req.mutable_host_shm()->set_offset(4096);
  req.mutable_host_shm()->set_size(1 << 20);
  // The server would open it with its own rights: never.
  EXPECT_THAT(RegionFromProto(req), StatusIs(absl::StatusCode::kPermissionDenied,
                                             "host_shm: registration by name is refused"));
  absl::StatusOr<core::RegionSpec> spec;
  req.mutable_fd()->set_ticket("0123");  // redeemed by the handler, not here
  EXPECT_THAT(RegionFromProto(req), StatusIs(absl::StatusCode::kInvalidArgument, "fd"));

  req.mutable_cuda_ipc()->set_handle(std::string(64, '\x7f'));
  req.mutable_cuda_ipc()->set_device_uuid("GPU-1234");
  req.mutable_cuda_ipc()->set_offset(512);
  req.mutable_cuda_ipc()->set_size(2048);
  spec = RegionFromProto(req);
  ASSERT_OK(spec);
  const auto& ipc = std::get<core::CudaIpcSpec>(*spec);
  EXPECT_EQ(ipc.handle, std::string(64, '\x7f'));
  EXPECT_EQ(ipc.device_uuid, "GPU-1234");
  EXPECT_EQ(ipc.offset, 512u);
  EXPECT_EQ(ipc.size, 2048u);

  req.clear_source();
  EXPECT_THAT(RegionFromProto(req), StatusIs(absl::StatusCode::kInvalidArgument, "source"));
}

TEST(ResultTest, InlineOutputsMoveIntoNamedTensors) {
  core::OpResult result;
  core::InlineOutput out;
  out.name = "out";
  out.dtype = kernels::DType::kFloat16;
  out.shape = {2, 3};
  out.data = std::string(12, 'x');
  result.outputs.push_back(std::move(out));
  core::InlineOutput inverse;
  inverse.name = "inverse";
  inverse.dtype = kernels::DType::kInt32;
  inverse.shape = {4};
  inverse.data = std::string(16, 'y');
  result.outputs.push_back(std::move(inverse));

  v1::OpResponse response;
  OpResultToProto(std::move(result), &response);
  ASSERT_EQ(response.outputs_size(), 2);
  EXPECT_EQ(response.outputs(0).name(), "out");
  EXPECT_EQ(response.outputs(0).tensor().dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(response.outputs(0).tensor().shape_size(), 2);
  EXPECT_EQ(response.outputs(0).tensor().shape(1), 3);
  EXPECT_EQ(response.outputs(0).tensor().inline_data(), std::string(12, 'x'));
  EXPECT_EQ(response.outputs(1).name(), "inverse");
  EXPECT_EQ(response.outputs(1).tensor().dtype(), v1::DTYPE_INT32);
  EXPECT_EQ(response.outputs(1).tensor().inline_data(), std::string(16, 'y'));
  EXPECT_TRUE(response.outputs(1).tensor().strides().empty());

  // Round trip: the response tensor converts back to the same inline spec.
  absl::StatusOr<core::TensorSpec> back = TensorFromProto(response.outputs(0).tensor(), "out");
  ASSERT_OK(back);
  EXPECT_EQ(back->source, Source::kInline);
  EXPECT_EQ(back->dtype, kernels::DType::kFloat16);
  EXPECT_EQ(back->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(back->inline_data, std::string(12, 'x'));
}

TEST(InfoTest, BufferAndServerInfo) {
  core::BufferInfo info{"acts", "host_shm", 4096, "", true};
  v1::BufferInfo b;
  BufferInfoToProto(info, &b);
  EXPECT_EQ(b.name(), "acts");
  EXPECT_EQ(b.kind(), "host_shm");
  EXPECT_EQ(b.size(), 4096u);
  EXPECT_TRUE(b.sealed());

  core::ServerDescription d;
  d.version = "1.2.3";
  d.backend = "cuda";
  d.devices.push_back({1, "GPU-abc", "H100", 90, 80ull << 30});
  d.devices.push_back({2, "GPU-def", "H100", 90, 80ull << 30});  // every device is listed
  d.max_message_bytes = 1 << 26;
  d.max_buffers_per_session = 7;
  d.max_inflight = 8;
  d.session_ttl_ms = 60000;
  d.max_rank = 6;
  d.max_sessions_per_peer = 9;
  d.max_buffers_total = 10;
  d.max_op_elements = 11;
  d.max_request_memory_bytes = 12;
  d.memory_budget_bytes = 13;
  d.shm_prefix = "/tokensel";
  d.memory_kinds = {"host_shm", "cuda_ipc"};
  d.fd_channel = true;
  d.ipc_events = true;
  d.max_async_executes_per_session = 14;
  d.max_async_executes = 15;
  d.max_stuck_executes_per_session = 16;
  d.max_stuck_executes = 17;
  d.max_async_executes_per_peer = 18;
  d.max_stuck_executes_per_peer = 19;
  v1::ServerInfo s;
  ServerInfoToProto(d, &s);
  EXPECT_EQ(s.version(), "1.2.3");
  EXPECT_EQ(s.backend(), "cuda");
  ASSERT_EQ(s.devices_size(), 2);
  EXPECT_EQ(s.devices(1).ordinal(), 2);
  EXPECT_EQ(s.devices(1).uuid(), "GPU-def");
  EXPECT_EQ(s.devices(0).ordinal(), 1);
  EXPECT_EQ(s.devices(0).uuid(), "GPU-abc");
  EXPECT_EQ(s.devices(0).name(), "H100");
  EXPECT_EQ(s.devices(0).compute_capability(), 90);
  EXPECT_EQ(s.devices(0).total_memory_bytes(), 80ull << 30);
  EXPECT_EQ(s.limits().max_message_bytes(), 1u << 26);
  EXPECT_EQ(s.limits().max_buffers_per_session(), 7u);
  EXPECT_EQ(s.limits().max_inflight(), 8u);
  EXPECT_EQ(s.limits().session_ttl_ms(), 60000u);
  EXPECT_EQ(s.limits().max_rank(), 6u);
  EXPECT_EQ(s.limits().max_sessions_per_peer(), 9u);
  EXPECT_EQ(s.limits().max_buffers_total(), 10u);
  EXPECT_EQ(s.limits().max_op_elements(), 11u);
  EXPECT_EQ(s.limits().max_request_memory_bytes(), 12u);
  EXPECT_EQ(s.limits().memory_budget_bytes(), 13u);
  EXPECT_TRUE(s.fd_channel());
  EXPECT_TRUE(s.ipc_events());
  EXPECT_EQ(s.limits().max_async_executes_per_session(), 14u);
  EXPECT_EQ(s.limits().max_async_executes(), 15u);
  EXPECT_EQ(s.limits().max_stuck_executes_per_session(), 16u);
  EXPECT_EQ(s.limits().max_stuck_executes(), 17u);
  EXPECT_EQ(s.limits().max_async_executes_per_peer(), 18u);
  EXPECT_EQ(s.limits().max_stuck_executes_per_peer(), 19u);
  EXPECT_EQ(s.shm_prefix(), "/tokensel");
  ASSERT_EQ(s.memory_kinds_size(), 2);
  EXPECT_EQ(s.memory_kinds(1), "cuda_ipc");
}

}  // namespace
}  // namespace tokensel::server
