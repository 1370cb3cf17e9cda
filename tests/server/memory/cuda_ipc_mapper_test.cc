// CudaIpcMapper checks that need no device; they hold in every build (with
// or without CUDA, with or without a GPU), over a fake driver (IpcHandleOps)
// that counts its calls. Device tests: cuda_ipc_device_test.cc.
#include "server/memory/cuda_ipc_mapper.h"

#include <atomic>
#include <cstdint>
#include <new>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::StatusIs;

constexpr char kNoSuchUuid[] = "GPU-00000000-0000-0000-0000-000000000000";
constexpr char kServed[] = "GPU-11111111-2222-3333-4444-555555555555";

// Counts every driver call; opens succeed on the asked device.
class CountingIpcOps final : public IpcHandleOps {
 public:
  absl::StatusOr<Opened> Open(const std::string& /*handle*/, int device) override {
    ++opens;
    return Opened{arena, true, sizeof(arena), device};
  }
  void Close(void* /*base*/, int /*device*/) noexcept override { ++closes; }
  std::atomic<int> opens{0};
  std::atomic<int> closes{0};
  char arena[4096] = {};
};

// The gate of ServingOne's mappers: outlives every table and its closes.
core::FreeGate& ServingGate() {
  static core::FreeGate* gate = new core::FreeGate();
  return *gate;
}

// A mapper serving one device (ordinal 3, kServed) over `ops`.
CudaIpcMapperOptions ServingOne(CountingIpcOps* ops) {
  CudaIpcMapperOptions options;
  options.devices.push_back({3, kServed});
  options.ops = ops;
  options.gate_for = [](int) -> core::FreeGate& { return ServingGate(); };
  return options;
}

core::RegionSpec Spec(std::string handle, std::string uuid, uint64_t offset, uint64_t size) {
  return core::CudaIpcSpec{std::move(handle), std::move(uuid), offset, size};
}

TEST(CudaIpcMapperTest, HandleMustBeExactly64Bytes) {
  CudaIpcMapper mapper(CudaIpcMapperOptions{});
  EXPECT_THAT(mapper.Map(Spec(std::string(63, '\1'), kNoSuchUuid, 0, 16)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.handle is 63 bytes"));
  EXPECT_THAT(mapper.Map(Spec(std::string(65, '\1'), kNoSuchUuid, 0, 16)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.handle is 65 bytes"));
  EXPECT_THAT(mapper.Map(Spec("", kNoSuchUuid, 0, 16)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.handle is 0 bytes"));
}

TEST(CudaIpcMapperTest, MalformedFieldsAreRejectedBeforeAnyDeviceCheck) {
  CountingIpcOps ops;
  CudaIpcMapper mapper(ServingOne(&ops));
  const std::string handle(kCudaIpcHandleBytes, '\7');
  EXPECT_THAT(mapper.Map(Spec(handle, "", 0, 16)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.device_uuid"));
  EXPECT_THAT(mapper.Map(Spec(handle, kNoSuchUuid, 0, 0)),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.size"));
  EXPECT_THAT(mapper.Map(Spec(handle, kNoSuchUuid, UINT64_MAX - 7, 16)),
              StatusIs(StatusCode::kOutOfRange, "overflows"));
  EXPECT_EQ(mapper.open_handle_count(), 0u);
  EXPECT_EQ(ops.opens, 0);
}

// The sixth review: a handle was opened on any GPU the server sees (the
// backend's devices were checked after the open, which created a context
// there). A device the backend does not serve is FAILED_PRECONDITION naming
// the field and value, before any driver call.
TEST(CudaIpcMapperTest, ADeviceTheBackendDoesNotServeMakesNoDriverCall) {
  CountingIpcOps ops;
  CudaIpcMapper mapper(ServingOne(&ops));
  EXPECT_THAT(
      mapper.Map(Spec(std::string(kCudaIpcHandleBytes, '\7'), kNoSuchUuid, 0, 16)),
      StatusIs(StatusCode::kFailedPrecondition,
               absl::StrCat("cuda_ipc.device_uuid \"", kNoSuchUuid,
                            "\" is not a device of this server's backend (", kServed, ")")));
  EXPECT_EQ(ops.opens, 0);
  EXPECT_EQ(ops.closes, 0);
  EXPECT_EQ(mapper.open_handle_count(), 0u);
  // A mapper serving nothing (what a backend without CUDA devices would
  // give it) refuses every device.
  CudaIpcMapperOptions none;
  none.ops = &ops;
  CudaIpcMapper empty(std::move(none));
  EXPECT_THAT(empty.Map(Spec(std::string(kCudaIpcHandleBytes, '\7'), kServed, 0, 16)),
              StatusIs(StatusCode::kFailedPrecondition, "backend (none)"));
  EXPECT_EQ(ops.opens, 0);
  // The served device (any case of its UUID) is opened on its ordinal.
  absl::StatusOr<std::unique_ptr<core::MappedRegion>> region = mapper.Map(
      Spec(std::string(kCudaIpcHandleBytes, '\7'), absl::AsciiStrToLower(kServed), 16, 32));
  ASSERT_OK(region);
  EXPECT_EQ((*region)->device_uuid(), kServed);
  EXPECT_EQ((*region)->data(), ops.arena + 16);
  EXPECT_EQ(ops.opens, 1);
  region->reset();
  EXPECT_EQ(ServingGate().AwaitDrained(absl::Seconds(10)), 0u);  // closes run on its drainer
  EXPECT_EQ(ops.closes, 1);
}

// The sixth review: a reference leaked when the region's allocation threw
// after the table's reference was taken. The reference is now an RAII Ref
// the region owns: a throw there drops it, and the handle is closed.
TEST(CudaIpcMapperTest, AThrowWhereTheRegionIsMadeLeaksNoReference) {
  CountingIpcOps ops;
  CudaIpcMapperOptions options = ServingOne(&ops);
  options.region_hook = [] { throw std::bad_alloc(); };
  CudaIpcMapper mapper(std::move(options));
  EXPECT_THROW((void)mapper.Map(Spec(std::string(kCudaIpcHandleBytes, '\7'), kServed, 0, 16)),
               std::bad_alloc);
  EXPECT_EQ(ops.opens, 1);
  EXPECT_EQ(ServingGate().AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_EQ(ops.closes, 1);
  EXPECT_EQ(mapper.open_handle_count(), 0u);
}

TEST(CudaIpcMapperTest, HostDescriptorSpecIsInvalid) {
  auto mapper = MakeCudaIpcMapper({});
  ASSERT_NE(mapper, nullptr);
  EXPECT_THAT(mapper->Map(core::FdRegionSpec{nullptr, core::FdKind::kHostMemory, 0, 16}),
              StatusIs(StatusCode::kInvalidArgument, "host_shm"));
}

}  // namespace
}  // namespace tokensel::memory
