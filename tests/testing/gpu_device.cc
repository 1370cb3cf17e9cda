// ProbeGpu for CUDA builds (see gpu_device.h for what counts as "no GPU").
#include "tests/testing/gpu_device.h"

#include <cuda_runtime_api.h>

#include <string>

namespace tokensel::testing {

GpuProbe ProbeGpu() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    const bool no_gpu = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
                        err == cudaErrorStubLibrary;
    return {no_gpu ? GpuProbe::State::kAbsent : GpuProbe::State::kBroken,
            std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " +
                cudaGetErrorString(err)};
  }
  if (count == 0) return {GpuProbe::State::kAbsent, "cudaGetDeviceCount found 0 devices"};
  return {GpuProbe::State::kPresent, ""};
}

}  // namespace tokensel::testing
