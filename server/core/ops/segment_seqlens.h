// SegmentSeqlens in the server core: request, resolution, shapes, work, bytes.
// Kernel contract: kernels/ops.h (SegmentSeqlensArgs).
//
// Every output that applies and is absent (or without a source) is returned
// inline: q_seqlen, q_offset always; kv_* only with segment_ids_kv; the
// *_packed_* and *_cu_seqlens outputs only with `packed`. An output that does
// not apply but carries a buffer is INVALID_ARGUMENT "<field>: given, but ...".
// Bytes moved: every input read + every output written.
// Work: every tensor given + B * sides * (NS + 1) (its staging and outputs,
// given or inline).
#ifndef TOKENSEL_SERVER_CORE_OPS_SEGMENT_SEQLENS_H_
#define TOKENSEL_SERVER_CORE_OPS_SEGMENT_SEQLENS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/ops/op.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

struct SegmentSeqlensOp;

struct SegmentSeqlensRequest {
  using Op = SegmentSeqlensOp;
  TensorSpec segment_ids_q;
  std::optional<TensorSpec> segment_pos_q;
  std::optional<TensorSpec> segment_ids_kv;
  std::optional<TensorSpec> segment_pos_kv;
  int64_t max_segments = 0;
  kernels::AttnMaskType mask = kernels::AttnMaskType::kPadding;
  bool packed = false;
  // Outputs; absent = inline. kv_* only with segment_ids_kv; *_packed_*,
  // *_cu_seqlens only with `packed`.
  std::optional<TensorSpec> q_seqlen, q_offset, kv_seqlen, kv_offset;
  std::optional<TensorSpec> q_packed_seqlens, q_packed_offsets, q_cu_seqlens;
  std::optional<TensorSpec> kv_packed_seqlens, kv_packed_offsets, kv_cu_seqlens;
};

struct SegmentSeqlensOp {
  using Request = SegmentSeqlensRequest;
  using Args = kernels::SegmentSeqlensArgs;
  static constexpr absl::string_view kName = "SegmentSeqlens";
  static uint64_t EstimateWork(const Request& req);
  static absl::StatusOr<Args> Resolve(Resolver& r, const Request& req);
  static uint64_t BytesMoved(const Args& args);
};

// The outputs, all int32; B from segment_ids_q [B,T].
enum class SegmentOutput : uint8_t {
  kSeqlen,         // [B, NS]
  kOffset,         // [B, NS+1]
  kPackedSeqlens,  // [B*NS]
  kPackedOffsets,  // [B*(NS+1)]
  kCuSeqlens,      // [B*NS+1]
};
absl::StatusOr<OutputShape> SegmentOutShape(SegmentOutput which,
                                            const kernels::TensorView& segment_ids_q,
                                            int64_t max_segments);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_SEGMENT_SEQLENS_H_
