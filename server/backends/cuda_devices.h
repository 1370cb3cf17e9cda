// CUDA devices visible to this process, as core::DeviceDescription. Built
// from kernels/cuda (cuda_devices.cc) when CUDA is compiled in; otherwise
// (cuda_devices_nocuda.cc) always empty.
#ifndef TOKENSEL_SERVER_BACKENDS_CUDA_DEVICES_H_
#define TOKENSEL_SERVER_BACKENDS_CUDA_DEVICES_H_

#include <vector>

#include "server/core/backend.h"

namespace tokensel::backends {

// Empty when there is no driver, no device, CUDA is not compiled in, or the
// query fails (the failure is logged).
std::vector<core::DeviceDescription> ListCudaDevices();

// Whether this build contains CUDA code (kernels/cuda).
bool CudaCompiledIn();

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_CUDA_DEVICES_H_
