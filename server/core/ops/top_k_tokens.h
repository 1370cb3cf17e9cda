// TopKTokens in the server core: request, resolution, shapes, work, bytes.
// Kernel contract: kernels/ops.h (TopKTokensArgs).
//
// `ids` absent (or without a source) is returned inline (int32, or int64 on
// request).
// Bytes moved: scores read + ids written.
// Work: scores + ids.
#ifndef TOKENSEL_SERVER_CORE_OPS_TOP_K_TOKENS_H_
#define TOKENSEL_SERVER_CORE_OPS_TOP_K_TOKENS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct TopKTokensOp;

struct TopKTokensRequest {
  using Op = TopKTokensOp;
  TensorSpec scores;
  int64_t retained_tokens = 0;
  std::optional<TensorSpec> ids;  // absent = inline int32
};

struct TopKTokensOp {
  using Request = TopKTokensRequest;
  using Args = kernels::TopKTokensArgs;
  static constexpr absl::string_view kName = "TopKTokens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// ids: int32 (or int64 on request), scores' shape with the last dim replaced
// by R = retained_tokens.
absl::StatusOr<OutputShape> TopKIdsShape(const kernels::TensorView& scores,
                                         int64_t retained_tokens);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_TOP_K_TOKENS_H_
