#include "server/core/ops/gather_bert_mask.h"

#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<GatherBertMaskOp>);

uint64_t GatherBertMaskOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.Add(req.indices);
  sum.AddScalar(ops_support::SaturatingMul(
      ops_support::SaturatingMul(ops_support::Elements(req.indices), ops_support::Dim(req.mask, 1)),
      ops_support::Dim(req.indices, 2)));
  return sum.total();
}

absl::StatusOr<kernels::GatherBertMaskArgs> GatherBertMaskOp::Resolve(Resolver& r,
                                                                      const Request& req) {
  Args args;
  ASSIGN_OR_RETURN(args.mask, r.Input(req.mask, "mask"));
  ASSIGN_OR_RETURN(args.indices, r.Input(req.indices, "indices"));
  ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out",
                                      [&] { return BertMaskOutShape(args.mask, args.indices); }));
  return args;
}

uint64_t GatherBertMaskOp::BytesMoved(const Args& args) {
  return ViewBytes(args.indices) + 2 * ViewBytes(args.out);
}

absl::StatusOr<OutputShape> BertMaskOutShape(const kernels::TensorView& mask,
                                             const kernels::TensorView& indices) {
  RETURN_IF_ERROR(kernels::CheckView(mask, "mask", 4));
  RETURN_IF_ERROR(kernels::CheckView(indices, "indices", 3));
  const int64_t retained = indices.shape[2];
  return OutputShape{mask.dtype,
                     {indices.shape[0], mask.shape[0], mask.shape[1], retained, retained}};
}

}  // namespace tokensel::core
