#include "server/backends/cpu_backend.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "server/backends/cuda_devices.h"
#include "server/backends/make_backend.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::backends {
namespace {

using tokensel::testing::StatusIs;

TEST(MakeBackendTest, CpuIsAlwaysAvailable) {
  absl::StatusOr<std::unique_ptr<core::Backend>> backend = MakeBackend("cpu", 3);
  ASSERT_OK(backend);
  EXPECT_EQ((*backend)->name(), "cpu");
  EXPECT_TRUE((*backend)->CanAccess(core::MemoryKind::kHost));
  EXPECT_FALSE((*backend)->CanAccess(core::MemoryKind::kCudaDevice));
  EXPECT_EQ(static_cast<CpuBackend&>(**backend).threads(), 3);
}

TEST(MakeBackendTest, AutoFallsBackToCpuWithoutACudaBackend) {
  // No build has a CUDA backend yet, so auto is the CPU backend everywhere.
  absl::StatusOr<std::unique_ptr<core::Backend>> backend = MakeBackend("auto", 1);
  ASSERT_OK(backend);
  EXPECT_EQ((*backend)->name(), "cpu");
}

TEST(MakeBackendTest, CudaIsFailedPreconditionNamingTheReason) {
  absl::StatusOr<std::unique_ptr<core::Backend>> backend = MakeBackend("cuda", 1);
  const char* reason = !CudaCompiledIn()           ? "built without CUDA"
                       : ListCudaDevices().empty() ? "no CUDA device"
                                                   : "not built yet";
  EXPECT_THAT(backend, StatusIs(absl::StatusCode::kFailedPrecondition, reason));
}

TEST(MakeBackendTest, UnknownKindsAndNegativeThreadsAreInvalid) {
  EXPECT_THAT(MakeBackend("gpu", 1), StatusIs(absl::StatusCode::kInvalidArgument, "'gpu'"));
  EXPECT_THAT(MakeBackend("", 1), StatusIs(absl::StatusCode::kInvalidArgument, "backend"));
  EXPECT_THAT(MakeBackend("cpu", -1), StatusIs(absl::StatusCode::kInvalidArgument, "threads"));
}

TEST(CpuBackendTest, StagingIsAlignedAndRoundTrips) {
  CpuBackend backend(1);
  for (uint64_t size : {0, 1, 63, 64, 1000}) {
    absl::StatusOr<std::unique_ptr<core::Backend::Staging>> staging = backend.AllocateStaging(size);
    ASSERT_OK(staging);
    EXPECT_NE((*staging)->data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*staging)->data()) % 64, 0u);
    EXPECT_EQ((*staging)->size(), size);
    std::string in(size, '\0');
    for (uint64_t i = 0; i < size; ++i) in[i] = static_cast<char>(i * 7 + 1);
    ASSERT_OK(backend.CopyToStaging(**staging, in.data(), size));
    std::string out(size, 'x');
    ASSERT_OK(backend.CopyFromStaging(out.data(), **staging, size));
    EXPECT_EQ(in, out);
  }
}

TEST(CpuBackendTest, CopiesBeyondTheStagingSizeAreRejected) {
  CpuBackend backend(1);
  std::unique_ptr<core::Backend::Staging> staging = *backend.AllocateStaging(16);
  char buf[32] = {};
  EXPECT_THAT(backend.CopyToStaging(*staging, buf, 17),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds the staging size"));
  EXPECT_THAT(backend.CopyFromStaging(buf, *staging, 32),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CpuBackendTest, HugeStagingIsResourceExhausted) {
  CpuBackend backend(1);
  EXPECT_THAT(backend.AllocateStaging(~uint64_t{0}),
              StatusIs(absl::StatusCode::kResourceExhausted, "staging"));
}

}  // namespace
}  // namespace tokensel::backends
