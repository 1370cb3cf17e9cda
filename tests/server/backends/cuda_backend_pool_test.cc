// What only the CUDA backend has: its workspace pool (label `gpu`; skips
// without a GPU, fails on a broken one; built only when this build has CUDA).
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_devices.h"
#include "tests/server/backends/backend_conformance.h"
#include "tests/testing/gpu_device.h"

namespace tokensel::testing {
namespace {

// SortTokens on [B, R] ids of S tokens with an inverse: an op that needs a
// device workspace (CUB's sort temporaries).
absl::Status RunSort(core::Backend& backend, int64_t B, int64_t R, int64_t S) {
  std::vector<int32_t> ids(static_cast<size_t>(B * R));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < R; ++r) ids[b * R + r] = static_cast<int32_t>(R - 1 - r);
  }
  StagedTensor t = StagedTensor::Upload(backend, ids, kernels::DType::kInt32, {B, R});
  StagedTensor inv =
      StagedTensor::Upload(backend, std::vector<int32_t>(B * S, 0), kernels::DType::kInt32, {B, S});
  kernels::SortTokensArgs args;
  args.ids = t.view();
  args.original_tokens = S;
  args.inverse = inv.view();
  return backend.Run(args);
}

TEST(CudaBackendPoolTest, WorkspacesAreReusedNotReallocated) {
  TOKENSEL_REQUIRE_GPU();
  const std::vector<core::DeviceDescription> devices = backends::ListCudaDevices();
  ASSERT_FALSE(devices.empty()) << "the CUDA runtime sees a device, ListCudaDevices none";
  absl::StatusOr<std::unique_ptr<backends::CudaBackend>> backend =
      backends::CudaBackend::Create(devices[0].uuid);
  ASSERT_OK(backend);
  backends::CudaBackend& cuda = **backend;

  ASSERT_OK(RunSort(cuda, 8, 512, 1024));
  const int64_t first = cuda.workspace_allocations();
  EXPECT_GE(cuda.cached_workspaces(), 1u) << "a released workspace goes back to the pool";
  for (int i = 0; i < 10; ++i) ASSERT_OK(RunSort(cuda, 8, 512, 1024));
  EXPECT_EQ(cuda.workspace_allocations(), first) << "same-size ops reuse the cached workspace";
  // A smaller op fits the cached workspace too.
  ASSERT_OK(RunSort(cuda, 2, 64, 128));
  EXPECT_EQ(cuda.workspace_allocations(), first);
  // A larger one needs one more allocation, then reuses it.
  ASSERT_OK(RunSort(cuda, 64, 2048, 4096));
  const int64_t grown = cuda.workspace_allocations();
  EXPECT_LE(grown, first + 1);
  ASSERT_OK(RunSort(cuda, 64, 2048, 4096));
  EXPECT_EQ(cuda.workspace_allocations(), grown);
}

}  // namespace
}  // namespace tokensel::testing
