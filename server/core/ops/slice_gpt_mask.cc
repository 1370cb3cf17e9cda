#include "server/core/ops/slice_gpt_mask.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<SliceGptMaskOp>);

uint64_t SliceGptMaskOp::EstimateWork(const Request& req) {
  const uint64_t retained = req.out.has_value() && req.out->shape.size() == 4
                                ? ops_support::NonNegative(req.out->shape[3])
                                : ops_support::NonNegative(req.retained_tokens);
  return ops_support::SaturatingMul(
      ops_support::SaturatingMul(ops_support::Dim(req.mask, 0), ops_support::Dim(req.mask, 1)),
      ops_support::SaturatingMul(retained, retained));
}

absl::StatusOr<kernels::SliceGptMaskArgs> SliceGptMaskOp::Resolve(Resolver& r, const Request& req) {
  Args args;
  ASSIGN_OR_RETURN(args.mask, r.Input(req.mask, "mask"));
  ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out", [&] {
    return GptMaskOutShape(args.mask, req.retained_tokens);
  }));
  if (req.retained_tokens != 0 && args.out.rank == 4 && args.out.shape[3] != req.retained_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("retained_tokens: ", req.retained_tokens,
                     " differs from out dim 3 (R) = ", args.out.shape[3]));
  }
  return args;
}

uint64_t SliceGptMaskOp::BytesMoved(const Args& args) { return 2 * ViewBytes(args.out); }

absl::StatusOr<OutputShape> GptMaskOutShape(const kernels::TensorView& mask,
                                            int64_t retained_tokens) {
  RETURN_IF_ERROR(kernels::CheckView(mask, "mask", 4));
  RETURN_IF_ERROR(ops_support::CheckNonNegative(retained_tokens, "retained_tokens"));
  if (retained_tokens > mask.shape[3]) {
    return absl::InvalidArgumentError(absl::StrCat("retained_tokens: R = ", retained_tokens,
                                                   " exceeds mask S = ", mask.shape[3]));
  }
  return OutputShape{mask.dtype, {mask.shape[0], mask.shape[1], retained_tokens, retained_tokens}};
}

}  // namespace tokensel::core
