// GatherBertMask in the server core: request, resolution, shapes, work, bytes.
// Kernel contract: kernels/ops.h (GatherBertMaskArgs).
//
// `out` absent (or without a source) is returned inline.
// Bytes moved: indices read + out written + the same amount of mask read.
// Work: indices + L*B*H*R*R (out [L,B,H,R,R] = indices [L,B,R] x H x R).
#ifndef TOKENSEL_SERVER_CORE_OPS_GATHER_BERT_MASK_H_
#define TOKENSEL_SERVER_CORE_OPS_GATHER_BERT_MASK_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct GatherBertMaskOp;

struct GatherBertMaskRequest {
  using Op = GatherBertMaskOp;
  TensorSpec mask;
  TensorSpec indices;
  std::optional<TensorSpec> out;
};

struct GatherBertMaskOp {
  using Request = GatherBertMaskRequest;
  using Args = kernels::GatherBertMaskArgs;
  static constexpr absl::string_view kName = "GatherBertMask";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// out: mask's dtype, [L,B,H,R,R] (L, R from indices [L,B,R]; B, H from mask
// [B,H,Sq,S]).
absl::StatusOr<OutputShape> BertMaskOutShape(const kernels::TensorView& mask,
                                             const kernels::TensorView& indices);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_GATHER_BERT_MASK_H_
