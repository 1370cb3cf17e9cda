#include "server/grpc/convert.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tokensel::server {
namespace {

constexpr int kNumProtoDTypes = kernels::kNumDTypes;  // DTYPE_BOOL .. DTYPE_INT64

// Converts `tensor` into `*out` when `present`; leaves it empty otherwise.
absl::Status OptionalTensor(bool present, const v1::Tensor& tensor, absl::string_view field,
                            std::optional<core::TensorSpec>* out) {
  if (!present) {
    out->reset();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(*out, TensorFromProto(tensor, field));
  return absl::OkStatus();
}

// Helpers that expand to the field name with prefix, keeping the call sites short.
#define TS_REQUIRED(dst, msg, name) \
  ASSIGN_OR_RETURN(dst, TensorFromProto(msg.name(), absl::StrCat(prefix, #name)))
#define TS_OPTIONAL(dst, msg, name) \
  RETURN_IF_ERROR(OptionalTensor(msg.has_##name(), msg.name(), absl::StrCat(prefix, #name), &dst))

}  // namespace

absl::StatusOr<std::optional<kernels::DType>> DTypeFromProto(int dtype, absl::string_view field) {
  if (dtype == v1::DTYPE_UNSPECIFIED) return std::optional<kernels::DType>();
  if (dtype < 1 || dtype > kNumProtoDTypes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": unknown dtype value ", dtype));
  }
  // The proto enum lists the kernels' dtypes in the same order, from 1.
  return std::optional<kernels::DType>(static_cast<kernels::DType>(dtype - 1));
}

v1::DType DTypeToProto(kernels::DType dtype) {
  return static_cast<v1::DType>(static_cast<int>(dtype) + 1);
}

absl::StatusOr<core::TensorSpec> TensorFromProto(const v1::Tensor& tensor,
                                                 absl::string_view field) {
  core::TensorSpec spec;
  ASSIGN_OR_RETURN(spec.dtype, DTypeFromProto(tensor.dtype(), absl::StrCat(field, ".dtype")));
  spec.shape.assign(tensor.shape().begin(), tensor.shape().end());
  spec.strides.assign(tensor.strides().begin(), tensor.strides().end());
  switch (tensor.data_case()) {
    case v1::Tensor::kBuffer:
      spec.source = core::TensorSpec::Source::kBuffer;
      spec.buffer = tensor.buffer().buffer();
      spec.byte_offset = tensor.buffer().byte_offset();
      break;
    case v1::Tensor::kInlineData:
      spec.source = core::TensorSpec::Source::kInline;
      spec.inline_data = absl::string_view(tensor.inline_data());
      break;
    case v1::Tensor::DATA_NOT_SET:
      spec.source = core::TensorSpec::Source::kNone;
      break;
  }
  return spec;
}

absl::StatusOr<core::SortTokensRequest> OpFromProto(const v1::SortTokensRequest& req,
                                                    absl::string_view prefix) {
  core::SortTokensRequest op;
  TS_REQUIRED(op.ids, req, ids);
  op.original_tokens = req.original_tokens();
  TS_OPTIONAL(op.out, req, out);
  TS_OPTIONAL(op.inverse, req, inverse);
  return op;
}

absl::StatusOr<core::GatherTokensRequest> OpFromProto(const v1::GatherTokensRequest& req,
                                                      absl::string_view prefix) {
  core::GatherTokensRequest op;
  TS_REQUIRED(op.activations, req, activations);
  TS_REQUIRED(op.indices, req, indices);
  TS_OPTIONAL(op.out, req, out);
  op.batch_first = !req.has_batch_first() || req.batch_first();
  return op;
}

absl::StatusOr<core::ScatterTokensRequest> OpFromProto(const v1::ScatterTokensRequest& req,
                                                       absl::string_view prefix) {
  core::ScatterTokensRequest op;
  TS_REQUIRED(op.all, req, all);
  TS_REQUIRED(op.layer, req, layer);
  TS_REQUIRED(op.indices, req, indices);
  op.batch_first = !req.has_batch_first() || req.batch_first();
  return op;
}

absl::StatusOr<core::GatherBertMaskRequest> OpFromProto(const v1::GatherBertMaskRequest& req,
                                                        absl::string_view prefix) {
  core::GatherBertMaskRequest op;
  TS_REQUIRED(op.mask, req, mask);
  TS_REQUIRED(op.indices, req, indices);
  TS_OPTIONAL(op.out, req, out);
  return op;
}

absl::StatusOr<core::SliceGptMaskRequest> OpFromProto(const v1::SliceGptMaskRequest& req,
                                                      absl::string_view prefix) {
  core::SliceGptMaskRequest op;
  TS_REQUIRED(op.mask, req, mask);
  op.retained_tokens = req.retained_tokens();
  TS_OPTIONAL(op.out, req, out);
  return op;
}

absl::StatusOr<core::SegmentSeqlensRequest> OpFromProto(const v1::SegmentSeqlensRequest& req,
                                                        absl::string_view prefix) {
  core::SegmentSeqlensRequest op;
  TS_REQUIRED(op.segment_ids_q, req, segment_ids_q);
  TS_OPTIONAL(op.segment_pos_q, req, segment_pos_q);
  TS_OPTIONAL(op.segment_ids_kv, req, segment_ids_kv);
  TS_OPTIONAL(op.segment_pos_kv, req, segment_pos_kv);
  op.max_segments = req.max_segments();
  switch (req.mask()) {
    case v1::ATTN_MASK_PADDING:
      op.mask = kernels::AttnMaskType::kPadding;
      break;
    case v1::ATTN_MASK_CAUSAL:
      op.mask = kernels::AttnMaskType::kCausal;
      break;
    case v1::ATTN_MASK_CAUSAL_BOTTOM_RIGHT:
      op.mask = kernels::AttnMaskType::kCausalBottomRight;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "mask: unknown AttnMaskType value ", static_cast<int>(req.mask())));
  }
  op.packed = req.packed();
  TS_OPTIONAL(op.q_seqlen, req, q_seqlen);
  TS_OPTIONAL(op.q_offset, req, q_offset);
  TS_OPTIONAL(op.kv_seqlen, req, kv_seqlen);
  TS_OPTIONAL(op.kv_offset, req, kv_offset);
  TS_OPTIONAL(op.q_packed_seqlens, req, q_packed_seqlens);
  TS_OPTIONAL(op.q_packed_offsets, req, q_packed_offsets);
  TS_OPTIONAL(op.q_cu_seqlens, req, q_cu_seqlens);
  TS_OPTIONAL(op.kv_packed_seqlens, req, kv_packed_seqlens);
  TS_OPTIONAL(op.kv_packed_offsets, req, kv_packed_offsets);
  TS_OPTIONAL(op.kv_cu_seqlens, req, kv_cu_seqlens);
  return op;
}

absl::StatusOr<core::SampleTokensRequest> OpFromProto(const v1::SampleTokensRequest& req,
                                                      absl::string_view prefix) {
  core::SampleTokensRequest op;
  op.layers = req.layers();
  op.batch = req.batch();
  op.original_tokens = req.original_tokens();
  op.retained_tokens = req.retained_tokens();
  op.seed = req.seed();
  op.step = req.step();
  TS_OPTIONAL(op.ids, req, ids);
  TS_OPTIONAL(op.inverse, req, inverse);
  TS_OPTIONAL(op.mask, req, mask);
  TS_OPTIONAL(op.bert_mask, req, bert_mask);
  TS_OPTIONAL(op.gpt_mask, req, gpt_mask);
  return op;
}

absl::StatusOr<core::TopKTokensRequest> OpFromProto(const v1::TopKTokensRequest& req,
                                                    absl::string_view prefix) {
  core::TopKTokensRequest op;
  TS_REQUIRED(op.scores, req, scores);
  op.retained_tokens = req.retained_tokens();
  TS_OPTIONAL(op.ids, req, ids);
  return op;
}

absl::StatusOr<core::MergeTokensRequest> OpFromProto(const v1::MergeTokensRequest& req,
                                                     absl::string_view prefix) {
  core::MergeTokensRequest op;
  TS_REQUIRED(op.x, req, x);
  TS_REQUIRED(op.layer, req, layer);
  TS_REQUIRED(op.indices, req, indices);
  TS_OPTIONAL(op.out, req, out);
  op.batch_first = !req.has_batch_first() || req.batch_first();
  return op;
}

absl::StatusOr<core::SplitTokensRequest> OpFromProto(const v1::SplitTokensRequest& req,
                                                     absl::string_view prefix) {
  core::SplitTokensRequest op;
  TS_REQUIRED(op.grad, req, grad);
  TS_REQUIRED(op.indices, req, indices);
  TS_OPTIONAL(op.layer_grad, req, layer_grad);
  TS_OPTIONAL(op.rest_grad, req, rest_grad);
  op.batch_first = !req.has_batch_first() || req.batch_first();
  return op;
}

absl::StatusOr<core::SamplePackedTokensRequest> OpFromProto(
    const v1::SamplePackedTokensRequest& req, absl::string_view prefix) {
  core::SamplePackedTokensRequest op;
  TS_REQUIRED(op.cu_seqlens, req, cu_seqlens);
  if (req.has_total_tokens()) op.total_tokens = req.total_tokens();
  if (req.has_kept_tokens()) op.kept_tokens = req.kept_tokens();
  op.keep_num = req.keep_num();
  op.keep_den = req.keep_den();
  op.min_tokens = req.min_tokens();
  op.layers = req.layers();
  op.seed = req.seed();
  op.step = req.step();
  TS_OPTIONAL(op.activations, req, activations);
  TS_OPTIONAL(op.cu_seqlens_kept, req, cu_seqlens_kept);
  TS_OPTIONAL(op.ids, req, ids);
  TS_OPTIONAL(op.positions, req, positions);
  TS_OPTIONAL(op.inverse, req, inverse);
  TS_OPTIONAL(op.out, req, out);
  return op;
}

#undef TS_REQUIRED
#undef TS_OPTIONAL

absl::StatusOr<core::OpRequest> OpFromProto(const v1::Op& op, absl::string_view prefix) {
  switch (op.op_case()) {
    case v1::Op::kSortTokens:
      return OpFromProto(op.sort_tokens(), absl::StrCat(prefix, "sort_tokens."));
    case v1::Op::kGatherTokens:
      return OpFromProto(op.gather_tokens(), absl::StrCat(prefix, "gather_tokens."));
    case v1::Op::kScatterTokens:
      return OpFromProto(op.scatter_tokens(), absl::StrCat(prefix, "scatter_tokens."));
    case v1::Op::kGatherBertMask:
      return OpFromProto(op.gather_bert_mask(), absl::StrCat(prefix, "gather_bert_mask."));
    case v1::Op::kSliceGptMask:
      return OpFromProto(op.slice_gpt_mask(), absl::StrCat(prefix, "slice_gpt_mask."));
    case v1::Op::kSegmentSeqlens:
      return OpFromProto(op.segment_seqlens(), absl::StrCat(prefix, "segment_seqlens."));
    case v1::Op::kSampleTokens:
      return OpFromProto(op.sample_tokens(), absl::StrCat(prefix, "sample_tokens."));
    case v1::Op::kTopKTokens:
      return OpFromProto(op.top_k_tokens(), absl::StrCat(prefix, "top_k_tokens."));
    case v1::Op::kMergeTokens:
      return OpFromProto(op.merge_tokens(), absl::StrCat(prefix, "merge_tokens."));
    case v1::Op::kSplitTokens:
      return OpFromProto(op.split_tokens(), absl::StrCat(prefix, "split_tokens."));
    case v1::Op::kSamplePackedTokens:
      return OpFromProto(op.sample_packed_tokens(), absl::StrCat(prefix, "sample_packed_tokens."));
    case v1::Op::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(prefix, "op: no operator set"));
}

absl::StatusOr<std::vector<core::OpRequest>> OpsFromProto(const v1::ExecuteRequest& req) {
  std::vector<core::OpRequest> ops;
  ops.reserve(req.ops_size());
  for (int i = 0; i < req.ops_size(); ++i) {
    ASSIGN_OR_RETURN(core::OpRequest op, OpFromProto(req.ops(i), absl::StrCat("ops[", i, "].")));
    ops.push_back(std::move(op));
  }
  return ops;
}

absl::StatusOr<core::RegionSpec> RegionFromProto(const v1::RegisterBufferRequest& req) {
  switch (req.source_case()) {
    case v1::RegisterBufferRequest::kHostShm:
      // The server would open the object with its own rights, not the
      // caller's: refused whatever the object's owner and mode.
      return absl::PermissionDeniedError(absl::StrCat(
          "host_shm: registration by name is refused (the server cannot check that the caller "
          "may open \"",
          req.host_shm().shm_name(),
          "\"); pass the object's file descriptor on "
          "the fd channel and register it as `fd` (the tokensel clients do this for you)"));
    case v1::RegisterBufferRequest::kCudaIpc: {
      core::CudaIpcSpec spec;
      spec.handle = req.cuda_ipc().handle();
      spec.device_uuid = req.cuda_ipc().device_uuid();
      spec.offset = req.cuda_ipc().offset();
      spec.size = req.cuda_ipc().size();
      return core::RegionSpec(std::move(spec));
    }
    case v1::RegisterBufferRequest::kFd:
      return absl::InvalidArgumentError("fd: a ticket is redeemed by the handler, not converted");
    case v1::RegisterBufferRequest::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("source: set fd or cuda_ipc");
}

void OpResultToProto(core::OpResult&& result, v1::OpResponse* out) {
  out->mutable_outputs()->Reserve(static_cast<int>(result.outputs.size()));
  for (core::InlineOutput& output : result.outputs) {
    v1::NamedTensor* named = out->add_outputs();
    named->set_name(std::move(output.name));
    v1::Tensor* tensor = named->mutable_tensor();
    tensor->set_dtype(DTypeToProto(output.dtype));
    tensor->mutable_shape()->Add(output.shape.begin(), output.shape.end());
    tensor->set_inline_data(std::move(output.data));
  }
}

void BufferInfoToProto(const core::BufferInfo& info, v1::BufferInfo* out) {
  out->set_name(info.name);
  out->set_kind(info.kind);
  out->set_size(info.size);
  out->set_device_uuid(info.device_uuid);
  out->set_sealed(info.sealed);
}

void ServerInfoToProto(const core::ServerDescription& desc, v1::ServerInfo* out) {
  out->set_version(desc.version);
  out->set_backend(desc.backend);
  for (const core::DeviceDescription& device : desc.devices) {
    v1::Device* d = out->add_devices();
    d->set_ordinal(device.ordinal);
    d->set_uuid(device.uuid);
    d->set_name(device.name);
    d->set_compute_capability(device.compute_capability);
    d->set_total_memory_bytes(device.total_memory_bytes);
  }
  v1::Limits* limits = out->mutable_limits();
  limits->set_max_message_bytes(desc.max_message_bytes);
  limits->set_max_buffers_per_session(desc.max_buffers_per_session);
  limits->set_max_inflight(desc.max_inflight);
  limits->set_session_ttl_ms(desc.session_ttl_ms);
  limits->set_max_rank(desc.max_rank);
  limits->set_max_sessions_per_peer(desc.max_sessions_per_peer);
  limits->set_max_buffers_total(desc.max_buffers_total);
  limits->set_max_op_elements(desc.max_op_elements);
  limits->set_max_request_memory_bytes(desc.max_request_memory_bytes);
  limits->set_memory_budget_bytes(desc.memory_budget_bytes);
  limits->set_max_async_executes_per_session(desc.max_async_executes_per_session);
  limits->set_max_async_executes(desc.max_async_executes);
  limits->set_max_stuck_executes_per_session(desc.max_stuck_executes_per_session);
  limits->set_max_stuck_executes(desc.max_stuck_executes);
  limits->set_max_async_executes_per_peer(desc.max_async_executes_per_peer);
  limits->set_max_stuck_executes_per_peer(desc.max_stuck_executes_per_peer);
  out->set_shm_prefix(desc.shm_prefix);
  for (const std::string& kind : desc.memory_kinds) out->add_memory_kinds(kind);
  out->set_fd_channel(desc.fd_channel);
  out->set_ipc_events(desc.ipc_events);
}

}  // namespace tokensel::server
