#include "server/core/ops/sample_tokens.h"

#include <algorithm>

#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<SampleTokensOp>);

using kernels::DType;
using kernels::TensorView;
using ops_support::CheckNonNegative;

uint64_t SampleTokensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.AddAll(req.ids, req.inverse, req.mask, req.bert_mask, req.gpt_mask);
  sum.AddScalar(ops_support::SaturatingMul(
      ops_support::SaturatingMul(ops_support::NonNegative(req.layers),
                                 ops_support::NonNegative(req.batch)),
      std::max<uint64_t>(ops_support::NonNegative(req.original_tokens), 1)));
  return sum.total();
}

absl::StatusOr<kernels::SampleTokensArgs> SampleTokensOp::Resolve(Resolver& r, const Request& req) {
  Args args;
  args.layers = req.layers;
  args.batch = req.batch;
  args.original_tokens = req.original_tokens;
  args.retained_tokens = req.retained_tokens;
  args.seed = req.seed;
  args.step = req.step;
  ASSIGN_OR_RETURN(args.mask, r.OptionalInput(req.mask, "mask"));
  ASSIGN_OR_RETURN(args.ids, r.Output(req.ids, "ids", [&] {
    return SampleIdsShape(req.layers, req.batch, req.retained_tokens);
  }));
  if (req.inverse.has_value()) {
    ASSIGN_OR_RETURN(args.inverse, r.Output(req.inverse, "inverse", [&] {
      return SampleInverseShape(req.layers, req.batch, req.original_tokens);
    }));
  }
  if (req.bert_mask.has_value()) {
    ASSIGN_OR_RETURN(args.bert_mask, r.Output(req.bert_mask, "bert_mask", [&] {
      return SampleBertMaskShape(req.layers, req.batch, req.retained_tokens, args.mask);
    }));
  }
  if (req.gpt_mask.has_value()) {
    ASSIGN_OR_RETURN(args.gpt_mask, r.Output(req.gpt_mask, "gpt_mask", [&] {
      return SampleGptMaskShape(req.batch, req.retained_tokens, args.mask);
    }));
  }
  return args;
}

uint64_t SampleTokensOp::BytesMoved(const Args& args) {
  return ViewBytes(args.ids) + ops_support::OptBytes(args.inverse) +
         2 * ops_support::OptBytes(args.bert_mask) + 2 * ops_support::OptBytes(args.gpt_mask);
}

absl::StatusOr<OutputShape> SampleIdsShape(int64_t layers, int64_t batch, int64_t retained) {
  RETURN_IF_ERROR(CheckNonNegative(layers, "layers"));
  RETURN_IF_ERROR(CheckNonNegative(batch, "batch"));
  RETURN_IF_ERROR(CheckNonNegative(retained, "retained_tokens"));
  return OutputShape{DType::kInt32, {layers, batch, retained}, /*index_dtype_choice=*/true};
}

absl::StatusOr<OutputShape> SampleInverseShape(int64_t layers, int64_t batch, int64_t original) {
  RETURN_IF_ERROR(CheckNonNegative(layers, "layers"));
  RETURN_IF_ERROR(CheckNonNegative(batch, "batch"));
  RETURN_IF_ERROR(CheckNonNegative(original, "original_tokens"));
  return OutputShape{DType::kInt32, {layers, batch, original}};
}

absl::StatusOr<OutputShape> SampleBertMaskShape(int64_t layers, int64_t batch, int64_t retained,
                                                const std::optional<TensorView>& mask) {
  if (!mask.has_value()) {
    return absl::InvalidArgumentError("bert_mask: requires mask [B,H,Sq,S] to gather from");
  }
  RETURN_IF_ERROR(kernels::CheckView(*mask, "mask", 4));
  RETURN_IF_ERROR(CheckNonNegative(layers, "layers"));
  RETURN_IF_ERROR(CheckNonNegative(batch, "batch"));
  RETURN_IF_ERROR(CheckNonNegative(retained, "retained_tokens"));
  return OutputShape{mask->dtype, {layers, batch, mask->shape[1], retained, retained}};
}

absl::StatusOr<OutputShape> SampleGptMaskShape(int64_t batch, int64_t retained,
                                               const std::optional<TensorView>& mask) {
  if (!mask.has_value()) {
    return absl::InvalidArgumentError("gpt_mask: requires mask [B,H,S,S] to slice");
  }
  RETURN_IF_ERROR(kernels::CheckView(*mask, "mask", 4));
  RETURN_IF_ERROR(CheckNonNegative(batch, "batch"));
  RETURN_IF_ERROR(CheckNonNegative(retained, "retained_tokens"));
  return OutputShape{mask->dtype, {batch, mask->shape[1], retained, retained}};
}

}  // namespace tokensel::core
