// Build without CUDA: there are never any devices.
#include "server/backends/cuda_devices.h"

namespace tokensel::backends {

std::vector<core::DeviceDescription> ListCudaDevices() { return {}; }

bool CudaCompiledIn() { return false; }

}  // namespace tokensel::backends
