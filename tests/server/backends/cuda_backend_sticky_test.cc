// A sticky CUDA error puts the CudaBackend's device out of service (label
// `gpu`; skips without a GPU). The fault poisons the CUDA context of the
// whole process, so the scenario runs in a child process of its own (a
// "threadsafe" death test re-executes this binary) and reports by exit code.
//
// Scenario: a GatherTokens whose activations point at an unmapped device
// address faults in the row copy (cudaErrorIllegalAddress). Then the op
// answers INTERNAL saying the device is out of service, healthy() is false,
// and a later op, staging and copy answer UNAVAILABLE without a CUDA call.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_devices.h"
#include "tests/testing/gpu_device.h"

namespace tokensel::testing {
namespace {

// Exits 0 when every step held, else 1 naming the first that did not.
[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "sticky scenario failed: %s\n", why.c_str());
  std::exit(1);
}

std::unique_ptr<core::Backend::Staging> Stage(core::Backend& b, const void* data, uint64_t n) {
  absl::StatusOr<std::unique_ptr<core::Backend::Staging>> s = b.AllocateStaging(n);
  if (!s.ok()) Fail("AllocateStaging: " + s.status().ToString());
  absl::Status copied = b.CopyToStaging(**s, data, n);
  if (!copied.ok()) Fail("CopyToStaging: " + copied.ToString());
  return *std::move(s);
}

[[noreturn]] void RunFaultScenario() {
  const std::vector<core::DeviceDescription> devices = backends::ListCudaDevices();
  if (devices.empty()) Fail("no device in the child");
  absl::StatusOr<std::unique_ptr<backends::CudaBackend>> created =
      backends::CudaBackend::Create(devices[0].uuid);
  if (!created.ok()) Fail("Create: " + created.status().ToString());
  backends::CudaBackend& cuda = **created;

  const float acts[6] = {0, 1, 2, 3, 4, 5};
  const int32_t idx[2] = {2, 0};
  const float zeros[4] = {0, 0, 0, 0};
  auto a = Stage(cuda, acts, sizeof(acts));
  auto i = Stage(cuda, idx, sizeof(idx));
  auto o = Stage(cuda, zeros, sizeof(zeros));
  kernels::GatherTokensArgs args;
  args.activations =
      kernels::TensorView::Contiguous(a->data(), kernels::DType::kFloat32, {1, 3, 2});
  args.indices = kernels::TensorView::Contiguous(i->data(), kernels::DType::kInt32, {1, 2});
  args.out = kernels::TensorView::Contiguous(o->data(), kernels::DType::kFloat32, {1, 2, 2});
  if (absl::Status ok = cuda.Run(args); !ok.ok()) Fail("a valid gather: " + ok.ToString());
  if (!cuda.healthy()) Fail("unhealthy after a valid op");

  // An address no allocation covers: the row copy faults.
  args.activations.data = reinterpret_cast<void*>(uintptr_t{1} << 40);
  const absl::Status faulted = cuda.Run(args);
  if (faulted.code() != absl::StatusCode::kInternal ||
      faulted.message().find("out of service") == absl::string_view::npos) {
    Fail("the faulting op: " + faulted.ToString());
  }
  if (cuda.healthy()) Fail("still healthy after " + faulted.ToString());

  args.activations.data = a->data();
  const absl::Status later = cuda.Run(args);
  if (later.code() != absl::StatusCode::kUnavailable) Fail("a later op: " + later.ToString());
  if (cuda.BeginRequest().status().code() != absl::StatusCode::kUnavailable) {
    Fail("a later request lease");
  }
  if (cuda.AllocateStaging(16).status().code() != absl::StatusCode::kUnavailable) {
    Fail("a later AllocateStaging");
  }
  float host[4];
  if (cuda.CopyFromStaging(host, *o, sizeof(host)).code() != absl::StatusCode::kUnavailable) {
    Fail("a later CopyFromStaging");
  }
  std::fprintf(stderr, "sticky scenario passed\n");
  std::_Exit(0);  // no destructors on the dead context
}

TEST(CudaBackendStickyTest, AnIllegalAddressPutsTheDeviceOutOfService) {
  TOKENSEL_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RunFaultScenario(), ::testing::ExitedWithCode(0), "sticky scenario passed");
}

}  // namespace
}  // namespace tokensel::testing
