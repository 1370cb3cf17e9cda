// TensorView: a non-owning strided view of host or device memory.
//
// Strides are in elements (like torch), one per dimension, and must be >= 0.
// Zero strides express broadcasting and are allowed for inputs only (outputs
// are checked to be non-self-overlapping). A view is trivially copyable so it
// can be passed by value to CUDA kernels.
//
// Nothing here dereferences `data`: the validation helpers in validate.h check
// shapes, strides and byte extents (overflow-safe) before any op forms a
// pointer from a view.
#ifndef TOKENSEL_KERNELS_TENSOR_VIEW_H_
#define TOKENSEL_KERNELS_TENSOR_VIEW_H_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "kernels/hd.h"

namespace tokensel::kernels {

// Largest rank any operator uses ([L,B,H,R,R] masks) plus headroom.
inline constexpr int kMaxRank = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};  // elements

  // Row-major (C-contiguous) view.
  static TensorView Contiguous(void* data, DType dtype, absl::Span<const int64_t> shape);
  static TensorView Contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
    return Contiguous(data, dtype, absl::Span<const int64_t>(shape.begin(), shape.size()));
  }
  // Explicit strides (elements); `strides.size()` must equal `shape.size()`.
  static TensorView Strided(void* data, DType dtype, absl::Span<const int64_t> shape,
                            absl::Span<const int64_t> strides);

  TOKENSEL_HD int64_t elem_size() const { return ElementSize(dtype); }
  // Product of the dims. Only meaningful once the view passed CheckView().
  int64_t NumElements() const;
  // Product of dims [0, rank-1): the number of "rows" of the last dimension.
  int64_t NumRows() const;
  // True when strides are exactly row-major for the shape (dims of size 1 and
  // empty tensors are contiguous whatever their strides).
  bool IsContiguous() const;
  // "[2,3,4]"; `StridesString()` likewise.
  std::string ShapeString() const;
  std::string StridesString() const;

  // Byte pointer of element `elem_offset` (an offset in elements, already
  // validated to lie inside the view).
  TOKENSEL_HD char* At(int64_t elem_offset) const {
    return static_cast<char*>(data) + elem_offset * ElementSize(dtype);
  }
};

// Element offset of row `row` of a view whose last dimension is the row: the
// leading `rank - 1` dimensions are unravelled in row-major order. This is the
// per-row mapping every op (CPU and CUDA) uses.
TOKENSEL_HD int64_t RowOffset(const TensorView& v, int64_t row) {
  int64_t offset = 0;
  for (int d = v.rank - 2; d >= 0; --d) {
    const int64_t n = v.shape[d];
    offset += (row % n) * v.strides[d];
    row /= n;
  }
  return offset;
}

// Element offset of the element with row-major linear index `linear`.
TOKENSEL_HD int64_t LinearToOffset(const TensorView& v, int64_t linear) {
  int64_t offset = 0;
  for (int d = v.rank - 1; d >= 0; --d) {
    const int64_t n = v.shape[d];
    offset += (linear % n) * v.strides[d];
    linear /= n;
  }
  return offset;
}

// Reads an int32 or int64 index element at element offset `elem_offset`.
// memcpy keeps it defined for index views at any alignment (compiles to one
// load when the address is aligned).
TOKENSEL_HD int64_t LoadIndex(const TensorView& v, int64_t elem_offset) {
  const char* p = static_cast<const char*>(v.data) + elem_offset * ElementSize(v.dtype);
  if (v.dtype == DType::kInt64) {
    int64_t value;
    memcpy(&value, p, sizeof(value));
    return value;
  }
  int32_t value;
  memcpy(&value, p, sizeof(value));
  return value;
}

// Writes an int32 or int64 index element (the value is known to fit).
TOKENSEL_HD void StoreIndex(const TensorView& v, int64_t elem_offset, int64_t value) {
  char* p = static_cast<char*>(v.data) + elem_offset * ElementSize(v.dtype);
  if (v.dtype == DType::kInt64) {
    memcpy(p, &value, sizeof(value));
  } else {
    const auto narrow = static_cast<int32_t>(value);
    memcpy(p, &narrow, sizeof(narrow));
  }
}

// "[1,0,2]": the multi-index of row-major linear index `linear` in `v`.
std::string FormatIndex(const TensorView& v, int64_t linear);

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_TENSOR_VIEW_H_
