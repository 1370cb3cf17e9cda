// CudaIpcMapper checks that need no device; they hold in every build (with
// or without CUDA, with or without a GPU). Device tests:
// cuda_ipc_device_test.cc.
#include "server/memory/cuda_ipc_mapper.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::StatusIs;

constexpr char kNoSuchUuid[] = "GPU-00000000-0000-0000-0000-000000000000";

core::RegionSpec Spec(std::string handle, std::string uuid, uint64_t offset, uint64_t size) {
  return core::CudaIpcSpec{std::move(handle), std::move(uuid), offset, size};
}

TEST(CudaIpcMapperTest, HandleMustBeExactly64Bytes) {
  CudaIpcMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(std::string(63, '\1'), kNoSuchUuid, 0, 16)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.handle is 63 bytes"));
  EXPECT_THAT(mapper.Map(Spec(std::string(65, '\1'), kNoSuchUuid, 0, 16)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.handle is 65 bytes"));
  EXPECT_THAT(mapper.Map(Spec("", kNoSuchUuid, 0, 16)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.handle is 0 bytes"));
}

TEST(CudaIpcMapperTest, MalformedFieldsAreRejectedBeforeAnyDeviceCheck) {
  CudaIpcMapper mapper;
  const std::string handle(kCudaIpcHandleBytes, '\7');
  EXPECT_THAT(mapper.Map(Spec(handle, "", 0, 16)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.device_uuid"));
  EXPECT_THAT(mapper.Map(Spec(handle, kNoSuchUuid, 0, 0)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.size"));
  EXPECT_THAT(mapper.Map(Spec(handle, kNoSuchUuid, UINT64_MAX - 7, 16)),
              StatusIs(StatusCode::kOutOfRange, "overflows"));
  EXPECT_EQ(mapper.open_handle_count(), 0u);
}

TEST(CudaIpcMapperTest, WellFormedSpecForAnUnknownDeviceIsFailedPrecondition) {
  // Without CUDA, without a GPU, or with GPUs none of which has this UUID:
  // FAILED_PRECONDITION in every case, and nothing is opened.
  CudaIpcMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(std::string(kCudaIpcHandleBytes, '\7'), kNoSuchUuid, 0, 16)),
              StatusIs(StatusCode::kFailedPrecondition, "cuda_ipc"));
  EXPECT_EQ(mapper.open_handle_count(), 0u);
}

TEST(CudaIpcMapperTest, HostDescriptorSpecIsInvalid) {
  auto mapper = MakeCudaIpcMapper();
  ASSERT_NE(mapper, nullptr);
  EXPECT_THAT(mapper->Map(core::FdRegionSpec{nullptr, core::FdKind::kHostMemory, 0, 16}),
              StatusIs(StatusCode::kInvalidArgument, "host_shm"));
}

}  // namespace
}  // namespace tokensel::memory
