#include "server/core/ops/segment_seqlens.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<SegmentSeqlensOp>);

namespace {

using kernels::TensorView;
using ops_support::NotApplicable;

struct SideSpecs {
  const std::optional<TensorSpec>& seqlen;
  const std::optional<TensorSpec>& offset;
  const std::optional<TensorSpec>& packed_seqlens;
  const std::optional<TensorSpec>& packed_offsets;
  const std::optional<TensorSpec>& cu_seqlens;
};

absl::StatusOr<kernels::SegmentSeqlensSide> ResolveSide(Resolver& r,
                                                        const SegmentSeqlensRequest& req,
                                                        const TensorView& ids_q,
                                                        const SideSpecs& specs,
                                                        absl::string_view prefix) {
  auto output = [&](const std::optional<TensorSpec>& spec, absl::string_view suffix,
                    SegmentOutput which) {
    return r.Output(spec, absl::StrCat(prefix, suffix),
                    [&] { return SegmentOutShape(which, ids_q, req.max_segments); });
  };
  kernels::SegmentSeqlensSide side;
  ASSIGN_OR_RETURN(side.seqlen, output(specs.seqlen, "_seqlen", SegmentOutput::kSeqlen));
  ASSIGN_OR_RETURN(side.offset, output(specs.offset, "_offset", SegmentOutput::kOffset));
  if (req.packed) {
    kernels::PackedSeqlens packed;
    ASSIGN_OR_RETURN(packed.seqlens, output(specs.packed_seqlens, "_packed_seqlens",
                                            SegmentOutput::kPackedSeqlens));
    ASSIGN_OR_RETURN(packed.offsets, output(specs.packed_offsets, "_packed_offsets",
                                            SegmentOutput::kPackedOffsets));
    ASSIGN_OR_RETURN(packed.cu_seqlens,
                     output(specs.cu_seqlens, "_cu_seqlens", SegmentOutput::kCuSeqlens));
    side.packed = packed;
  } else {
    constexpr absl::string_view kWhy = "packed is false";
    RETURN_IF_ERROR(
        NotApplicable(specs.packed_seqlens, absl::StrCat(prefix, "_packed_seqlens"), kWhy));
    RETURN_IF_ERROR(
        NotApplicable(specs.packed_offsets, absl::StrCat(prefix, "_packed_offsets"), kWhy));
    RETURN_IF_ERROR(NotApplicable(specs.cu_seqlens, absl::StrCat(prefix, "_cu_seqlens"), kWhy));
  }
  return side;
}

uint64_t SideBytes(const kernels::SegmentSeqlensSide& side) {
  uint64_t bytes = ViewBytes(side.seqlen) + ViewBytes(side.offset);
  if (side.packed) {
    bytes += ViewBytes(side.packed->seqlens) + ViewBytes(side.packed->offsets) +
             ViewBytes(side.packed->cu_seqlens);
  }
  return bytes;
}

}  // namespace

uint64_t SegmentSeqlensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.AddAll(req.segment_ids_q, req.segment_pos_q, req.segment_ids_kv, req.segment_pos_kv,
             req.q_seqlen, req.q_offset, req.kv_seqlen, req.kv_offset, req.q_packed_seqlens,
             req.q_packed_offsets, req.q_cu_seqlens, req.kv_packed_seqlens, req.kv_packed_offsets,
             req.kv_cu_seqlens);
  // Outputs and staging are O(NS) per row and side, whether or not the
  // request spells out the outputs' shapes.
  const uint64_t batch = ops_support::Dim(req.segment_ids_q, 0);
  const uint64_t sides = req.segment_ids_kv.has_value() ? 2 : 1;
  sum.AddScalar(ops_support::SaturatingMul(
      ops_support::SaturatingMul(batch, sides),
      ops_support::SaturatingAdd(ops_support::NonNegative(req.max_segments), 1)));
  return sum.total();
}

absl::StatusOr<kernels::SegmentSeqlensArgs> SegmentSeqlensOp::Resolve(Resolver& r,
                                                                      const Request& req) {
  Args args;
  args.max_segments = req.max_segments;
  args.mask = req.mask;
  ASSIGN_OR_RETURN(args.segment_ids_q, r.Input(req.segment_ids_q, "segment_ids_q"));
  ASSIGN_OR_RETURN(args.segment_pos_q, r.OptionalInput(req.segment_pos_q, "segment_pos_q"));
  ASSIGN_OR_RETURN(args.segment_ids_kv, r.OptionalInput(req.segment_ids_kv, "segment_ids_kv"));
  ASSIGN_OR_RETURN(args.segment_pos_kv, r.OptionalInput(req.segment_pos_kv, "segment_pos_kv"));
  ASSIGN_OR_RETURN(args.q, ResolveSide(r, req, args.segment_ids_q,
                                       {req.q_seqlen, req.q_offset, req.q_packed_seqlens,
                                        req.q_packed_offsets, req.q_cu_seqlens},
                                       "q"));
  if (args.segment_ids_kv.has_value()) {
    ASSIGN_OR_RETURN(args.kv, ResolveSide(r, req, args.segment_ids_q,
                                          {req.kv_seqlen, req.kv_offset, req.kv_packed_seqlens,
                                           req.kv_packed_offsets, req.kv_cu_seqlens},
                                          "kv"));
  } else {
    constexpr absl::string_view kWhy = "segment_ids_kv is absent (self-attention)";
    const std::pair<const std::optional<TensorSpec>*, absl::string_view> kv_outputs[] = {
        {&req.kv_seqlen, "kv_seqlen"},
        {&req.kv_offset, "kv_offset"},
        {&req.kv_packed_seqlens, "kv_packed_seqlens"},
        {&req.kv_packed_offsets, "kv_packed_offsets"},
        {&req.kv_cu_seqlens, "kv_cu_seqlens"}};
    for (const auto& [spec, name] : kv_outputs) RETURN_IF_ERROR(NotApplicable(*spec, name, kWhy));
  }
  return args;
}

uint64_t SegmentSeqlensOp::BytesMoved(const Args& args) {
  return ViewBytes(args.segment_ids_q) + ops_support::OptBytes(args.segment_pos_q) +
         ops_support::OptBytes(args.segment_ids_kv) + ops_support::OptBytes(args.segment_pos_kv) +
         SideBytes(args.q) + (args.kv ? SideBytes(*args.kv) : 0);
}

absl::StatusOr<OutputShape> SegmentOutShape(SegmentOutput which, const TensorView& segment_ids_q,
                                            int64_t max_segments) {
  RETURN_IF_ERROR(kernels::CheckView(segment_ids_q, "segment_ids_q", 2));
  RETURN_IF_ERROR(kernels::ValidateMaxSegments(max_segments));
  const int64_t batch = segment_ids_q.shape[0];
  int64_t b_ns = 0;
  int64_t b_ns1 = 0;
  if (__builtin_mul_overflow(batch, max_segments, &b_ns) ||
      __builtin_mul_overflow(batch, max_segments + 1, &b_ns1)) {
    return absl::InvalidArgumentError(absl::StrCat("max_segments: B * (NS + 1) = ", batch, " * ",
                                                   max_segments + 1, " overflows int64"));
  }
  using kernels::DType;
  switch (which) {
    case SegmentOutput::kSeqlen:
      return OutputShape{DType::kInt32, {batch, max_segments}};
    case SegmentOutput::kOffset:
      return OutputShape{DType::kInt32, {batch, max_segments + 1}};
    case SegmentOutput::kPackedSeqlens:
      return OutputShape{DType::kInt32, {b_ns}};
    case SegmentOutput::kPackedOffsets:
      return OutputShape{DType::kInt32, {b_ns1}};
    case SegmentOutput::kCuSeqlens:
      return OutputShape{DType::kInt32, {b_ns + 1}};  // b_ns < b_ns1: no overflow
  }
  return absl::InternalError("SegmentOutShape: unknown output");
}

}  // namespace tokensel::core
