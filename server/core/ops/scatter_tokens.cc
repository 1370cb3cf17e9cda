#include "server/core/ops/scatter_tokens.h"

#include "common/status_macros.h"
#include "server/core/ops/op_support.h"
#include "server/core/output_shapes.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<ScatterTokensOp>);

uint64_t ScatterTokensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.AddAll(req.layer, req.indices);
  const size_t seq_axis = req.batch_first ? 1 : 0;
  if (req.all.shape.size() > seq_axis) {
    const int64_t r = req.indices.shape.empty() ? 0 : req.indices.shape.back();
    sum.AddScalar(
        ops_support::RowCheckWork(ops_support::Rows(req.indices), r, req.all.shape[seq_axis]));
  }
  return sum.total();
}

absl::StatusOr<kernels::ScatterTokensArgs> ScatterTokensOp::Resolve(Resolver& r,
                                                                    const Request& req) {
  Args args;
  args.batch_first = req.batch_first;
  ASSIGN_OR_RETURN(args.all, r.InOut(req.all, "all", "all"));
  ASSIGN_OR_RETURN(args.layer, r.Input(req.layer, "layer"));
  ASSIGN_OR_RETURN(args.indices, r.Input(req.indices, "indices"));
  return args;
}

uint64_t ScatterTokensOp::BytesMoved(const Args& args) {
  return ViewBytes(args.indices) + 2 * ViewBytes(args.layer);
}

}  // namespace tokensel::core
