// Metadata validation shared by every op and by the server: shapes, dtypes,
// strides, byte extents and overlap. Nothing here reads tensor data.
//
// Messages name the field as the API spells it ("indices", "out", ...) and the
// offending dimension and value, e.g.
//   "indices: dim 0 (B) is 3, expected 2 (activations B)".
// All arithmetic is overflow-checked: a view whose extent does not fit in
// int64 bytes is INVALID_ARGUMENT before any pointer is formed.
#ifndef TOKENSEL_KERNELS_VALIDATE_H_
#define TOKENSEL_KERNELS_VALIDATE_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels {

// Byte range [begin, end) relative to view.data covered by the view's
// elements. Empty views have begin == end == 0.
struct ByteExtent {
  int64_t begin = 0;
  int64_t end = 0;
};

// Rank in [1, kMaxRank], every dim >= 0, every stride >= 0, element count and
// byte extent representable in int64, data non-null when non-empty.
absl::Status CheckView(const TensorView& v, absl::string_view field);
// CheckView + exact rank.
absl::Status CheckView(const TensorView& v, absl::string_view field, int rank);

// Overflow-checked extent of a view that passed CheckView.
absl::StatusOr<ByteExtent> ComputeExtent(const TensorView& v, absl::string_view field);

absl::Status CheckDType(const TensorView& v, absl::string_view field,
                        std::initializer_list<DType> allowed);
absl::Status CheckIndexDType(const TensorView& v, absl::string_view field);
// v.dtype == other.dtype, naming both fields.
absl::Status CheckSameDType(const TensorView& v, absl::string_view field, const TensorView& other,
                            absl::string_view other_field);

// v.shape[axis] == expected. `dim_name` is the spec's letter ("B", "R", ...),
// `source` explains where `expected` came from ("activations B").
absl::Status CheckDim(const TensorView& v, absl::string_view field, int axis,
                      absl::string_view dim_name, int64_t expected, absl::string_view source);

// An output must not write an element twice: no two index tuples of the view
// may map to the same bytes (checked by sorting dims by stride).
absl::Status CheckNonOverlapping(const TensorView& v, absl::string_view field);

// The byte ranges of `out` and `in` must be disjoint. Conservative for
// interleaved views of one buffer (treated as overlapping).
absl::Status CheckDisjoint(const TensorView& out, absl::string_view out_field, const TensorView& in,
                           absl::string_view in_field);

// Data-error messages, shared by the CPU and CUDA paths so both report the
// same text. `linear` is the row-major linear index of the element in `v`.
absl::Status IndexOutOfRange(const TensorView& v, absl::string_view field, int64_t linear,
                             int64_t value, int64_t limit);
absl::Status DuplicateIndex(const TensorView& v, absl::string_view field, int64_t linear,
                            int64_t value, int64_t first_linear);

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_VALIDATE_H_
