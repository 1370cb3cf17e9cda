// Device-side validation of an index tensor (GatherTokens, ScatterTokens,
// GatherBertMask): every element in [0, limit), and with a bitmap, unique
// within its row. A bad element sets the op's status word and records its
// row-major linear index (status.cuh); the exact message comes later from the
// CPU oracle in <Op>Finish. Reads the indices only, and only from the op's
// snapshot in the workspace (snapshot.cuh), never from client memory: the
// copy kernel that follows reads the same snapshot, so every index it uses is
// one this kernel checked.
#ifndef TOKENSEL_KERNELS_CUDA_INDEX_CHECK_CUH_
#define TOKENSEL_KERNELS_CUDA_INDEX_CHECK_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/copy_kernels.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/gather_math.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda {

// One thread per index element (grid-stride). `bitmap` (rows *
// words_per_row words, zeroed) is null when uniqueness is not required:
// atomicOr returns the previous word, so of two equal indices of a row
// exactly one sees its bit already set.
// kRank (2 or 3) is the validated rank of `indices`; it lets the compiler fold
// RowOffset's loop over the leading dims.
template <int kRank, bool kUnique>
__global__ void __launch_bounds__(256)
    CheckIndicesKernel(const __grid_constant__ TensorView indices, int64_t rows, int64_t limit,
                       unsigned int* bitmap, int64_t words_per_row, Workspace ws) {
  const TensorView idx = WithRank<kRank>(indices);
  const int64_t n = idx.shape[kRank - 1];
  const int64_t total = rows * n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < total;
       linear += step) {
    const int64_t row = linear / n;
    const int64_t value = LoadIndex(idx, IndexOffset(idx, row, linear - row * n));
    if (value < 0 || value >= limit) {
      SetInvalid(ws, linear);
      continue;
    }
    if constexpr (kUnique) {
      const unsigned int bit = 1u << (value & 31);
      const unsigned int old = atomicOr(bitmap + row * words_per_row + (value >> 5), bit);
      if ((old & bit) != 0) SetInvalid(ws, linear);
    }
  }
}

// Enqueues the check of `indices` ([B,R] or [L,B,R]; uniqueness only for
// [B,R]), a snapshot view. With `bitmap` non-null (uniqueness), zeroes it
// first: rows * BitmapWordsPerRow(limit) words (workspace_layout.h).
inline absl::Status LaunchIndexCheck(const TensorView& indices, int64_t limit, unsigned int* bitmap,
                                     Workspace ws, Stream stream) {
  const int64_t rows = indices.NumRows();
  const int64_t total = rows * indices.shape[indices.rank - 1];
  if (total == 0) return absl::OkStatus();
  const absl::StatusOr<unsigned> grid = GridFor(total, 256);
  if (!grid.ok()) return grid.status();
  if (bitmap != nullptr) {
    const int64_t words = BitmapWordsPerRow(limit);
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(bitmap, 0, static_cast<size_t>(rows * words) * 4, stream));
    CheckIndicesKernel<2, true><<<*grid, 256, 0, stream>>>(indices, rows, limit, bitmap, words, ws);
  } else if (indices.rank == 2) {
    CheckIndicesKernel<2, false><<<*grid, 256, 0, stream>>>(indices, rows, limit, nullptr, 0, ws);
  } else {
    CheckIndicesKernel<3, false><<<*grid, 256, 0, stream>>>(indices, rows, limit, nullptr, 0, ws);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("CheckIndicesKernel");
  return absl::OkStatus();
}

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_INDEX_CHECK_CUH_
