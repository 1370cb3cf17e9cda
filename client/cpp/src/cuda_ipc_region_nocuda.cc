// CudaIpcRegion in builds without CUDA.
#include "absl/status/status.h"
#include "tokensel/client/cuda_ipc_region.h"

namespace tokensel::client {

bool CudaIpcRegion::BuiltWithCuda() { return false; }

absl::StatusOr<CudaIpcRegion> CudaIpcRegion::FromDevicePointer(const void* /*ptr*/,
                                                               uint64_t /*size*/) {
  return absl::FailedPreconditionError(
      "CudaIpcRegion: tokensel client built without CUDA; register host memory with "
      "SharedRegion instead");
}

}  // namespace tokensel::client
