#include "server/core/ops/sort_tokens.h"

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<SortTokensOp>);

uint64_t SortTokensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.AddAll(req.ids, req.out, req.inverse);
  const int64_t r = req.ids.shape.empty() ? 0 : req.ids.shape.back();
  sum.AddScalar(ops_support::RowCheckWork(ops_support::Rows(req.ids), r, req.original_tokens));
  return sum.total();
}

absl::StatusOr<kernels::SortTokensArgs> SortTokensOp::Resolve(Resolver& r, const Request& req) {
  Args args;
  if (req.out.has_value()) {
    ASSIGN_OR_RETURN(args.ids, r.Input(req.ids, "ids"));
    ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out", [&] { return SortOutShape(args.ids); }));
  } else {
    ASSIGN_OR_RETURN(args.ids, r.InOut(req.ids, "ids", "out"));
  }
  args.original_tokens = req.original_tokens;
  if (req.inverse.has_value()) {
    ASSIGN_OR_RETURN(args.inverse, r.Output(req.inverse, "inverse", [&] {
      return SortInverseShape(args.ids, req.original_tokens);
    }));
  }
  return args;
}

uint64_t SortTokensOp::BytesMoved(const Args& args) {
  return 2 * ViewBytes(args.ids) + ops_support::OptBytes(args.inverse);
}

absl::StatusOr<OutputShape> SortOutShape(const kernels::TensorView& ids) {
  RETURN_IF_ERROR(kernels::CheckView(ids, "ids"));
  return OutputShape{ids.dtype, std::vector<int64_t>(ids.shape, ids.shape + ids.rank)};
}

absl::StatusOr<OutputShape> SortInverseShape(const kernels::TensorView& ids,
                                             int64_t original_tokens) {
  RETURN_IF_ERROR(kernels::CheckView(ids, "ids"));
  RETURN_IF_ERROR(ops_support::CheckNonNegative(original_tokens, "original_tokens"));
  std::vector<int64_t> shape(ids.shape, ids.shape + ids.rank);
  shape.back() = original_tokens;
  return OutputShape{kernels::DType::kInt32, std::move(shape)};
}

}  // namespace tokensel::core
