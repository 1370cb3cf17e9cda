// The dtype and shape of every output an op can return inline, derived from
// the op's (already resolved) inputs as kernels/ops.h defines them, and the
// bytes each op moves (for the tokensel_bytes_moved_total metric).
//
// The derivations check only what they need to compute a shape (input ranks,
// non-negative scalars, no overflow) and name the offending field; every
// other rule is left to the kernels' own validation, which runs afterwards on
// the full set of views.
//
// Bytes moved (logical bytes: elements x element size, strides ignored):
//   SortTokens      ids read + sorted ids written + inverse written
//   GatherTokens    indices read + out written + the same amount of activations read
//   ScatterTokens   indices read + layer read + the same amount of all written
//   GatherBertMask  indices read + out written + the same amount of mask read
//   SliceGptMask    out written + the same amount of mask read
//   SegmentSeqlens  every input read + every output written
//   SampleTokens    ids + inverse written + each mask output written and read
//   TopKTokens      scores read + ids written
#ifndef TOKENSEL_SERVER_CORE_OUTPUT_SHAPES_H_
#define TOKENSEL_SERVER_CORE_OUTPUT_SHAPES_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/tensor_view.h"

namespace tokensel::core {

struct OutputShape {
  kernels::DType dtype = kernels::DType::kInt32;
  std::vector<int64_t> shape;
  // The op accepts int32 or int64 here (ids outputs): a requested dtype of
  // either is honoured, `dtype` is the default.
  bool index_dtype_choice = false;
};

// SortTokens: out = ids' dtype and shape; inverse = int32 [..., S].
absl::StatusOr<OutputShape> SortOutShape(const kernels::TensorView& ids);
absl::StatusOr<OutputShape> SortInverseShape(const kernels::TensorView& ids,
                                             int64_t original_tokens);

// GatherTokens: activations' dtype, [B,R,C] (batch_first, B and C from
// activations [B,S,C]) or [R,B,C] (from [S,B,C]); R from indices [B,R].
absl::StatusOr<OutputShape> GatherOutShape(const kernels::TensorView& activations,
                                           const kernels::TensorView& indices, bool batch_first);

// GatherBertMask: mask's dtype, [L,B,H,R,R] (L, R from indices [L,B,R]; B, H
// from mask [B,H,Sq,S]).
absl::StatusOr<OutputShape> BertMaskOutShape(const kernels::TensorView& mask,
                                             const kernels::TensorView& indices);

// SliceGptMask: mask's dtype, [B,H,R,R], R = retained_tokens in [0, S].
absl::StatusOr<OutputShape> GptMaskOutShape(const kernels::TensorView& mask,
                                            int64_t retained_tokens);

// SegmentSeqlens outputs, all int32; B from segment_ids_q [B,T].
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

// SampleTokens: ids int32 (or int64 on request) [L,B,R]; inverse int32
// [L,B,S]; bert_mask mask's dtype [L,B,H,R,R]; gpt_mask mask's dtype [B,H,R,R].
absl::StatusOr<OutputShape> SampleIdsShape(int64_t layers, int64_t batch, int64_t retained);
absl::StatusOr<OutputShape> SampleInverseShape(int64_t layers, int64_t batch, int64_t original);
absl::StatusOr<OutputShape> SampleBertMaskShape(int64_t layers, int64_t batch, int64_t retained,
                                                const std::optional<kernels::TensorView>& mask);
absl::StatusOr<OutputShape> SampleGptMaskShape(int64_t batch, int64_t retained,
                                               const std::optional<kernels::TensorView>& mask);

// TopKTokens: ids int32 (or int64 on request), scores' shape with the last
// dim replaced by R = retained_tokens.
absl::StatusOr<OutputShape> TopKIdsShape(const kernels::TensorView& scores,
                                         int64_t retained_tokens);

// Logical bytes of a view (elements x element size); 0 for an empty view.
uint64_t ViewBytes(const kernels::TensorView& v);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OUTPUT_SHAPES_H_
