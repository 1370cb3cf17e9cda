// Metadata validation and data-error messages of SegmentSeqlens (op 6).
#include "kernels/validate_segments.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/ops.h"
#include "kernels/validate.h"

namespace tokensel::kernels {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

struct NamedView {
  const TensorView* view;
  std::string field;
};

absl::Status CheckInt32Output(const TensorView& v, absl::string_view field, int rank) {
  RETURN_IF_ERROR(CheckView(v, field, rank));
  return CheckDType(v, field, {DType::kInt32});
}

// Input ids (and optional positions) of one side: [B, T] index tensors.
absl::Status CheckSideInputs(const TensorView& ids, absl::string_view ids_field,
                             const std::optional<TensorView>& pos, absl::string_view pos_field,
                             int64_t batch, absl::string_view batch_source) {
  RETURN_IF_ERROR(CheckView(ids, ids_field, 2));
  RETURN_IF_ERROR(CheckIndexDType(ids, ids_field));
  if (batch >= 0) RETURN_IF_ERROR(CheckDim(ids, ids_field, 0, "B", batch, batch_source));
  if (ids.shape[1] > kInt32Max) {
    return absl::InvalidArgumentError(absl::StrCat(ids_field, ": dim 1 (T) is ", ids.shape[1],
                                                   ", exceeds 2147483647 (offsets are int32)"));
  }
  if (pos.has_value()) {
    RETURN_IF_ERROR(CheckView(*pos, pos_field, 2));
    RETURN_IF_ERROR(CheckIndexDType(*pos, pos_field));
    const std::string source = absl::StrCat(ids_field, " shape");
    RETURN_IF_ERROR(CheckDim(*pos, pos_field, 0, "B", ids.shape[0], source));
    RETURN_IF_ERROR(CheckDim(*pos, pos_field, 1, "T", ids.shape[1], source));
  }
  return absl::OkStatus();
}

// Output views of one side; appends them to `outputs` for the overlap checks.
absl::Status CheckSideOutputs(const SegmentSeqlensSide& side, absl::string_view prefix,
                              int64_t batch, int64_t ns, int64_t row_length,
                              std::vector<NamedView>* outputs) {
  const std::string seqlen = absl::StrCat(prefix, ".seqlen");
  const std::string offset = absl::StrCat(prefix, ".offset");
  RETURN_IF_ERROR(CheckInt32Output(side.seqlen, seqlen, 2));
  RETURN_IF_ERROR(CheckDim(side.seqlen, seqlen, 0, "B", batch, "segment_ids_q B"));
  RETURN_IF_ERROR(CheckDim(side.seqlen, seqlen, 1, "NS", ns, "max_segments"));
  RETURN_IF_ERROR(CheckInt32Output(side.offset, offset, 2));
  RETURN_IF_ERROR(CheckDim(side.offset, offset, 0, "B", batch, "segment_ids_q B"));
  RETURN_IF_ERROR(CheckDim(side.offset, offset, 1, "NS+1", ns + 1, "max_segments + 1"));
  outputs->push_back({&side.seqlen, seqlen});
  outputs->push_back({&side.offset, offset});
  if (!side.packed.has_value()) return absl::OkStatus();

  const PackedSeqlens& packed = *side.packed;
  const std::string seqlens = absl::StrCat(prefix, ".packed.seqlens");
  const std::string offsets = absl::StrCat(prefix, ".packed.offsets");
  const std::string cu = absl::StrCat(prefix, ".packed.cu_seqlens");
  // batch <= 2^31-1 cannot be assumed; B * (NS+1) must not overflow.
  int64_t b_ns = 0;
  int64_t b_ns1 = 0;
  int64_t b_t = 0;
  if (__builtin_mul_overflow(batch, ns, &b_ns) || __builtin_mul_overflow(batch, ns + 1, &b_ns1) ||
      __builtin_mul_overflow(batch, row_length, &b_t) || b_t > kInt32Max) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ".packed: B*T = ", batch, "*", row_length,
                     " must fit int32 for the packed layout (and B*(NS+1) must fit int64)"));
  }
  RETURN_IF_ERROR(CheckInt32Output(packed.seqlens, seqlens, 1));
  RETURN_IF_ERROR(CheckDim(packed.seqlens, seqlens, 0, "B*NS", b_ns, "B * max_segments"));
  RETURN_IF_ERROR(CheckInt32Output(packed.offsets, offsets, 1));
  RETURN_IF_ERROR(
      CheckDim(packed.offsets, offsets, 0, "B*(NS+1)", b_ns1, "B * (max_segments + 1)"));
  RETURN_IF_ERROR(CheckInt32Output(packed.cu_seqlens, cu, 1));
  RETURN_IF_ERROR(CheckDim(packed.cu_seqlens, cu, 0, "B*NS+1", b_ns + 1, "B * max_segments + 1"));
  outputs->push_back({&packed.seqlens, seqlens});
  outputs->push_back({&packed.offsets, offsets});
  outputs->push_back({&packed.cu_seqlens, cu});
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateMaxSegments(int64_t max_segments) {
  if (max_segments >= 1 && max_segments <= kInt32Max - 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "max_segments: is ", max_segments, ", expected 1 <= max_segments <= ", kInt32Max - 1));
}

absl::Status ValidateSegmentSeqlens(const SegmentSeqlensArgs& args) {
  const int64_t ns = args.max_segments;
  RETURN_IF_ERROR(ValidateMaxSegments(ns));
  if (args.mask != AttnMaskType::kPadding && args.mask != AttnMaskType::kCausal &&
      args.mask != AttnMaskType::kCausalBottomRight) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask: invalid value ", static_cast<int>(args.mask)));
  }
  RETURN_IF_ERROR(CheckSideInputs(args.segment_ids_q, "segment_ids_q", args.segment_pos_q,
                                  "segment_pos_q", -1, ""));
  const int64_t batch = args.segment_ids_q.shape[0];
  const bool cross = args.segment_ids_kv.has_value();
  if (cross) {
    RETURN_IF_ERROR(CheckSideInputs(*args.segment_ids_kv, "segment_ids_kv", args.segment_pos_kv,
                                    "segment_pos_kv", batch, "segment_ids_q B"));
  } else if (args.segment_pos_kv.has_value()) {
    return absl::InvalidArgumentError(
        "segment_pos_kv: given without segment_ids_kv (self-attention takes no kv inputs)");
  }
  if (SegmentMaskNeedsPositions(cross, args.mask)) {
    if (!args.segment_pos_q.has_value()) {
      return absl::InvalidArgumentError(
          "segment_pos_q: required for cross-attention with a causal mask");
    }
    if (!args.segment_pos_kv.has_value()) {
      return absl::InvalidArgumentError(
          "segment_pos_kv: required for cross-attention with a causal mask");
    }
  }
  if (cross && !args.kv.has_value()) {
    return absl::InvalidArgumentError(
        "kv: outputs are required for cross-attention (segment_ids_kv is given)");
  }
  if (!cross && args.kv.has_value()) {
    return absl::InvalidArgumentError(
        "kv: outputs given without segment_ids_kv (self-attention has only q outputs)");
  }

  std::vector<NamedView> outputs;
  RETURN_IF_ERROR(CheckSideOutputs(args.q, "q", batch, ns, args.segment_ids_q.shape[1], &outputs));
  if (cross) {
    RETURN_IF_ERROR(
        CheckSideOutputs(*args.kv, "kv", batch, ns, args.segment_ids_kv->shape[1], &outputs));
  }

  std::vector<NamedView> inputs;
  inputs.push_back({&args.segment_ids_q, "segment_ids_q"});
  if (args.segment_pos_q.has_value()) inputs.push_back({&*args.segment_pos_q, "segment_pos_q"});
  if (cross) inputs.push_back({&*args.segment_ids_kv, "segment_ids_kv"});
  if (args.segment_pos_kv.has_value()) {
    inputs.push_back({&*args.segment_pos_kv, "segment_pos_kv"});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    RETURN_IF_ERROR(CheckNonOverlapping(*outputs[i].view, outputs[i].field));
    for (const NamedView& in : inputs) {
      RETURN_IF_ERROR(CheckDisjoint(*outputs[i].view, outputs[i].field, *in.view, in.field));
    }
    for (size_t j = 0; j < i; ++j) {
      RETURN_IF_ERROR(
          CheckDisjoint(*outputs[i].view, outputs[i].field, *outputs[j].view, outputs[j].field));
    }
  }
  return absl::OkStatus();
}

absl::string_view SegmentErrorField(const SegmentError& error) {
  if (error.position) return error.kv_side ? "segment_pos_kv" : "segment_pos_q";
  return error.kv_side ? "segment_ids_kv" : "segment_ids_q";
}

absl::Status SegmentDataError(const TensorView& view, absl::string_view field, int64_t row,
                              const SegmentError& error, int64_t max_segments) {
  const std::string where =
      absl::StrCat(field, FormatIndex(view, row * view.shape[1] + error.token), " = ", error.value);
  switch (error.kind) {
    case SegmentErrorKind::kNone:
      break;
    case SegmentErrorKind::kIdOutOfRange:
      return absl::InvalidArgumentError(absl::StrCat(where, " is out of range [0, ", max_segments,
                                                     "] (0 = padding, ids are 1..max_segments)"));
    case SegmentErrorKind::kPaddingInside:
      return absl::InvalidArgumentError(absl::StrCat(where, ": padding inside segment ",
                                                     error.value,
                                                     " (each segment must be one contiguous run)"));
    case SegmentErrorKind::kNotIncreasing:
      return absl::InvalidArgumentError(
          absl::StrCat(where, " after segment ", error.prev_id,
                       ": segment ids must strictly increase along a row (id ", error.value,
                       " appears again or ids decrease)"));
    case SegmentErrorKind::kNegativePosition:
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is negative (positions of non-padding tokens must be >= 0)"));
  }
  return absl::InternalError("SegmentDataError: no error");
}

}  // namespace tokensel::kernels
