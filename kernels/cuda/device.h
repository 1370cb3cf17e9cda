// CUDA device discovery, usable from code that is not compiled by nvcc (this
// header includes no CUDA headers).
#ifndef TOKENSEL_KERNELS_CUDA_DEVICE_H_
#define TOKENSEL_KERNELS_CUDA_DEVICE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tokensel::kernels::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
  int compute_capability = 0;  // major*10 + minor
  size_t total_memory_bytes = 0;
};

// Devices visible to this process. An empty list (not an error) when the
// driver reports no device or no driver is installed.
absl::StatusOr<std::vector<DeviceInfo>> ListDevices();

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_DEVICE_H_
