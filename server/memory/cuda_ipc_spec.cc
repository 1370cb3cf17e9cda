// Device-independent checks of a CudaIpcSpec, shared by the CUDA and the
// CPU-only builds of CudaIpcMapper.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "server/memory/cuda_ipc_mapper.h"

namespace tokensel::memory {

absl::Status ValidateCudaIpcSpec(const core::CudaIpcSpec& spec) {
  if (spec.handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc.handle is ", spec.handle.size(),
                                                   " bytes; a cudaIpcMemHandle_t is exactly ",
                                                   kCudaIpcHandleBytes));
  }
  if (spec.device_uuid.empty()) {
    return absl::InvalidArgumentError("cuda_ipc.device_uuid is empty");
  }
  if (spec.size == 0) return absl::InvalidArgumentError("cuda_ipc.size must be > 0");
  if (spec.size > UINT64_MAX - spec.offset) {
    return absl::OutOfRangeError(absl::StrCat("cuda_ipc.offset ", spec.offset, " + cuda_ipc.size ",
                                              spec.size, " overflows a 64-bit integer"));
  }
  return absl::OkStatus();
}

}  // namespace tokensel::memory
