// Data-error messages of SortTokens, shared by the CPU and CUDA paths so both
// report the same text. (Metadata validation: ValidateSortTokens in ops.h.)
#ifndef TOKENSEL_KERNELS_VALIDATE_SORT_H_
#define TOKENSEL_KERNELS_VALIDATE_SORT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels {

// The first offending element of a SortTokens row: the lowest position whose
// id is outside [0, S) or equals an id at an earlier position of the row.
struct SortIdError {
  int64_t row = -1;             // row of `ids` (all leading dims, row-major)
  int64_t position = -1;        // position within the row
  int64_t value = 0;            // the id found there
  int64_t first_position = -1;  // earlier position holding `value`, or -1 (out of range)
};

// INVALID_ARGUMENT naming "ids", the element's multi-index and value, e.g.
//   "ids[0,1,2] = 3 duplicates ids[0,1,0] (indices must be unique within a row)"
//   "ids[1] = 5 is out of range [0, 5)"
absl::Status SortIdStatus(const TensorView& ids, int64_t original_tokens, const SortIdError& e);

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_VALIDATE_SORT_H_
