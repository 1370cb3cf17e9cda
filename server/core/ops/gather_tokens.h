// GatherTokens in the server core: request, resolution, shapes, work, bytes.
// Kernel contract: kernels/ops.h (GatherTokensArgs).
//
// `out` absent (or without a source) is returned inline.
// Bytes moved: indices read + out written + the same amount of activations read.
// Work: indices + B*R*C (a copy touches what it writes, not its whole input:
// [B,S,C] activations of which R rows are gathered cost B*R*C, whatever S is).
#ifndef TOKENSEL_SERVER_CORE_OPS_GATHER_TOKENS_H_
#define TOKENSEL_SERVER_CORE_OPS_GATHER_TOKENS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct GatherTokensOp;

struct GatherTokensRequest {
  using Op = GatherTokensOp;
  TensorSpec activations;
  TensorSpec indices;
  std::optional<TensorSpec> out;
  bool batch_first = true;
};

struct GatherTokensOp {
  using Request = GatherTokensRequest;
  using Args = kernels::GatherTokensArgs;
  static constexpr absl::string_view kName = "GatherTokens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// out: activations' dtype, [B,R,C] (batch_first, B and C from activations
// [B,S,C]) or [R,B,C] (from [S,B,C]); R from indices [B,R].
absl::StatusOr<OutputShape> GatherOutShape(const kernels::TensorView& activations,
                                           const kernels::TensorView& indices, bool batch_first);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_GATHER_TOKENS_H_
