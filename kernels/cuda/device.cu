#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace tokensel::kernels::cuda {
namespace {

std::string FormatUuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char buf[64];
  std::snprintf(buf, sizeof(buf),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return buf;
}

}  // namespace

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
    devices.push_back(DeviceInfo{i, prop.name, FormatUuid(prop.uuid), prop.major * 10 + prop.minor,
                                 prop.totalGlobalMem});
  }
  return devices;
}

}  // namespace tokensel::kernels::cuda
