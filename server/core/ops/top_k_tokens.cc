#include "server/core/ops/top_k_tokens.h"

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<TopKTokensOp>);

uint64_t TopKTokensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.AddAll(req.scores, req.ids);
  return sum.total();
}

absl::StatusOr<kernels::TopKTokensArgs> TopKTokensOp::Resolve(Resolver& r, const Request& req) {
  Args args;
  ASSIGN_OR_RETURN(args.scores, r.Input(req.scores, "scores"));
  ASSIGN_OR_RETURN(args.ids, r.Output(req.ids, "ids", [&] {
    return TopKIdsShape(args.scores, req.retained_tokens);
  }));
  return args;
}

uint64_t TopKTokensOp::BytesMoved(const Args& args) {
  return ViewBytes(args.scores) + ViewBytes(args.ids);
}

absl::StatusOr<OutputShape> TopKIdsShape(const kernels::TensorView& scores,
                                         int64_t retained_tokens) {
  RETURN_IF_ERROR(kernels::CheckView(scores, "scores"));
  RETURN_IF_ERROR(ops_support::CheckNonNegative(retained_tokens, "retained_tokens"));
  std::vector<int64_t> shape(scores.shape, scores.shape + scores.rank);
  shape.back() = retained_tokens;
  return OutputShape{kernels::DType::kInt32, std::move(shape), /*index_dtype_choice=*/true};
}

}  // namespace tokensel::core
