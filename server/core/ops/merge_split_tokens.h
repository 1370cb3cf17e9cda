// MergeTokens and SplitTokens in the server core (the Random-LTD pair without
// the clone): requests, resolution, shapes, work, bytes. Kernel contracts:
// kernels/ops.h (MergeTokensArgs, SplitTokensArgs).
//
// MergeTokens: `out` absent is returned inline as "out" (shaped like x). A
// by-reference `out` naming the same bytes, shape and strides as a
// by-reference `x` merges in place (then the op is ScatterTokens on x).
// SplitTokens: `layer_grad` and `rest_grad` absent are returned inline
// under those names; a `rest_grad` that is `grad` itself zeroes in place.
// Bytes moved: indices read + each output row read once and written once
// (in place: only the retained rows move, and SplitTokens zeroes them).
// Work: indices + the elements written (B*S*C for a merge out or a
// rest_grad, B*R*C for layer_grad) + rows * (S / 64 + 1) (the membership
// bitmaps of S bits per row).
#ifndef TOKENSEL_SERVER_CORE_OPS_MERGE_SPLIT_TOKENS_H_
#define TOKENSEL_SERVER_CORE_OPS_MERGE_SPLIT_TOKENS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct MergeTokensOp;
struct SplitTokensOp;

struct MergeTokensRequest {
  using Op = MergeTokensOp;
  TensorSpec x;
  TensorSpec layer;
  TensorSpec indices;
  std::optional<TensorSpec> out;
  bool batch_first = true;
};

struct MergeTokensOp {
  using Request = MergeTokensRequest;
  using Args = kernels::MergeTokensArgs;
  static constexpr absl::string_view kName = "MergeTokens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

struct SplitTokensRequest {
  using Op = SplitTokensOp;
  TensorSpec grad;
  TensorSpec indices;
  std::optional<TensorSpec> layer_grad;
  std::optional<TensorSpec> rest_grad;
  bool batch_first = true;
};

struct SplitTokensOp {
  using Request = SplitTokensRequest;
  using Args = kernels::SplitTokensArgs;
  static constexpr absl::string_view kName = "SplitTokens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// A tensor shaped like the token tensor `tokens` ([B,S,C] / [S,B,C]), of
// its dtype: MergeTokens' out, SplitTokens' rest_grad.
absl::StatusOr<OutputShape> TokensLikeShape(const kernels::TensorView& tokens,
                                            absl::string_view field);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_MERGE_SPLIT_TOKENS_H_
