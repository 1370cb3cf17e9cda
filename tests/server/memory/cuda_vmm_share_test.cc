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
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/free_gate.h"
#include "server/memory/cuda_vmm_mapper.h"
#include "server/memory/sigbus_guard.h"
#include "tests/server/memory/fake_cuda_vmm_driver.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::StatusIs;
using FakeDriver = FakeCudaVmmDriver;

CudaVmmMapperOptions ShareOptions(uint64_t cap) { return FakeMapperOptions(cap); }

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
                       "cuda_vmm: a mapping: peer uid:1001 has 65536 mappings on device 0 live or "
                       "waiting for their deferred teardown, its share of 65536"));
  EXPECT_TRUE(OtherPeerMaps(mapper, driver, 4 * kMiB));  // not ASSERT: the gate must open
  OpenAndExpectClean(zero, driver);
  EXPECT_EQ(zero.reserved(), reserved);
  EXPECT_EQ(zero.reserved_by("uid:1001"), 0u);
}

// Device 0's gate with a 16 MiB byte limit (4 MiB per peer) for one test,
// and a mapper under a 64 MiB cap.
struct SmallByteLimit {
  SmallByteLimit() { zero.set_max_deferred_bytes(16 * kMiB); }
  ~SmallByteLimit() { zero.set_max_deferred_bytes(limit); }
  SmallByteLimit(const SmallByteLimit&) = delete;
  SmallByteLimit& operator=(const SmallByteLimit&) = delete;
  FakeDriver driver;
  CudaVmmMapper mapper{&driver, ShareOptions(64 * kMiB)};
  core::FreeGate& zero = core::FreeGate::ForDevice(0);
  const uint64_t limit = zero.max_deferred_bytes();
};

// The same for bytes: P's register / unregister churn behind its stuck wait
// queues teardowns whose bytes pass its share (a quarter of the gate's
// max_deferred_bytes): P is refused, Q maps.
TEST(CudaVmmShareTest, OnePeersChurnFillsOnlyItsShareOfTheDeferredBytes) {
  SmallByteLimit t;
  FakeDriver& driver = t.driver;
  CudaVmmMapper& mapper = t.mapper;
  core::FreeGate& zero = t.zero;
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
  EXPECT_EQ(zero.deferred_bytes_by("uid:1001"), 0u);
}

// Review2 of the seventh session, finding 1: the share was checked only
// when P reserved, and the gate's own limit counted every owner's queued
// bytes in full. P maps 5 x 4 MiB live (nothing queued: every check
// passes), closes device 0's gate with its own wait and drops them all:
// 20 MiB queued, more than the gate's 16 MiB. P's bytes count toward the
// gate's limit only up to its 4 MiB share: Q still maps; P is refused by
// its share.
TEST(CudaVmmShareTest, OnePeersLiveMappingsDroppedAtOnceRefuseOnlyThatPeer) {
  SmallByteLimit t;
  FakeDriver& driver = t.driver;
  CudaVmmMapper& mapper = t.mapper;
  core::FreeGate& zero = t.zero;
  std::vector<std::unique_ptr<core::MappedRegion>> live;
  for (int i = 0; i < 5; ++i) {
    core::FdRegionSpec p = WholeAllocation(driver, 4 * kMiB, 0);
    p.owner = "uid:1001";
    auto region = mapper.Map(p);
    ASSERT_TRUE(region.ok()) << region.status();
    live.push_back(*std::move(region));
  }
  zero.Enter();
  live.clear();
  EXPECT_EQ(zero.deferred_bytes(), 20 * kMiB);  // the true total
  EXPECT_EQ(zero.deferred_bytes_by("uid:1001"), 20 * kMiB);
  EXPECT_TRUE(OtherPeerMaps(mapper, driver, 4 * kMiB));  // not ASSERT: the gate must open
  core::FdRegionSpec p = WholeAllocation(driver, 2 * kMiB, 0);
  p.owner = "uid:1001";
  EXPECT_THAT(mapper.Map(p), StatusIs(StatusCode::kResourceExhausted,
                                      "peer uid:1001 has 20971520 bytes on device 0 waiting for "
                                      "their deferred teardown, more than its share of 4194304"));
  OpenAndExpectClean(zero, driver);
  EXPECT_EQ(zero.deferred_bytes_by("uid:1001"), 0u);
}

// Unowned teardowns (staging, tests) still count in full, and the shares
// follow set_max_deferred_bytes.
TEST(FreeGateShareTest, OwnersCountUpToTheirShareUnownedInFull) {
  core::FreeGate gate;
  gate.set_max_deferred_bytes(400);  // share 100
  auto nop = [](void*, intptr_t) { return true; };
  absl::StatusOr<uint64_t> p = gate.ReserveFor("test", "uid:1001");
  ASSERT_TRUE(p.ok()) << p.status();
  gate.Enter();
  gate.FreeOrDefer({nop, nullptr, 0, 1000, *p});  // counted: 100
  ASSERT_TRUE(gate.Reserve("unowned").ok());
  gate.FreeOrDefer({nop, nullptr, 0, 300, 0});  // counted: 400, not above
  EXPECT_EQ(gate.deferred_bytes(), 1300u);
  ASSERT_TRUE(gate.Reserve("unowned").ok());
  gate.FreeOrDefer({nop, nullptr, 0, 1, 0});  // counted: 401
  EXPECT_THAT(gate.Reserve("next"),
              StatusIs(StatusCode::kResourceExhausted, "has 401 bytes waiting"));
  gate.set_max_deferred_bytes(800);  // share 200: counted 501
  EXPECT_TRUE(gate.Reserve("next").ok());
  gate.Unreserve();
  gate.set_max_deferred_bytes(500);  // share 125: counted 426
  EXPECT_TRUE(gate.Reserve("next").ok());
  gate.Unreserve();
  gate.set_max_deferred_bytes(400);
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_EQ(gate.deferred_bytes(), 0u);
  EXPECT_EQ(gate.reserved(), 0u);
  ASSERT_TRUE(gate.Reserve("again").ok());  // nothing counted any more
  gate.Unreserve();
}

// Review2 of the seventh session, NIT 4: rooms count live registrations,
// and one peer may hold every buffer the registry allows (up to
// SigbusGuard::kCapacity, the largest --max_buffers_total) with nothing
// stuck; the share refused the 32769th. One more is its share's refusal.
TEST(FreeGateShareTest, OnePeerHoldsTheRegistrysLargestLimitLive) {
  core::FreeGate gate;
  uint64_t id = 0;
  for (size_t i = 0; i < SigbusGuard::kCapacity; ++i) {
    absl::StatusOr<uint64_t> room = gate.ReserveFor("a mapping", "uid:1001");
    ASSERT_TRUE(room.ok()) << i << ": " << room.status();
    id = *room;
  }
  EXPECT_EQ(gate.reserved_by("uid:1001"), SigbusGuard::kCapacity);
  static_assert(SigbusGuard::kCapacity == core::FreeGate::kMaxPendingPerOwner);
  EXPECT_THAT(gate.ReserveFor("a mapping", "uid:1001"),
              StatusIs(StatusCode::kResourceExhausted, "its share of 65536"));
  absl::StatusOr<uint64_t> other = gate.ReserveFor("a mapping", "uid:1002");
  ASSERT_TRUE(other.ok()) << other.status();  // the others' room stays
  gate.Unreserve(*other);
  for (size_t i = 0; i < SigbusGuard::kCapacity; ++i) gate.Unreserve(id);
  EXPECT_EQ(gate.reserved_by("uid:1001"), 0u);
}

}  // namespace
}  // namespace tokensel::memory
