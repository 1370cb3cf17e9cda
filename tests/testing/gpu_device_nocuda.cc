// ProbeGpu for builds without CUDA: never a device (gpu_device.h).
#include <string>

#include "tests/testing/gpu_device.h"

namespace tokensel::testing {

GpuProbe ProbeGpu() { return {GpuProbe::State::kAbsent, "this build has no CUDA (TOKENSEL_CUDA)"}; }

}  // namespace tokensel::testing
