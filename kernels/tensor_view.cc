#include "kernels/tensor_view.h"

#include <algorithm>
#include <cassert>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tokensel::kernels {

TensorView TensorView::Contiguous(void* data, DType dtype, absl::Span<const int64_t> shape) {
  assert(shape.size() <= static_cast<size_t>(kMaxRank));
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  // Saturating at the largest stride whose byte value fits int64 (CheckView
  // requires that of every stride): a stride can only get there when another
  // dim is 0 (callers check the byte size first), and an empty tensor's
  // strides are unused.
  const int64_t cap =
      std::numeric_limits<int64_t>::max() / std::max<int64_t>(ElementSize(dtype), 1);
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = stride;
    if (__builtin_mul_overflow(stride, shape[d] > 0 ? shape[d] : 1, &stride) || stride > cap) {
      stride = cap;
    }
  }
  return v;
}

TensorView TensorView::Strided(void* data, DType dtype, absl::Span<const int64_t> shape,
                               absl::Span<const int64_t> strides) {
  assert(shape.size() <= static_cast<size_t>(kMaxRank) && shape.size() == strides.size());
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  for (int d = 0; d < v.rank; ++d) {
    v.shape[d] = shape[d];
    v.strides[d] = strides[d];
  }
  return v;
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

int64_t TensorView::NumRows() const {
  int64_t n = 1;
  for (int d = 0; d + 1 < rank; ++d) n *= shape[d];
  return n;
}

bool TensorView::IsContiguous() const {
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 0) return true;
  }
  int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(absl::MakeConstSpan(shape, rank), ","), "]");
}

std::string TensorView::StridesString() const {
  return absl::StrCat("[", absl::StrJoin(absl::MakeConstSpan(strides, rank), ","), "]");
}

std::string FormatIndex(const TensorView& v, int64_t linear) {
  int64_t idx[kMaxRank] = {};
  for (int d = v.rank - 1; d >= 0; --d) {
    const int64_t n = v.shape[d] > 0 ? v.shape[d] : 1;
    idx[d] = linear % n;
    linear /= n;
  }
  return absl::StrCat("[", absl::StrJoin(absl::MakeConstSpan(idx, v.rank), ","), "]");
}

}  // namespace tokensel::kernels
