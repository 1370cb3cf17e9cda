// The Backend conformance suite: what every core::Backend implementation must
// do, whatever memory it runs on. Each implementation instantiates it once:
//
//   INSTANTIATE_TEST_SUITE_P(Cpu, BackendConformanceTest, ::testing::Values("cpu"));
//
// (backend_conformance_cpu_test.cc, label `server`; backend_conformance_cuda_test.cc,
// label `gpu`, skips without a device). Tensors live in the backend's own staging
// memory, so the same test drives host and device backends; expected values come
// from naive loops in the test.
#ifndef TOKENSEL_TESTS_SERVER_BACKENDS_BACKEND_CONFORMANCE_H_
#define TOKENSEL_TESTS_SERVER_BACKENDS_BACKEND_CONFORMANCE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "server/core/backend.h"

namespace tokensel::testing {

// "cpu" -> a CpuBackend with 2 threads; "cuda" -> a CudaBackend on the first
// device (FAILED_PRECONDITION without one: the suite skips).
absl::StatusOr<std::unique_ptr<core::Backend>> MakeConformanceBackend(const std::string& kind);

class BackendConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;
  core::Backend& backend() { return *backend_; }

 private:
  std::unique_ptr<core::Backend> backend_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_BACKENDS_BACKEND_CONFORMANCE_H_
