// IndexSnapshot: a private copy of an index tensor that a client can rewrite.
//
// The server runs ops in place on client shared memory, and a hostile client
// rewrites its index buffer while an op runs. Any index that decides an
// address must therefore be read exactly once: ops copy the index tensor
// into a snapshot (each element read once, row by row, usually fused into the
// validation pass so the row is still in cache) and from then on check,
// report and use only the snapshot. The snapshot has the source's dtype and
// shape with row-major strides, so a linear index and an error message are
// the same whether computed on the source or on the snapshot.
//
// Threading: CopyRow() may run concurrently for distinct rows.
#ifndef TOKENSEL_KERNELS_CPU_SNAPSHOT_H_
#define TOKENSEL_KERNELS_CPU_SNAPSHOT_H_

#include <cstdint>
#include <cstring>
#include <memory>

#include "kernels/tensor_view.h"

namespace tokensel::kernels::cpu {

// Copies row `row` (the last dim; rows in row-major order of the leading
// dims) of the int32|int64 view `source` (validated) to `dst`, row-major,
// reading each element once.
inline void CopyIndexRow(const TensorView& source, int64_t row, char* dst) {
  const int64_t n = source.shape[source.rank - 1];
  if (n == 0) return;
  const int64_t elem = source.elem_size();
  const char* src = source.At(RowOffset(source, row));
  const int64_t stride = source.strides[source.rank - 1];
  if (stride == 1 || n == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n * elem));
  } else if (elem == 8) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * 8, src + i * stride * 8, 8);
  } else {
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * 4, src + i * stride * 4, 4);
  }
}

class IndexSnapshot {
 public:
  IndexSnapshot() = default;

  // Storage for a copy of `source` (an int32|int64 view that passed
  // CheckView); copies nothing yet. Allocates BytesFor(source) bytes.
  explicit IndexSnapshot(const TensorView& source) : source_(source) {
    view_ = TensorView::Contiguous(nullptr, source.dtype,
                                   absl::Span<const int64_t>(source.shape, source.rank));
    row_length_ = source.shape[source.rank - 1];
    const uint64_t bytes = BytesFor(source);
    if (bytes > 0) {
      storage_.reset(new char[bytes]);
      view_.data = storage_.get();
    }
  }

  // Heap bytes of the snapshot of `source` (metadata only; a view that
  // passed CheckView, so the product fits int64).
  static uint64_t BytesFor(const TensorView& source) {
    return static_cast<uint64_t>(source.NumElements()) *
           static_cast<uint64_t>(ElementSize(source.dtype));
  }

  // Copies row `row` of the source into the snapshot (CopyIndexRow).
  void CopyRow(int64_t row) const {
    if (row_length_ > 0) CopyIndexRow(source_, row, Row(row));
  }

  // The copy: same dtype and shape as the source, row-major strides.
  const TensorView& view() const { return view_; }

  // Start of row `row` of the copy.
  char* Row(int64_t row) const { return view_.At(row * row_length_); }

 private:
  TensorView source_;
  TensorView view_;
  int64_t row_length_ = 0;
  std::unique_ptr<char[]> storage_;
};

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_SNAPSHOT_H_
