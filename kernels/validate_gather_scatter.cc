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

// `v` is shaped like `tokens` ([B,S,C] / [S,B,C]), dim by dim.
absl::Status CheckLikeTokens(const TensorView& v, absl::string_view field, const TensorView& tokens,
                             absl::string_view tokens_field, bool batch_first) {
  const char* names[3] = {batch_first ? "B" : "S", batch_first ? "S" : "B", "C"};
  for (int axis = 0; axis < 3; ++axis) {
    RETURN_IF_ERROR(CheckDim(v, field, axis, names[axis], tokens.shape[axis],
                             absl::StrCat(tokens_field, " ", names[axis])));
  }
  return absl::OkStatus();
}

}  // namespace

bool SameView(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
    // The stride of a dim of size 1 never moves an address.
    if (a.shape[i] != 1 && a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

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

absl::Status ValidateMergeTokens(const MergeTokensArgs& args) {
  RETURN_IF_ERROR(CheckView(args.x, "x", 3));
  RETURN_IF_ERROR(CheckView(args.layer, "layer", 3));
  RETURN_IF_ERROR(CheckView(args.indices, kIndicesField, 2));
  RETURN_IF_ERROR(CheckView(args.out, "out", 3));
  RETURN_IF_ERROR(CheckIndexDType(args.indices, kIndicesField));
  RETURN_IF_ERROR(CheckSameDType(args.layer, "layer", args.x, "x"));
  RETURN_IF_ERROR(CheckSameDType(args.out, "out", args.x, "x"));
  RETURN_IF_ERROR(
      CheckTokenShapes(args.x, "x", args.indices, args.layer, "layer", args.batch_first));
  RETURN_IF_ERROR(CheckLikeTokens(args.out, "out", args.x, "x", args.batch_first));
  RETURN_IF_ERROR(CheckNonOverlapping(args.out, "out"));
  if (!SameView(args.out, args.x)) RETURN_IF_ERROR(CheckDisjoint(args.out, "out", args.x, "x"));
  RETURN_IF_ERROR(CheckDisjoint(args.out, "out", args.layer, "layer"));
  RETURN_IF_ERROR(CheckDisjoint(args.out, "out", args.indices, kIndicesField));
  return absl::OkStatus();
}

absl::Status ValidateSplitTokens(const SplitTokensArgs& args) {
  RETURN_IF_ERROR(CheckView(args.grad, "grad", 3));
  RETURN_IF_ERROR(CheckView(args.indices, kIndicesField, 2));
  RETURN_IF_ERROR(CheckView(args.layer_grad, "layer_grad", 3));
  RETURN_IF_ERROR(CheckView(args.rest_grad, "rest_grad", 3));
  RETURN_IF_ERROR(CheckIndexDType(args.indices, kIndicesField));
  RETURN_IF_ERROR(CheckSameDType(args.layer_grad, "layer_grad", args.grad, "grad"));
  RETURN_IF_ERROR(CheckSameDType(args.rest_grad, "rest_grad", args.grad, "grad"));
  RETURN_IF_ERROR(CheckTokenShapes(args.grad, "grad", args.indices, args.layer_grad, "layer_grad",
                                   args.batch_first));
  RETURN_IF_ERROR(
      CheckLikeTokens(args.rest_grad, "rest_grad", args.grad, "grad", args.batch_first));
  RETURN_IF_ERROR(CheckNonOverlapping(args.layer_grad, "layer_grad"));
  RETURN_IF_ERROR(CheckNonOverlapping(args.rest_grad, "rest_grad"));
  RETURN_IF_ERROR(CheckDisjoint(args.layer_grad, "layer_grad", args.grad, "grad"));
  RETURN_IF_ERROR(CheckDisjoint(args.layer_grad, "layer_grad", args.indices, kIndicesField));
  RETURN_IF_ERROR(CheckDisjoint(args.layer_grad, "layer_grad", args.rest_grad, "rest_grad"));
  if (!SameView(args.rest_grad, args.grad)) {
    RETURN_IF_ERROR(CheckDisjoint(args.rest_grad, "rest_grad", args.grad, "grad"));
  }
  RETURN_IF_ERROR(CheckDisjoint(args.rest_grad, "rest_grad", args.indices, kIndicesField));
  return absl::OkStatus();
}

}  // namespace tokensel::kernels
