// ScatterTokens in the server core: request, resolution, work, bytes.
// Kernel contract: kernels/ops.h (ScatterTokensArgs).
//
// In place on `all`; inline `all` comes back written as "all".
// Bytes moved: indices read + layer read + the same amount of all written.
// Work: layer + indices + rows * (S / 64 + 1) (the CUDA kernels' per-row
// bitmaps of S bits; on the CPU such rows are checked by sorting).
#ifndef TOKENSEL_SERVER_CORE_OPS_SCATTER_TOKENS_H_
#define TOKENSEL_SERVER_CORE_OPS_SCATTER_TOKENS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct ScatterTokensOp;

struct ScatterTokensRequest {
  using Op = ScatterTokensOp;
  TensorSpec all;
  TensorSpec layer;
  TensorSpec indices;
  bool batch_first = true;
};

struct ScatterTokensOp {
  using Request = ScatterTokensRequest;
  using Args = kernels::ScatterTokensArgs;
  static constexpr absl::string_view kName = "ScatterTokens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_SCATTER_TOKENS_H_
