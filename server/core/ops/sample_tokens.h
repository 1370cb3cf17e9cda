// SampleTokens in the server core: request, resolution, shapes, work, bytes.
// Kernel contract: kernels/ops.h (SampleTokensArgs).
//
// `ids` absent (or without a source) is returned inline (int32, or int64 on
// request); inverse, bert_mask and gpt_mask are computed only when present.
// Bytes moved: ids + inverse written + each mask output written and read.
// Work: every tensor given + L * B * max(S, 1) (its cost is per position
// whatever R is).
#ifndef TOKENSEL_SERVER_CORE_OPS_SAMPLE_TOKENS_H_
#define TOKENSEL_SERVER_CORE_OPS_SAMPLE_TOKENS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct SampleTokensOp;

struct SampleTokensRequest {
  using Op = SampleTokensOp;
  int64_t layers = 0;
  int64_t batch = 0;
  int64_t original_tokens = 0;
  int64_t retained_tokens = 0;
  uint64_t seed = 0;
  uint64_t step = 0;
  std::optional<TensorSpec> ids;  // absent = inline int32
  std::optional<TensorSpec> inverse;
  std::optional<TensorSpec> mask;
  std::optional<TensorSpec> bert_mask;
  std::optional<TensorSpec> gpt_mask;
};

struct SampleTokensOp {
  using Request = SampleTokensRequest;
  using Args = kernels::SampleTokensArgs;
  static constexpr absl::string_view kName = "SampleTokens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// ids int32 (or int64 on request) [L,B,R]; inverse int32 [L,B,S]; bert_mask
// mask's dtype [L,B,H,R,R]; gpt_mask mask's dtype [B,H,R,R].
absl::StatusOr<OutputShape> SampleIdsShape(int64_t layers, int64_t batch, int64_t retained);
absl::StatusOr<OutputShape> SampleInverseShape(int64_t layers, int64_t batch, int64_t original);
absl::StatusOr<OutputShape> SampleBertMaskShape(int64_t layers, int64_t batch, int64_t retained,
                                                const std::optional<kernels::TensorView>& mask);
absl::StatusOr<OutputShape> SampleGptMaskShape(int64_t batch, int64_t retained,
                                               const std::optional<kernels::TensorView>& mask);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_SAMPLE_TOKENS_H_
