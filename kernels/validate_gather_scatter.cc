// Metadata validation of GatherTokens and ScatterTokens, and their data-error
// messages. Never reads tensor data.
#include "kernels/validate_gather_scatter.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/ops.h"
#include "kernels/validate.h"

namespace tokensel::kernels {
namespace {

// Checks the shared shape of a token gather/scatter: `tokens` is [B,S,C] /
// [S,B,C], `indices` [B,R], `retained` [B,R,C] / [R,B,C], all already
// CheckView'ed with the right ranks.
absl::Status CheckTokenShapes(const TensorView& tokens, absl::string_view tokens_field,
                              const TensorView& indices, const TensorView& retained,
                              absl::string_view retained_field, bool batch_first) {
  const int b_axis = batch_first ? 0 : 1;
  const int s_axis = batch_first ? 1 : 0;
  const int64_t batch = tokens.shape[b_axis];
  const int64_t retained_count = indices.shape[1];
  const std::string b_source = absl::StrCat(tokens_field, " B");
  RETURN_IF_ERROR(CheckDim(indices, kIndicesField, 0, "B", batch, b_source));
  RETURN_IF_ERROR(CheckDim(retained, retained_field, b_axis, "B", batch, b_source));
  RETURN_IF_ERROR(CheckDim(retained, retained_field, s_axis, "R", retained_count, "indices R"));
  RETURN_IF_ERROR(CheckDim(retained, retained_field, 2, "C", tokens.shape[2],
                           absl::StrCat(tokens_field, " C")));
  return absl::OkStatus();
}

}  // namespace

absl::Status TokenIndexOutOfRange(const TensorView& indices, int64_t linear, int64_t value,
                                  int64_t limit) {
  return IndexOutOfRange(indices, kIndicesField, linear, value, limit);
}

absl::Status TokenIndexDuplicate(const TensorView& indices, int64_t linear, int64_t value,
                                 int64_t first_linear) {
  return DuplicateIndex(indices, kIndicesField, linear, value, first_linear);
}

absl::Status ValidateGatherTokens(const GatherTokensArgs& args) {
  RETURN_IF_ERROR(CheckView(args.activations, "activations", 3));
  RETURN_IF_ERROR(CheckView(args.indices, kIndicesField, 2));
  RETURN_IF_ERROR(CheckView(args.out, "out", 3));
  RETURN_IF_ERROR(CheckIndexDType(args.indices, kIndicesField));
  RETURN_IF_ERROR(CheckSameDType(args.out, "out", args.activations, "activations"));
  RETURN_IF_ERROR(CheckTokenShapes(args.activations, "activations", args.indices, args.out, "out",
                                   args.batch_first));
  RETURN_IF_ERROR(CheckNonOverlapping(args.out, "out"));
  RETURN_IF_ERROR(CheckDisjoint(args.out, "out", args.activations, "activations"));
  RETURN_IF_ERROR(CheckDisjoint(args.out, "out", args.indices, kIndicesField));
  return absl::OkStatus();
}

absl::Status ValidateScatterTokens(const ScatterTokensArgs& args) {
  RETURN_IF_ERROR(CheckView(args.all, "all", 3));
  RETURN_IF_ERROR(CheckView(args.layer, "layer", 3));
  RETURN_IF_ERROR(CheckView(args.indices, kIndicesField, 2));
  RETURN_IF_ERROR(CheckIndexDType(args.indices, kIndicesField));
  RETURN_IF_ERROR(CheckSameDType(args.layer, "layer", args.all, "all"));
  RETURN_IF_ERROR(
      CheckTokenShapes(args.all, "all", args.indices, args.layer, "layer", args.batch_first));
  RETURN_IF_ERROR(CheckNonOverlapping(args.all, "all"));
  RETURN_IF_ERROR(CheckDisjoint(args.all, "all", args.layer, "layer"));
  RETURN_IF_ERROR(CheckDisjoint(args.all, "all", args.indices, kIndicesField));
  return absl::OkStatus();
}

}  // namespace tokensel::kernels
