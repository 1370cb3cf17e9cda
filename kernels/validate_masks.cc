// Metadata validation of GatherBertMask and SliceGptMask. Never reads data.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/ops.h"
#include "kernels/validate.h"
#include "kernels/validate_gather_scatter.h"

namespace tokensel::kernels {

absl::Status ValidateGatherBertMask(const GatherBertMaskArgs& args) {
  const TensorView& mask = args.mask;
  const TensorView& indices = args.indices;
  const TensorView& out = args.out;
  RETURN_IF_ERROR(CheckView(mask, "mask", 4));
  RETURN_IF_ERROR(CheckView(indices, kIndicesField, 3));
  RETURN_IF_ERROR(CheckView(out, "out", 5));
  RETURN_IF_ERROR(CheckIndexDType(indices, kIndicesField));
  RETURN_IF_ERROR(CheckSameDType(out, "out", mask, "mask"));
  const int64_t batch = mask.shape[0];
  const int64_t heads = mask.shape[1];
  const int64_t seq = mask.shape[3];
  if (heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask: dim 1 (H) is ", heads, ", expected >= 1"));
  }
  if (mask.shape[2] != 1 && mask.shape[2] != seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask: dim 2 (Sq) is ", mask.shape[2], ", expected 1 or ", seq, " (mask S)"));
  }
  RETURN_IF_ERROR(CheckDim(indices, kIndicesField, 1, "B", batch, "mask B"));
  const int64_t layers = indices.shape[0];
  const int64_t retained = indices.shape[2];
  RETURN_IF_ERROR(CheckDim(out, "out", 0, "L", layers, "indices L"));
  RETURN_IF_ERROR(CheckDim(out, "out", 1, "B", batch, "mask B"));
  RETURN_IF_ERROR(CheckDim(out, "out", 2, "H", heads, "mask H"));
  RETURN_IF_ERROR(CheckDim(out, "out", 3, "R", retained, "indices R"));
  RETURN_IF_ERROR(CheckDim(out, "out", 4, "R", retained, "indices R"));
  RETURN_IF_ERROR(CheckNonOverlapping(out, "out"));
  RETURN_IF_ERROR(CheckDisjoint(out, "out", mask, "mask"));
  RETURN_IF_ERROR(CheckDisjoint(out, "out", indices, kIndicesField));
  return absl::OkStatus();
}

absl::Status ValidateSliceGptMask(const SliceGptMaskArgs& args) {
  const TensorView& mask = args.mask;
  const TensorView& out = args.out;
  RETURN_IF_ERROR(CheckView(mask, "mask", 4));
  RETURN_IF_ERROR(CheckView(out, "out", 4));
  RETURN_IF_ERROR(CheckSameDType(out, "out", mask, "mask"));
  const int64_t seq = mask.shape[3];
  RETURN_IF_ERROR(CheckDim(mask, "mask", 2, "S", seq, "mask dim 3"));
  RETURN_IF_ERROR(CheckDim(out, "out", 0, "B", mask.shape[0], "mask B"));
  RETURN_IF_ERROR(CheckDim(out, "out", 1, "H", mask.shape[1], "mask H"));
  const int64_t retained = out.shape[3];
  RETURN_IF_ERROR(CheckDim(out, "out", 2, "R", retained, "out dim 3"));
  if (retained > seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: R = ", retained, " exceeds mask S = ", seq, " (expected R <= S)"));
  }
  RETURN_IF_ERROR(CheckNonOverlapping(out, "out"));
  RETURN_IF_ERROR(CheckDisjoint(out, "out", mask, "mask"));
  return absl::OkStatus();
}

}  // namespace tokensel::kernels
