// CudaVmmMapper's cap on mapped bytes is per device (cuda_vmm_mapper.h):
// register / unregister churn behind a stuck client wait on one device
// (its teardowns deferred, their bytes still counted) refuses new mappings
// on that device only (the fifth review's "VMM churn" item). Over the fake
// driver; descriptors are /dev/null, told to be NVIDIA's.
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdint>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/free_gate.h"
#include "server/memory/cuda_vmm_mapper.h"
#include "tests/server/memory/fake_cuda_vmm_driver.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::StatusIs;
using FakeDriver = FakeCudaVmmDriver;

CudaVmmMapperOptions ShareOptions(uint64_t cap) {
  CudaVmmMapperOptions options;
  options.device_uuids = {kGpu0, kGpu1};
  struct stat st;
  EXPECT_EQ(stat("/dev/null", &st), 0);
  options.nvidia_major = major(st.st_rdev);
  options.max_mapped_bytes_per_device = cap;
  return options;
}

// A whole allocation of `size` bytes on device `ordinal` (GPU 0 or 1),
// mapped whole (allocation_size stated).
core::FdRegionSpec WholeAllocation(FakeDriver& driver, uint64_t size, int ordinal) {
  core::FdRegionSpec spec;
  spec.fd = driver.AddAllocation(size, ordinal);
  EXPECT_GE(spec.fd->get(), 0);
  spec.kind = core::FdKind::kCudaVmm;
  spec.size = size;
  spec.allocation_size = size;
  spec.device_uuid = ordinal == 0 ? kGpu0 : kGpu1;
  return spec;
}

TEST(CudaVmmShareTest, DeferredTeardownsOnOneDeviceRefuseOnlyThatDevice) {
  FakeDriver driver;
  CudaVmmMapper mapper(&driver, ShareOptions(10 * kMiB));
  core::FreeGate& zero = core::FreeGate::ForDevice(0);
  zero.Enter();  // a stream of GPU 0 waits on a client's event
  // Churn on GPU 0: a mapping made and dropped; its teardown waits, its
  // bytes stay counted (GPU 0's share).
  auto a = mapper.Map(WholeAllocation(driver, 8 * kMiB, 0));
  ASSERT_TRUE(a.ok()) << a.status();
  a->reset();
  EXPECT_EQ(zero.deferred(), 1u);
  EXPECT_THAT(mapper.Map(WholeAllocation(driver, 4 * kMiB, 0)),
              StatusIs(StatusCode::kResourceExhausted, "(8388608 mapped now"));
  // GPU 1 has its own share: the whole cap.
  auto b = mapper.Map(WholeAllocation(driver, 8 * kMiB, 1));
  ASSERT_TRUE(b.ok()) << b.status();
  auto c = mapper.Map(WholeAllocation(driver, 2 * kMiB, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(mapper.Map(WholeAllocation(driver, 2 * kMiB, 1)),
              StatusIs(StatusCode::kResourceExhausted, "cap of 10485760"));
  b->reset();  // GPU 1's gate is open: torn down by its drainer
  c->reset();
  // The gate opens: the deferred teardown runs and GPU 0 maps again.
  zero.Leave();
  EXPECT_EQ(zero.AwaitDrained(absl::Seconds(10)), 0u);
  auto d = mapper.Map(WholeAllocation(driver, 10 * kMiB, 0));
  ASSERT_TRUE(d.ok()) << d.status();
  d->reset();
  AwaitVmmTeardowns();  // the teardowns run on the drainers; the driver outlives them
  EXPECT_TRUE(driver.Clean());
  EXPECT_EQ(driver.bad_calls, 0);
}

// The server's setting: a multiple of each device's memory (the fake's
// devices have 16 GiB), the lesser of it and the absolute cap.
TEST(CudaVmmShareTest, EachDevicesCapIsAMultipleOfItsMemory) {
  FakeDriver driver;
  CudaVmmMapperOptions options = ShareOptions(UINT64_MAX);
  options.mapped_device_memory_multiple = 1;
  CudaVmmMapper mapper(&driver, options);
  auto a = mapper.Map(WholeAllocation(driver, 12 * 1024 * kMiB, 0));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(mapper.Map(WholeAllocation(driver, 8 * 1024 * kMiB, 0)),
              StatusIs(StatusCode::kResourceExhausted, "cap of 17179869184 mapped VMM bytes"));
  auto b = mapper.Map(WholeAllocation(driver, 16 * 1024 * kMiB, 1));  // GPU 1's own
  ASSERT_TRUE(b.ok()) << b.status();
  options.max_mapped_bytes_per_device = 10 * 1024 * kMiB;  // the lesser
  CudaVmmMapper lesser(&driver, options);
  EXPECT_THAT(lesser.Map(WholeAllocation(driver, 12 * 1024 * kMiB, 0)),
              StatusIs(StatusCode::kResourceExhausted, "cap of 10737418240 mapped VMM bytes"));
  a->reset();
  b->reset();
  AwaitVmmTeardowns();  // the teardowns run on the drainers; the driver outlives them
  EXPECT_TRUE(driver.Clean());
  EXPECT_EQ(driver.bad_calls, 0);
}

}  // namespace
}  // namespace tokensel::memory
