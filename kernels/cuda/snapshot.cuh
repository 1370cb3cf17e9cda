// The snapshot kernel of the trust boundary (docs/gpu.md "Trust boundary"):
// copies a client index tensor (int32/int64, any rank, strides and
// alignment) once into a compact row-major section of the op's workspace, in
// the same dtype. Every later kernel of the op (checks, copies, sort) and the
// message of <Op>Finish read only that copy, so what was validated is what
// is used: a client that rewrites its indices while the op runs changes
// nothing the op does after the copy.
//
// The copy itself needs no care: it checks nothing, and each element is
// loaded and stored once, whatever the client writes meanwhile (a value torn
// by a concurrent write is still just one value, validated later). Reads
// stay inside the view (validated metadata); writes inside the section.
#ifndef TOKENSEL_KERNELS_CUDA_SNAPSHOT_CUH_
#define TOKENSEL_KERNELS_CUDA_SNAPSHOT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/copy_kernels.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/view_access.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda {

inline constexpr int kSnapshotThreads = 256;

// dst[i] = src[row-major element i], one thread per element (grid-stride).
// `aligned`: src's base is aligned to its element size (then every element
// is); otherwise byte-wise loads.
template <typename T>
__global__ void __launch_bounds__(kSnapshotThreads)
    SnapshotKernel(TensorView src, int64_t total, int64_t n, bool aligned, T* __restrict__ dst) {
  const int64_t last_stride = LastStride(src);
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    int64_t row;
    const int64_t pos = DivMod(i, n, &row);
    const int64_t offset = DeviceRowOffset(src, row) + pos * last_stride;
    dst[i] = static_cast<T>(LoadId(src, offset, aligned));
  }
}

// Enqueues the snapshot of `src` (an index view that passed its op's
// validation) into `dst` (SnapshotView(src, dst) afterwards views it;
// src.NumElements() * element size bytes). Nothing to do for an empty view.
inline absl::Status LaunchSnapshot(const TensorView& src, void* dst, Stream stream) {
  const int64_t total = src.NumElements();
  if (total == 0) return absl::OkStatus();
  const int64_t n = src.shape[src.rank - 1];
  const absl::StatusOr<unsigned> grid = GridFor(total, kSnapshotThreads);
  if (!grid.ok()) return grid.status();
  const bool aligned = ElementsAligned(src);
  if (src.dtype == DType::kInt64) {
    SnapshotKernel<int64_t><<<*grid, kSnapshotThreads, 0, stream>>>(src, total, n, aligned,
                                                                    static_cast<int64_t*>(dst));
  } else {
    SnapshotKernel<int32_t><<<*grid, kSnapshotThreads, 0, stream>>>(src, total, n, aligned,
                                                                    static_cast<int32_t*>(dst));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("SnapshotKernel");
  return absl::OkStatus();
}

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_SNAPSHOT_CUH_
