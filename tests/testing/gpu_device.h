// Device detection shared by every test that needs a CUDA device (label
// `gpu`), so that all of them skip, and fail, for the same reasons:
//
//   void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
//
// - a device is present: the test runs;
// - there is no GPU here (cudaGetDeviceCount finds 0 devices or returns
//   cudaErrorNoDevice, cudaErrorInsufficientDriver (no driver loaded) or
//   cudaErrorStubLibrary (only the toolkit's stub libcuda), or this build has
//   no CUDA): the test skips with "no CUDA device: <reason>", or fails when
//   the environment says TOKENSEL_REQUIRE_GPU=1 (set it on a GPU machine:
//   a lost device must not turn the GPU suite into skips);
// - any other error (a broken driver, devices busy or unavailable, an
//   initialization error): the test fails with the CUDA error, whatever
//   TOKENSEL_REQUIRE_GPU says. A broken GPU machine is not a GPU-less one.
//
// Implemented in gpu_device.cc (CUDA builds, CUDA::cudart) and
// gpu_device_nocuda.cc (always "no GPU: built without CUDA"); link
// tokensel_gpu_device. No CUDA header here.
#ifndef TOKENSEL_TESTS_TESTING_GPU_DEVICE_H_
#define TOKENSEL_TESTS_TESTING_GPU_DEVICE_H_

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace tokensel::testing {

struct GpuProbe {
  enum class State { kPresent, kAbsent, kBroken };
  State state = State::kAbsent;
  // Absent/broken: what the runtime said, e.g. "cudaGetDeviceCount:
  // cudaErrorInsufficientDriver: CUDA driver version is insufficient ...".
  std::string detail;
};

// Asks the CUDA runtime once per call (cheap; clears the runtime's last error).
GpuProbe ProbeGpu();

// TOKENSEL_REQUIRE_GPU=1 in the environment.
inline bool GpuRequired() {
  const char* v = std::getenv("TOKENSEL_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace tokensel::testing

// In a test body or SetUp(): run, skip or fail as described above.
#define TOKENSEL_REQUIRE_GPU()                                                                 \
  do {                                                                                         \
    const ::tokensel::testing::GpuProbe tokensel_gpu_probe_ = ::tokensel::testing::ProbeGpu(); \
    using tokensel_gpu_state_ = ::tokensel::testing::GpuProbe::State;                          \
    if (tokensel_gpu_probe_.state == tokensel_gpu_state_::kBroken) {                           \
      GTEST_FAIL() << "CUDA device check failed (a broken driver or device, not a missing "    \
                      "GPU): "                                                                 \
                   << tokensel_gpu_probe_.detail;                                              \
    }                                                                                          \
    if (tokensel_gpu_probe_.state == tokensel_gpu_state_::kAbsent) {                           \
      if (::tokensel::testing::GpuRequired()) {                                                \
        GTEST_FAIL() << "TOKENSEL_REQUIRE_GPU=1 but no CUDA device: "                          \
                     << tokensel_gpu_probe_.detail;                                            \
      }                                                                                        \
      GTEST_SKIP() << "no CUDA device: " << tokensel_gpu_probe_.detail;                        \
    }                                                                                          \
  } while (false)

#endif  // TOKENSEL_TESTS_TESTING_GPU_DEVICE_H_
