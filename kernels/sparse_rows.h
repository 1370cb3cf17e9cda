// The one rule that decides how a row of unique ids in [0, limit) is checked
// (and, for SortTokens, sorted): with a bitmap of `limit` bits, or by sorting
// the row's n ids. Shared by the CPU ops (kernels/cpu/row_check.h,
// sort_tokens.cc, index_check.h) and the CUDA workspace layouts
// (kernels/cuda/workspace_layout.cc), so both backends take the same path for
// the same shape: a bitmap per row would let a tiny request (3 ids in
// [0, 2^31)) allocate and scan gigabytes, on the host or in device workspace.
#ifndef TOKENSEL_KERNELS_SPARSE_ROWS_H_
#define TOKENSEL_KERNELS_SPARSE_ROWS_H_

#include <cstdint>

namespace tokensel::kernels {

// Bitmap words allowed per id of a row before the sorting path is used.
inline constexpr int64_t kMaxBitmapWordsPerId = 16;

// True when a bitmap of `limit` bits (limit >= 0) would cost far more than
// sorting n ids: ceil(limit / 64) > 16 * max(n, 1), computed without
// overflow for every int64 limit and n.
constexpr bool PreferSortingToBitmap(int64_t n, int64_t limit) {
  const int64_t words = limit / 64 + (limit % 64 != 0);
  return (words - 1) / kMaxBitmapWordsPerId >= (n > 1 ? n : 1);
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_SPARSE_ROWS_H_
