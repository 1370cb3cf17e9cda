// The sparse-row path of SortTokens and ScatterTokens on the GPU: rows whose
// bitmap of S bits would dwarf their R ids (PreferSortingToBitmap(R, S),
// kernels/sparse_rows.h, the CPU twins' rule) are sorted by comparison in
// O(rows * R) workspace instead (layout: SparseSortLayout,
// workspace_layout.h; design and costs: docs/gpu.md, "Sparse rows").
//
// Host functions (no CUDA header here); they only enqueue work on `stream`:
// no host synchronization, no allocation, every launch checked (INTERNAL on a
// CUDA error). Every kernel reads ids only from the op's workspace (the
// snapshot and the sorted keys), never client memory.
#ifndef TOKENSEL_KERNELS_CUDA_SPARSE_SORT_H_
#define TOKENSEL_KERNELS_CUDA_SPARSE_SORT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/dtype.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda {

// Enqueues the sort of the l.rows rows of l.r ids (dtype int32 or int64) of
// the compact row-major snapshot at `snapshot` (workspace memory) into
// ws + l.sorted(), then their check: an id outside [0, limit) or equal to its
// predecessor in sorted order (a duplicate) sets the status word (no
// position hint: the message comes from the CPU oracle in <Op>Finish).
// Reads the snapshot, writes only l.keys; runs whatever the status word says
// (nothing before it validates). Nothing to do for an empty layout.
absl::Status LaunchSparseSortAndCheck(const SparseSortLayout& l, DType dtype, const void* snapshot,
                                      int64_t limit, Workspace ws, Stream stream);

// SortTokens, after LaunchSparseSortAndCheck: out[row, k] = k-th sorted id of
// the row and, with `inverse` ([rows, S] int32), inverse[row, :] = -1 and
// then inverse[row, id] = rank of id. Every kernel returns at once when the
// status word is set, so on invalid data nothing outside the workspace is
// written. `out` may be the client's ids (in place): only the keys are read.
absl::Status LaunchSparseSortWrite(const SparseSortLayout& l, Workspace ws, const TensorView& out,
                                   const TensorView* inverse, int64_t s, Stream stream);

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_SPARSE_SORT_H_
