#include "server/core/output_shapes.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/validate.h"

namespace tokensel::core {
namespace {

using kernels::DType;
using kernels::TensorView;

constexpr int64_t kMaxSegments = std::numeric_limits<int32_t>::max() - 1;

absl::Status NonNegative(int64_t value, absl::string_view field) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " is negative"));
}

OutputShape Shape(DType dtype, std::vector<int64_t> shape, bool index_choice = false) {
  return OutputShape{dtype, std::move(shape), index_choice};
}

absl::Status CheckMaxSegments(int64_t ns) {
  if (ns >= 1 && ns <= kMaxSegments) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("max_segments: is ", ns, ", expected 1 <= ", "max_segments <= ", kMaxSegments));
}

}  // namespace

absl::StatusOr<OutputShape> SortOutShape(const TensorView& ids) {
  RETURN_IF_ERROR(kernels::CheckView(ids, "ids"));
  return Shape(ids.dtype, std::vector<int64_t>(ids.shape, ids.shape + ids.rank));
}

absl::StatusOr<OutputShape> SortInverseShape(const TensorView& ids, int64_t original_tokens) {
  RETURN_IF_ERROR(kernels::CheckView(ids, "ids"));
  RETURN_IF_ERROR(NonNegative(original_tokens, "original_tokens"));
  std::vector<int64_t> shape(ids.shape, ids.shape + ids.rank);
  shape.back() = original_tokens;
  return Shape(DType::kInt32, std::move(shape));
}

absl::StatusOr<OutputShape> GatherOutShape(const TensorView& activations, const TensorView& indices,
                                           bool batch_first) {
  RETURN_IF_ERROR(kernels::CheckView(activations, "activations", 3));
  RETURN_IF_ERROR(kernels::CheckView(indices, "indices", 2));
  const int64_t batch = activations.shape[batch_first ? 0 : 1];
  const int64_t retained = indices.shape[1];
  const int64_t channels = activations.shape[2];
  if (batch_first) return Shape(activations.dtype, {batch, retained, channels});
  return Shape(activations.dtype, {retained, batch, channels});
}

absl::StatusOr<OutputShape> BertMaskOutShape(const TensorView& mask, const TensorView& indices) {
  RETURN_IF_ERROR(kernels::CheckView(mask, "mask", 4));
  RETURN_IF_ERROR(kernels::CheckView(indices, "indices", 3));
  const int64_t retained = indices.shape[2];
  return Shape(mask.dtype, {indices.shape[0], mask.shape[0], mask.shape[1], retained, retained});
}

absl::StatusOr<OutputShape> GptMaskOutShape(const TensorView& mask, int64_t retained_tokens) {
  RETURN_IF_ERROR(kernels::CheckView(mask, "mask", 4));
  RETURN_IF_ERROR(NonNegative(retained_tokens, "retained_tokens"));
  if (retained_tokens > mask.shape[3]) {
    return absl::InvalidArgumentError(absl::StrCat("retained_tokens: R = ", retained_tokens,
                                                   " exceeds mask S = ", mask.shape[3]));
  }
  return Shape(mask.dtype, {mask.shape[0], mask.shape[1], retained_tokens, retained_tokens});
}

absl::StatusOr<OutputShape> SegmentOutShape(SegmentOutput which, const TensorView& segment_ids_q,
                                            int64_t max_segments) {
  RETURN_IF_ERROR(kernels::CheckView(segment_ids_q, "segment_ids_q", 2));
  RETURN_IF_ERROR(CheckMaxSegments(max_segments));
  const int64_t batch = segment_ids_q.shape[0];
  int64_t b_ns = 0;
  int64_t b_ns1 = 0;
  if (__builtin_mul_overflow(batch, max_segments, &b_ns) ||
      __builtin_mul_overflow(batch, max_segments + 1, &b_ns1)) {
    return absl::InvalidArgumentError(absl::StrCat("max_segments: B * (NS + 1) = ", batch, " * ",
                                                   max_segments + 1, " overflows int64"));
  }
  switch (which) {
    case SegmentOutput::kSeqlen:
      return Shape(DType::kInt32, {batch, max_segments});
    case SegmentOutput::kOffset:
      return Shape(DType::kInt32, {batch, max_segments + 1});
    case SegmentOutput::kPackedSeqlens:
      return Shape(DType::kInt32, {b_ns});
    case SegmentOutput::kPackedOffsets:
      return Shape(DType::kInt32, {b_ns1});
    case SegmentOutput::kCuSeqlens:
      return Shape(DType::kInt32, {b_ns + 1});  // b_ns < b_ns1: no overflow
  }
  return absl::InternalError("SegmentOutShape: unknown output");
}

absl::StatusOr<OutputShape> SampleIdsShape(int64_t layers, int64_t batch, int64_t retained) {
  RETURN_IF_ERROR(NonNegative(layers, "layers"));
  RETURN_IF_ERROR(NonNegative(batch, "batch"));
  RETURN_IF_ERROR(NonNegative(retained, "retained_tokens"));
  return Shape(DType::kInt32, {layers, batch, retained}, /*index_choice=*/true);
}

absl::StatusOr<OutputShape> SampleInverseShape(int64_t layers, int64_t batch, int64_t original) {
  RETURN_IF_ERROR(NonNegative(layers, "layers"));
  RETURN_IF_ERROR(NonNegative(batch, "batch"));
  RETURN_IF_ERROR(NonNegative(original, "original_tokens"));
  return Shape(DType::kInt32, {layers, batch, original});
}

absl::StatusOr<OutputShape> SampleBertMaskShape(int64_t layers, int64_t batch, int64_t retained,
                                                const std::optional<TensorView>& mask) {
  if (!mask.has_value()) {
    return absl::InvalidArgumentError("bert_mask: requires mask [B,H,Sq,S] to gather from");
  }
  RETURN_IF_ERROR(kernels::CheckView(*mask, "mask", 4));
  RETURN_IF_ERROR(NonNegative(layers, "layers"));
  RETURN_IF_ERROR(NonNegative(batch, "batch"));
  RETURN_IF_ERROR(NonNegative(retained, "retained_tokens"));
  return Shape(mask->dtype, {layers, batch, mask->shape[1], retained, retained});
}

absl::StatusOr<OutputShape> SampleGptMaskShape(int64_t batch, int64_t retained,
                                               const std::optional<TensorView>& mask) {
  if (!mask.has_value()) {
    return absl::InvalidArgumentError("gpt_mask: requires mask [B,H,S,S] to slice");
  }
  RETURN_IF_ERROR(kernels::CheckView(*mask, "mask", 4));
  RETURN_IF_ERROR(NonNegative(batch, "batch"));
  RETURN_IF_ERROR(NonNegative(retained, "retained_tokens"));
  return Shape(mask->dtype, {batch, mask->shape[1], retained, retained});
}

absl::StatusOr<OutputShape> TopKIdsShape(const TensorView& scores, int64_t retained_tokens) {
  RETURN_IF_ERROR(kernels::CheckView(scores, "scores"));
  RETURN_IF_ERROR(NonNegative(retained_tokens, "retained_tokens"));
  std::vector<int64_t> shape(scores.shape, scores.shape + scores.rank);
  shape.back() = retained_tokens;
  return Shape(DType::kInt32, std::move(shape), /*index_choice=*/true);
}

uint64_t ViewBytes(const TensorView& v) {
  // Saturates: a broadcast (stride 0) input may have more elements than bytes.
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[d] == 0) return 0;
  }
  uint64_t n = static_cast<uint64_t>(v.elem_size());
  for (int d = 0; d < v.rank; ++d) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(v.shape[d]), &n)) {
      return std::numeric_limits<uint64_t>::max();
    }
  }
  return n;
}

}  // namespace tokensel::core
