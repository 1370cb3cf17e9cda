// SliceGptMask in the server core: request, resolution, shapes, work, bytes.
// Kernel contract: kernels/ops.h (SliceGptMaskArgs).
//
// `out` absent (or without a source) is returned inline, R = retained_tokens.
// With `out` in a buffer R comes from its shape; a retained_tokens given as
// well must agree (INVALID_ARGUMENT).
// Bytes moved: out written + the same amount of mask read.
// Work: B*H*R*R (R from `out` when given, else retained_tokens).
#ifndef TOKENSEL_SERVER_CORE_OPS_SLICE_GPT_MASK_H_
#define TOKENSEL_SERVER_CORE_OPS_SLICE_GPT_MASK_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct SliceGptMaskOp;

struct SliceGptMaskRequest {
  using Op = SliceGptMaskOp;
  TensorSpec mask;
  int64_t retained_tokens = 0;
  std::optional<TensorSpec> out;
};

struct SliceGptMaskOp {
  using Request = SliceGptMaskRequest;
  using Args = kernels::SliceGptMaskArgs;
  static constexpr absl::string_view kName = "SliceGptMask";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// out: mask's dtype, [B,H,R,R], R = retained_tokens in [0, S].
absl::StatusOr<OutputShape> GptMaskOutShape(const kernels::TensorView& mask,
                                            int64_t retained_tokens);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_SLICE_GPT_MASK_H_
