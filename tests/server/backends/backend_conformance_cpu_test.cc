// The Backend conformance suite on the CPU backend (every build).
#include "tests/server/backends/backend_conformance.h"

namespace tokensel::testing {

INSTANTIATE_TEST_SUITE_P(Cpu, BackendConformanceTest, ::testing::Values("cpu"));

}  // namespace tokensel::testing
