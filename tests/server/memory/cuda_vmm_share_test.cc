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

#include "absl/strings/match.h"
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

// The stuck wait passes: every teardown runs, nothing is left.
void OpenAndExpectClean(core::FreeGate& gate, FakeDriver& driver) {
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(absl::Seconds(60)), 0u);
  AwaitVmmTeardowns();
  EXPECT_TRUE(driver.Clean());
  EXPECT_EQ(driver.bad_calls, 0);
}

// Peer Q maps `bytes` on GPU 0 (while P is refused there) and drops it;
// returns whether it could.
bool OtherPeerMaps(CudaVmmMapper& mapper, FakeDriver& driver, uint64_t bytes) {
  core::FdRegionSpec q = WholeAllocation(driver, bytes, 0);
  q.owner = "uid:1002";
  auto mapped = mapper.Map(q);
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  if (mapped.ok()) {
    EXPECT_EQ(core::FreeGate::ForDevice(0).reserved_by("uid:1002"), 1u);
  }
  return mapped.ok();
}

// The seventh review's item 2b: peer P holds device 0's gate closed (its own
// wait never recorded) and sends Maps that fail after the gate's room was
// taken and an allocation imported (past the mapped-bytes cap): each queues
// a teardown that holds a room until the gate opens. Past its share
// (kMaxPendingPerOwner) only P is refused, naming P, its count and the
// limit; peer Q still maps on device 0.
TEST(CudaVmmShareTest, OnePeersFailingMapsFillOnlyItsShareOfTheGate) {
  FakeDriver driver;
  CudaVmmMapper mapper(&driver, ShareOptions(64 * kMiB));
  core::FreeGate& zero = core::FreeGate::ForDevice(0);
  const size_t reserved = zero.reserved();
  zero.Enter();
  core::FdRegionSpec p = WholeAllocation(driver, 128 * kMiB, 0);  // past the cap
  p.owner = "uid:1001";
  constexpr size_t kShare = core::FreeGate::kMaxPendingPerOwner;
  // P goes on until it is refused otherwise (without shares: at the gate's
  // limit, which then refuses Q too).
  size_t failed = 0;
  absl::Status refused;
  while (failed <= core::FreeGate::kMaxPending) {
    refused = mapper.Map(p).status();
    if (!absl::StrContains(refused.message(), "cap of 67108864")) break;
    ++failed;
  }
  EXPECT_EQ(failed, kShare);
  EXPECT_EQ(zero.reserved_by("uid:1001"), kShare);
  EXPECT_THAT(refused,
              StatusIs(StatusCode::kResourceExhausted,
                       "cuda_vmm: a mapping: peer uid:1001 has 32768 mappings on device 0 live or "
                       "waiting for their deferred teardown, its share of 32768"));
  EXPECT_TRUE(OtherPeerMaps(mapper, driver, 4 * kMiB));  // not ASSERT: the gate must open
  OpenAndExpectClean(zero, driver);
  EXPECT_EQ(zero.reserved(), reserved);
  EXPECT_EQ(zero.reserved_by("uid:1001"), 0u);
}

// The same for bytes: P's register / unregister churn behind its stuck wait
// queues teardowns whose bytes pass its share (a quarter of the gate's
// max_deferred_bytes): P is refused, Q maps.
TEST(CudaVmmShareTest, OnePeersChurnFillsOnlyItsShareOfTheDeferredBytes) {
  FakeDriver driver;
  CudaVmmMapper mapper(&driver, ShareOptions(64 * kMiB));
  core::FreeGate& zero = core::FreeGate::ForDevice(0);
  const uint64_t limit = zero.max_deferred_bytes();
  zero.set_max_deferred_bytes(16 * kMiB);  // 4 MiB per peer
  zero.Enter();
  // P churns until it is refused (without shares: at the gate's limit,
  // which then refuses Q too).
  int cycles = 0;
  absl::Status refused;
  while (cycles < 32) {
    core::FdRegionSpec p = WholeAllocation(driver, 2 * kMiB, 0);
    p.owner = "uid:1001";
    auto region = mapper.Map(p);
    if (!region.ok()) {
      refused = region.status();
      break;
    }
    region->reset();
    ++cycles;
  }
  EXPECT_EQ(cycles, 3);
  EXPECT_EQ(zero.deferred_bytes_by("uid:1001"), 6 * kMiB);
  EXPECT_THAT(refused, StatusIs(StatusCode::kResourceExhausted,
                                "peer uid:1001 has 6291456 bytes on device 0 waiting for "
                                "their deferred teardown, more than its share of 4194304"));
  EXPECT_TRUE(OtherPeerMaps(mapper, driver, 2 * kMiB));  // not ASSERT: the gate must open
  OpenAndExpectClean(zero, driver);
  zero.set_max_deferred_bytes(limit);
  EXPECT_EQ(zero.deferred_bytes_by("uid:1001"), 0u);
}

}  // namespace
}  // namespace tokensel::memory
