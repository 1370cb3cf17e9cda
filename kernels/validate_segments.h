// SegmentSeqlens data-error messages, shared by the CPU and CUDA twins so both
// report byte-identical text. The metadata validation itself is
// ValidateSegmentSeqlens() (kernels/ops.h, implemented in validate_segments.cc).
//
// Which error is reported: the lowest row with an error; within a row the q
// side before the kv side; within a side the lowest token, checking per token
// the id range, then the run structure, then the position. Positions are only
// read (and checked) when the mask needs them (see segment_math.h).
//
// Messages (row b, token t):
//   segment_ids_q[b,t] = 3 is out of range [0, 2] (0 = padding, ids are 1..max_segments)
//   segment_ids_q[b,t] = 1: padding inside segment 1 (each segment must be one contiguous run)
//   segment_ids_q[b,t] = 1 after segment 2: segment ids must strictly increase along a row
//       (id 1 appears again or ids decrease)
//   segment_pos_kv[b,t] = -1 is negative (positions of non-padding tokens must be >= 0)
#ifndef TOKENSEL_KERNELS_VALIDATE_SEGMENTS_H_
#define TOKENSEL_KERNELS_VALIDATE_SEGMENTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/segment_math.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels {

// INVALID_ARGUMENT for `error` (kind != kNone) found in row `row`. `view` is
// the offending tensor ([B,T] ids or positions) and `field` its name in
// SegmentSeqlensArgs; `max_segments` is NS.
absl::Status SegmentDataError(const TensorView& view, absl::string_view field, int64_t row,
                              const SegmentError& error, int64_t max_segments);

// The field name of the offending tensor of `error`.
absl::string_view SegmentErrorField(const SegmentError& error);

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_VALIDATE_SEGMENTS_H_
