#include "server/backends/cuda_devices.h"

#include <utility>

#include "common/log.h"
#include "kernels/cuda/device.h"

namespace tokensel::backends {

std::vector<core::DeviceDescription> ListCudaDevices() {
  absl::StatusOr<std::vector<kernels::cuda::DeviceInfo>> devices = kernels::cuda::ListDevices();
  if (!devices.ok()) {
    TS_LOG(WARNING) << "listing CUDA devices failed: " << devices.status();
    return {};
  }
  std::vector<core::DeviceDescription> out;
  out.reserve(devices->size());
  for (kernels::cuda::DeviceInfo& d : *devices) {
    core::DeviceDescription desc;
    desc.ordinal = d.ordinal;
    desc.uuid = std::move(d.uuid);
    desc.name = std::move(d.name);
    desc.compute_capability = d.compute_capability;
    desc.total_memory_bytes = d.total_memory_bytes;
    out.push_back(std::move(desc));
  }
  return out;
}

bool CudaCompiledIn() { return true; }

}  // namespace tokensel::backends
