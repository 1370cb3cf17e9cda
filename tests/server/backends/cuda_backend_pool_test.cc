// What only the CUDA backend has: its workspace pool (label `gpu`; skips
// without a GPU, fails on a broken one; built only when this build has CUDA).
#include <climits>
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

// SortTokens on [B, R] ids of S tokens: an op with a device workspace. Its
// size (kernels/cuda/workspace_layout.cc, SortTokensLayout) is a bitmap of
// ceil(S / 64) words per row, the rank table, and a snapshot of the ids
// (B * R * 4 bytes); the pool rounds allocations up to 1 MiB. Sparse rows
// (ceil(S / 64) > 16 R, kernels/sparse_rows.h) have no bitmap: the snapshot
// and one or two sorted copies of the ids. The inverse
// ([B, S] int32) is optional so that a huge S costs no host memory.
absl::Status RunSort(core::Backend& backend, int64_t B, int64_t R, int64_t S,
                     bool with_inverse = true) {
  std::vector<int32_t> ids(static_cast<size_t>(B * R));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < R; ++r) ids[b * R + r] = static_cast<int32_t>(R - 1 - r);
  }
  StagedTensor t = StagedTensor::Upload(backend, ids, kernels::DType::kInt32, {B, R});
  kernels::SortTokensArgs args;
  args.ids = t.view();
  args.original_tokens = S;
  StagedTensor inv;
  if (with_inverse) {
    inv = StagedTensor::Upload(backend, std::vector<int32_t>(B * S, 0), kernels::DType::kInt32,
                               {B, S});
    args.inverse = inv.view();
  }
  return backend.Run(args);
}

// Small: < 1 MiB of workspace (one granule). Large: a 4 MiB snapshot of
// 2^20 ids plus a 128 KiB bitmap, so 5 MiB: more than twice the small one.
absl::Status RunSmall(core::Backend& b) { return RunSort(b, 8, 512, 1024); }
absl::Status RunLarge(core::Backend& b) { return RunSort(b, 1, 1 << 20, 1 << 20, false); }

// A backend on the first device: skips without a GPU (TOKENSEL_REQUIRE_GPU:
// fails on a broken one, or on none when a GPU is required).
#define TOKENSEL_CUDA_BACKEND_OR_SKIP(name)                                                       \
  TOKENSEL_REQUIRE_GPU();                                                                         \
  const std::vector<core::DeviceDescription> name##_devices = backends::ListCudaDevices();        \
  ASSERT_FALSE(name##_devices.empty()) << "the CUDA runtime sees a device, ListCudaDevices none"; \
  absl::StatusOr<std::unique_ptr<backends::CudaBackend>> name##_or =                              \
      backends::CudaBackend::Create(name##_devices[0].uuid);                                      \
  ASSERT_OK(name##_or);                                                                           \
  backends::CudaBackend& name = **name##_or

TEST(CudaBackendPoolTest, WorkspacesAreReusedNotReallocated) {
  TOKENSEL_CUDA_BACKEND_OR_SKIP(cuda);
  ASSERT_OK(RunSmall(cuda));
  EXPECT_EQ(cuda.workspace_allocations(), 1);
  EXPECT_EQ(cuda.cached_workspaces(), 1u) << "a released workspace goes back to the pool";
  for (int i = 0; i < 10; ++i) ASSERT_OK(RunSmall(cuda));
  EXPECT_EQ(cuda.workspace_allocations(), 1) << "same-size ops reuse the cached workspace";
  ASSERT_OK(RunSort(cuda, 2, 64, 128));
  EXPECT_EQ(cuda.workspace_allocations(), 1) << "a smaller op fits the cached one";
  // A larger op needs one more allocation, then reuses it.
  ASSERT_OK(RunLarge(cuda));
  EXPECT_EQ(cuda.workspace_allocations(), 2);
  EXPECT_EQ(cuda.cached_workspaces(), 2u);
  ASSERT_OK(RunLarge(cuda));
  ASSERT_OK(RunSmall(cuda));
  EXPECT_EQ(cuda.workspace_allocations(), 2) << "each op takes the smallest block that fits";
}

TEST(CudaBackendPoolTest, ASmallOpDoesNotHoldALargeBlock) {
  TOKENSEL_CUDA_BACKEND_OR_SKIP(cuda);
  ASSERT_OK(RunLarge(cuda));
  EXPECT_EQ(cuda.workspace_allocations(), 1);
  // The cached 5 MiB block is more than twice the 1 MiB the small op
  // reserved: it allocates its own rather than hold the large one.
  ASSERT_OK(RunSmall(cuda));
  EXPECT_EQ(cuda.workspace_allocations(), 2);
  EXPECT_EQ(cuda.cached_workspaces(), 2u);
}

TEST(CudaBackendPoolTest, IdleWorkspacesBeyondTheCapAreFreed) {
  TOKENSEL_CUDA_BACKEND_OR_SKIP(cuda);
  ASSERT_OK(RunSmall(cuda));
  // S = 2^31 - 1 with 2^21 ids, the sparsest row that still takes the
  // bitmap path: a 256 MiB bitmap plus the rank table and an 8 MiB
  // snapshot, so an allocation above kMaxCachedWorkspaceBytes. Released
  // idle, it is freed at once (the largest block goes first); the small one
  // stays cached.
  ASSERT_OK(RunSort(cuda, 1, 1 << 21, INT32_MAX, false));
  EXPECT_EQ(cuda.workspace_allocations(), 2);
  EXPECT_EQ(cuda.cached_workspaces(), 1u) << "idle workspaces above the cap are freed";
  ASSERT_OK(RunSmall(cuda));
  EXPECT_EQ(cuda.workspace_allocations(), 2);
}

// Issue 12 item 5: [192, 3] ids with S = 2^31 - 1 took 48 GiB of bitmaps;
// the sparse path needs a few KiB, one granule.
TEST(CudaBackendPoolTest, SparseRowsNeedOneSmallWorkspace) {
  TOKENSEL_CUDA_BACKEND_OR_SKIP(cuda);
  ASSERT_OK(RunSort(cuda, 192, 3, INT32_MAX, false));
  ASSERT_OK(RunSort(cuda, 1, 1, INT32_MAX, false));
  EXPECT_EQ(cuda.workspace_allocations(), 1);
  EXPECT_EQ(cuda.cached_workspaces(), 1u);
}

#undef TOKENSEL_CUDA_BACKEND_OR_SKIP

}  // namespace
}  // namespace tokensel::testing
