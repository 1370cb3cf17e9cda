#include "server/core/ops/sample_packed_tokens.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/validate.h"
#include "server/core/ops/op_support.h"
#include "server/core/resolve.h"

namespace tokensel::core {

static_assert(Operator<SamplePackedTokensOp>);

using kernels::DType;
using ops_support::CheckNonNegative;
using ops_support::NonNegative;
using ops_support::SaturatingMul;

namespace {

// The argument fields the kernels check first, copied from the request.
kernels::SamplePackedTokensArgs ScalarArgs(const SamplePackedTokensRequest& req, int64_t total) {
  kernels::SamplePackedTokensArgs a;
  a.total_tokens = total;
  a.keep_num = req.keep_num;
  a.keep_den = req.keep_den;
  a.min_tokens = req.min_tokens;
  a.layers = req.layers;
  a.seed = req.seed;
  a.step = req.step;
  return a;
}

// N+1 from cu_seqlens' shape (INVALID_ARGUMENT unless it is [N+1], N >= 0).
absl::StatusOr<int64_t> CuLength(const TensorSpec& cu) {
  if (cu.shape.size() != 1 || cu.shape[0] < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cu_seqlens: shape must be [N+1] with N >= 0, got rank ", cu.shape.size(),
                     cu.shape.size() == 1 ? absl::StrCat(" dim ", cu.shape[0]) : std::string()));
  }
  return cu.shape[0];
}

}  // namespace

absl::StatusOr<int64_t> PackedTotalTokens(const SamplePackedTokensRequest& req) {
  if (req.total_tokens.has_value()) return *req.total_tokens;
  if (req.activations.has_value() && !req.activations->shape.empty()) {
    return req.activations->shape[0];
  }
  return absl::InvalidArgumentError(
      "total_tokens: required when activations [T,C] are not given (T, the packed length)");
}

absl::StatusOr<int64_t> PackedKeptTokensOf(const SamplePackedTokensRequest& req) {
  if (req.kept_tokens.has_value()) {
    RETURN_IF_ERROR(CheckNonNegative(*req.kept_tokens, "kept_tokens"));
    return *req.kept_tokens;
  }
  const TensorSpec& cu = req.cu_seqlens;
  if (cu.source != TensorSpec::Source::kInline) {
    return absl::InvalidArgumentError(
        "kept_tokens: required when cu_seqlens is in a buffer and ids, positions or out are "
        "returned inline (T' = sum of r_i, docs/ops.md section 11)");
  }
  // Inline cu_seqlens: its bytes are in the request message (server memory),
  // read here once to size the outputs; the kernel reads its own staged copy.
  if (cu.dtype != DType::kInt32) {
    return absl::InvalidArgumentError("cu_seqlens: dtype must be int32");
  }
  ASSIGN_OR_RETURN(const int64_t n_plus_1, CuLength(cu));
  if (cu.inline_data.size() != static_cast<uint64_t>(n_plus_1) * sizeof(int32_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cu_seqlens: inline data has ", cu.inline_data.size(), " bytes, expected ",
                     n_plus_1 * 4, " (shape [", n_plus_1, "] int32)"));
  }
  std::vector<int32_t> values(static_cast<size_t>(n_plus_1));
  std::memcpy(values.data(), cu.inline_data.data(), cu.inline_data.size());
  ASSIGN_OR_RETURN(const int64_t total, PackedTotalTokens(req));
  const kernels::SamplePackedTokensArgs scalars = ScalarArgs(req, total);
  // The scalars first, as the kernel checks them, so r_i is well defined.
  RETURN_IF_ERROR(kernels::ValidateSamplePackedScalars(scalars));
  RETURN_IF_ERROR(kernels::CheckPackedCuSeqlens(values.data(), n_plus_1, total));
  return kernels::PackedKeptTokens(values.data(), n_plus_1, scalars);
}

uint64_t SamplePackedTokensOp::EstimateWork(const Request& req) {
  ops_support::WorkSum sum;
  sum.Add(req.cu_seqlens);
  sum.AddAll(req.activations, req.cu_seqlens_kept, req.ids, req.positions, req.inverse, req.out);
  const int64_t total = PackedTotalTokens(req).value_or(0);  // absent: Resolve reports it
  // Per layer: every token (keys, selection) and every sequence (a task,
  // also when empty: N is not bounded by T, and a broadcast cu_seqlens of N
  // zeros costs 4 bytes).
  // Any int64 may come in (metadata is not validated yet): no overflow.
  const int64_t sequences = req.cu_seqlens.shape.size() == 1 && req.cu_seqlens.shape[0] > 0
                                ? req.cu_seqlens.shape[0] - 1
                                : 0;
  const uint64_t per_layer =
      std::max<uint64_t>({NonNegative(total), NonNegative(sequences), uint64_t{1}});
  sum.AddScalar(SaturatingMul(NonNegative(req.layers), per_layer));
  return sum.total();
}

absl::StatusOr<kernels::SamplePackedTokensArgs> SamplePackedTokensOp::Resolve(Resolver& r,
                                                                              const Request& req) {
  ASSIGN_OR_RETURN(const int64_t total, PackedTotalTokens(req));
  Args args = ScalarArgs(req, total);
  ASSIGN_OR_RETURN(args.cu_seqlens, r.Input(req.cu_seqlens, "cu_seqlens"));
  ASSIGN_OR_RETURN(args.activations, r.OptionalInput(req.activations, "activations"));
  ASSIGN_OR_RETURN(const int64_t n_plus_1, CuLength(req.cu_seqlens));
  ASSIGN_OR_RETURN(args.cu_seqlens_kept, r.Output(req.cu_seqlens_kept, "cu_seqlens_kept", [&] {
    return absl::StatusOr<OutputShape>(OutputShape{DType::kInt32, {n_plus_1}});
  }));
  RETURN_IF_ERROR(CheckNonNegative(req.layers, "layers"));
  // T' is derived at most once, and only for an inline output that needs it.
  std::optional<int64_t> kept;
  auto kept_shape = [&](int64_t leading) -> absl::StatusOr<OutputShape> {
    if (!kept.has_value()) {
      ASSIGN_OR_RETURN(kept, PackedKeptTokensOf(req));
    }
    return OutputShape{DType::kInt32, {leading, *kept}};
  };
  ASSIGN_OR_RETURN(args.ids, r.Output(req.ids, "ids", [&] { return kept_shape(req.layers); }));
  if (req.positions.has_value()) {
    ASSIGN_OR_RETURN(args.positions,
                     r.Output(req.positions, "positions", [&] { return kept_shape(req.layers); }));
  }
  if (req.inverse.has_value()) {
    RETURN_IF_ERROR(CheckNonNegative(total, "total_tokens"));
    ASSIGN_OR_RETURN(args.inverse, r.Output(req.inverse, "inverse", [&] {
      return absl::StatusOr<OutputShape>(OutputShape{DType::kInt32, {req.layers, total}});
    }));
  }
  if (req.out.has_value()) {
    ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out", [&]() -> absl::StatusOr<OutputShape> {
      if (!args.activations.has_value()) {
        return absl::InvalidArgumentError("out: requires activations [T,C] to gather from");
      }
      RETURN_IF_ERROR(kernels::CheckView(*args.activations, "activations", 2));
      ASSIGN_OR_RETURN(const OutputShape ids_shape, kept_shape(1));
      return OutputShape{args.activations->dtype, {ids_shape.shape[1], args.activations->shape[1]}};
    }));
  }
  return args;
}

uint64_t SamplePackedTokensOp::BytesMoved(const Args& args) {
  return ViewBytes(args.cu_seqlens) + ViewBytes(args.cu_seqlens_kept) + ViewBytes(args.ids) +
         ops_support::OptBytes(args.positions) + ops_support::OptBytes(args.inverse) +
         2 * ops_support::OptBytes(args.out);
}

}  // namespace tokensel::core
