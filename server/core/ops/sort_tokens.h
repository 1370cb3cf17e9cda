// SortTokens in the server core: request, resolution, shapes, work, bytes.
// Kernel contract: kernels/ops.h (SortTokensArgs).
//
// Without `out` the ids are sorted in place; inline ids then come back
// sorted as "out". `inverse` is computed only when present (absent source =
// returned inline).
// Bytes moved: ids read + sorted ids written + inverse written.
// Work: every tensor's elements + rows * (S / 64 + 1) (the CUDA kernels'
// per-row bitmaps of S bits).
#ifndef TOKENSEL_SERVER_CORE_OPS_SORT_TOKENS_H_
#define TOKENSEL_SERVER_CORE_OPS_SORT_TOKENS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct SortTokensOp;

struct SortTokensRequest {
  using Op = SortTokensOp;
  TensorSpec ids;
  int64_t original_tokens = 0;
  std::optional<TensorSpec> out;
  std::optional<TensorSpec> inverse;
};

struct SortTokensOp {
  using Request = SortTokensRequest;
  using Args = kernels::SortTokensArgs;
  static constexpr absl::string_view kName = "SortTokens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// out = ids' dtype and shape; inverse = int32 [..., S].
absl::StatusOr<OutputShape> SortOutShape(const kernels::TensorView& ids);
absl::StatusOr<OutputShape> SortInverseShape(const kernels::TensorView& ids,
                                             int64_t original_tokens);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_SORT_TOKENS_H_
