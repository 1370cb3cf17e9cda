#include "server/core/ops/merge_split_tokens.h"

#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/gather_tokens.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {
namespace {

// Work of writing every row of a token tensor like `tokens` and of the
// membership bitmaps of its rows.
void AddTokenRows(ops_support::WorkSum& sum, const TensorSpec& tokens, const TensorSpec& indices,
                  bool batch_first) {
  sum.Add(tokens);
  const size_t seq_axis = batch_first ? 1 : 0;
  if (tokens.shape.size() > seq_axis) {
    sum.AddScalar(ops_support::BitmapWork(ops_support::Rows(indices), tokens.shape[seq_axis]));
  }
}

}  // namespace

static_assert(Operator<MergeTokensOp>);
static_assert(Operator<SplitTokensOp>);

uint64_t MergeTokensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.Add(req.indices);
  AddTokenRows(sum, req.x, req.indices, req.batch_first);
  return sum.total();
}

absl::StatusOr<kernels::MergeTokensArgs> MergeTokensOp::Resolve(Resolver& r, const Request& req) {
  Args args;
  args.batch_first = req.batch_first;
  ASSIGN_OR_RETURN(args.x, r.Input(req.x, "x"));
  ASSIGN_OR_RETURN(args.layer, r.Input(req.layer, "layer"));
  ASSIGN_OR_RETURN(args.indices, r.Input(req.indices, "indices"));
  ASSIGN_OR_RETURN(args.out,
                   r.Output(req.out, "out", [&] { return TokensLikeShape(args.x, "x"); }));
  return args;
}

uint64_t MergeTokensOp::BytesMoved(const Args& args) {
  const uint64_t moved =
      kernels::SameView(args.out, args.x) ? ViewBytes(args.layer) : ViewBytes(args.out);
  return ViewBytes(args.indices) + 2 * moved;
}

uint64_t SplitTokensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.Add(req.indices);
  sum.AddScalar(ops_support::SaturatingMul(ops_support::Elements(req.indices),
                                           ops_support::Dim(req.grad, 2)));
  AddTokenRows(sum, req.grad, req.indices, req.batch_first);
  return sum.total();
}

absl::StatusOr<kernels::SplitTokensArgs> SplitTokensOp::Resolve(Resolver& r, const Request& req) {
  Args args;
  args.batch_first = req.batch_first;
  ASSIGN_OR_RETURN(args.grad, r.Input(req.grad, "grad"));
  ASSIGN_OR_RETURN(args.indices, r.Input(req.indices, "indices"));
  ASSIGN_OR_RETURN(args.layer_grad, r.Output(req.layer_grad, "layer_grad", [&] {
    return GatherOutShape(args.grad, args.indices, req.batch_first);
  }));
  ASSIGN_OR_RETURN(args.rest_grad, r.Output(req.rest_grad, "rest_grad",
                                            [&] { return TokensLikeShape(args.grad, "grad"); }));
  return args;
}

uint64_t SplitTokensOp::BytesMoved(const Args& args) {
  const uint64_t layer = ViewBytes(args.layer_grad);
  const uint64_t rest =
      kernels::SameView(args.rest_grad, args.grad) ? layer : 2 * ViewBytes(args.rest_grad);
  return ViewBytes(args.indices) + 2 * layer + rest;
}

absl::StatusOr<OutputShape> TokensLikeShape(const kernels::TensorView& tokens,
                                            absl::string_view field) {
  RETURN_IF_ERROR(kernels::CheckView(tokens, field, 3));
  return OutputShape{tokens.dtype, {tokens.shape[0], tokens.shape[1], tokens.shape[2]}};
}

}  // namespace tokensel::core
