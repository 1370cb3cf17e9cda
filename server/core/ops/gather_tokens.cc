#include "server/core/ops/gather_tokens.h"

#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<GatherTokensOp>);

uint64_t GatherTokensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.Add(req.indices);
  sum.AddScalar(ops_support::SaturatingMul(ops_support::Elements(req.indices),
                                           ops_support::Dim(req.activations, 2)));
  return sum.total();
}

absl::StatusOr<kernels::GatherTokensArgs> GatherTokensOp::Resolve(Resolver& r, const Request& req) {
  Args args;
  args.batch_first = req.batch_first;
  ASSIGN_OR_RETURN(args.activations, r.Input(req.activations, "activations"));
  ASSIGN_OR_RETURN(args.indices, r.Input(req.indices, "indices"));
  ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out", [&] {
    return GatherOutShape(args.activations, args.indices, req.batch_first);
  }));
  return args;
}

uint64_t GatherTokensOp::BytesMoved(const Args& args) {
  return ViewBytes(args.indices) + 2 * ViewBytes(args.out);
}

absl::StatusOr<OutputShape> GatherOutShape(const kernels::TensorView& activations,
                                           const kernels::TensorView& indices, bool batch_first) {
  RETURN_IF_ERROR(kernels::CheckView(activations, "activations", 3));
  RETURN_IF_ERROR(kernels::CheckView(indices, "indices", 2));
  const int64_t batch = activations.shape[batch_first ? 0 : 1];
  const int64_t retained = indices.shape[1];
  const int64_t channels = activations.shape[2];
  if (batch_first) return OutputShape{activations.dtype, {batch, retained, channels}};
  return OutputShape{activations.dtype, {retained, batch, channels}};
}

}  // namespace tokensel::core
