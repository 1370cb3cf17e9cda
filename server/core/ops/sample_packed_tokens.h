// SamplePackedTokens in the server core: request, resolution, shapes, work,
// bytes. Kernel contract: kernels/ops.h (SamplePackedTokensArgs).
//
// cu_seqlens_kept and ids absent (or without a source) come back inline
// (int32); positions, inverse and out are computed only when present (out
// needs activations and layers == 1). T (total_tokens) is the request field
// or, when absent, activations' dim 0. T' (the kept tokens, dim 1 of ids and
// positions, dim 0 of out) is data-dependent; an inline one is sized by
// `kept_tokens` when given, else derived from cu_seqlens when it is inline
// (read from the request message, server memory, before anything runs:
// invalid data is then the kernel's message); a cu_seqlens in a buffer with
// an inline T'-shaped output needs kept_tokens. Whatever sized them, the
// kernel checks T' against the outputs on its own snapshot of cu_seqlens.
// Bytes moved: cu_seqlens read + every output written + out's rows read.
// Work: every tensor given + L * max(T, N, 1) (per layer, the keys and
// selection of every token and a task per sequence, empty ones included).
#ifndef TOKENSEL_SERVER_CORE_OPS_SAMPLE_PACKED_TOKENS_H_
#define TOKENSEL_SERVER_CORE_OPS_SAMPLE_PACKED_TOKENS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct SamplePackedTokensOp;

struct SamplePackedTokensRequest {
  using Op = SamplePackedTokensOp;
  TensorSpec cu_seqlens;                // int32 [N+1]
  std::optional<int64_t> total_tokens;  // absent = activations' dim 0
  std::optional<int64_t> kept_tokens;   // T', for inline outputs (see above)
  int64_t keep_num = 0;
  int64_t keep_den = 0;
  int64_t min_tokens = 0;
  int64_t layers = 0;
  uint64_t seed = 0;
  uint64_t step = 0;
  std::optional<TensorSpec> activations;      // [T,C]
  std::optional<TensorSpec> cu_seqlens_kept;  // absent = inline int32 [N+1]
  std::optional<TensorSpec> ids;              // absent = inline int32 [L,T']
  std::optional<TensorSpec> positions;        // int32 [L,T']
  std::optional<TensorSpec> inverse;          // int32 [L,T]
  std::optional<TensorSpec> out;              // activations' dtype [T',C]
};

struct SamplePackedTokensOp {
  using Request = SamplePackedTokensRequest;
  using Args = kernels::SamplePackedTokensArgs;
  static constexpr absl::string_view kName = "SamplePackedTokens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// T: total_tokens, else activations' dim 0 (INVALID_ARGUMENT naming
// total_tokens when neither is there).
absl::StatusOr<int64_t> PackedTotalTokens(const SamplePackedTokensRequest& req);
// T' for inline outputs: kept_tokens, else computed from inline cu_seqlens
// bytes (with the kernel's data check and message), else INVALID_ARGUMENT
// naming kept_tokens.
absl::StatusOr<int64_t> PackedKeptTokensOf(const SamplePackedTokensRequest& req);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_SAMPLE_PACKED_TOKENS_H_
