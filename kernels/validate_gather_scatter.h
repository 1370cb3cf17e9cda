// Data-error messages of the token and mask gathers (GatherTokens,
// ScatterTokens, GatherBertMask), shared by the CPU operators and the CUDA
// twin so both return byte-identical text. Metadata validation is declared in
// kernels/ops.h (ValidateGatherTokens, ValidateScatterTokens,
// ValidateGatherBertMask, ValidateSliceGptMask).
//
// `linear` is the row-major linear index of the offending element of the
// index tensor: the first offending element, lowest row first, then lowest
// position within the row.
#ifndef TOKENSEL_KERNELS_VALIDATE_GATHER_SCATTER_H_
#define TOKENSEL_KERNELS_VALIDATE_GATHER_SCATTER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels {

// The field every index error names.
inline constexpr char kIndicesField[] = "indices";

// "indices[1,3] = 7 is out of range [0, 5)" (negative values included).
absl::Status TokenIndexOutOfRange(const TensorView& indices, int64_t linear, int64_t value,
                                  int64_t limit);

// ScatterTokens only: "indices[0,2] = 3 duplicates indices[0,0] (indices
// must be unique within a row)"; `first_linear` is the earlier occurrence.
absl::Status TokenIndexDuplicate(const TensorView& indices, int64_t linear, int64_t value,
                                 int64_t first_linear);

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_VALIDATE_GATHER_SCATTER_H_
