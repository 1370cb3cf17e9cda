// The Backend conformance suite on the CUDA backend (label `gpu`; skips
// without a device).
#include "tests/server/backends/backend_conformance.h"

namespace tokensel::testing {

INSTANTIATE_TEST_SUITE_P(Cuda, BackendConformanceTest, ::testing::Values("cuda"));

}  // namespace tokensel::testing
