#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/gpu_uuid.h"

namespace tokensel::kernels::cuda {

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  std::vector<DeviceInfo> devices;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return devices;
  }
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err)));
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    const cudaError_t e = cudaGetDeviceProperties(&prop, i);
    if (e != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cudaGetDeviceProperties(", i, "): ", cudaGetErrorString(e)));
    }
    devices.push_back(DeviceInfo{i, prop.name, FormatGpuUuid(prop.uuid.bytes),
                                 prop.major * 10 + prop.minor, prop.totalGlobalMem});
  }
  return devices;
}

}  // namespace tokensel::kernels::cuda
