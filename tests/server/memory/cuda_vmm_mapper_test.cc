// CudaVmmMapper over a fake CudaVmmDriver: the import / map / set-access
// sequence, its checks and its cleanup, with no GPU. The fake counts every
// acquire and release (handles, reservations, mappings), refuses what the
// real driver refuses (a map past the allocation or not granularity-aligned,
// freeing a still-mapped range, releasing twice), and can fail any step.
// Descriptors: the tests cannot make an NVIDIA descriptor, so the mapper is
// told /dev/null's major (1) is NVIDIA's; fake allocations are keyed by the
// descriptor's number.
#include "server/memory/cuda_vmm_mapper.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/buffer_registry.h"
#include "server/core/free_gate.h"
#include "tests/server/memory/fake_cuda_vmm_driver.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::StatusIs;
using FakeDriver = FakeCudaVmmDriver;

class CudaVmmMapperTest : public ::testing::Test {
 protected:
  CudaVmmMapperTest() : mapper_(&driver_, Options()) {}
  ~CudaVmmMapperTest() override { AwaitVmmTeardowns(); }  // the driver outlives them
  bool Clean() {
    AwaitVmmTeardowns();
    return driver_.Clean();
  }

  // The backend's devices: GPUs 0 and 1 (the driver also sees GPU 2).
  static CudaVmmMapperOptions Options() {
    CudaVmmMapperOptions options;
    options.device_uuids = {kGpu0, kGpu1};
    options.nvidia_major = major(DevNullRdev());
    return options;
  }

  static dev_t DevNullRdev() {
    struct stat st;
    EXPECT_EQ(stat("/dev/null", &st), 0);
    return st.st_rdev;
  }
  // A "VMM descriptor" (/dev/null) standing for an allocation of `size`
  // bytes on device `ordinal`.
  core::FdRegionSpec Allocation(uint64_t size, int ordinal, uint64_t offset, uint64_t length,
                                const std::string& uuid) {
    core::FdRegionSpec spec;
    spec.fd = driver_.AddAllocation(size, ordinal);
    EXPECT_GE(spec.fd->get(), 0);
    spec.kind = core::FdKind::kCudaVmm;
    spec.offset = offset;
    spec.size = length;
    spec.device_uuid = uuid;
    return spec;
  }

  FakeDriver driver_;
  CudaVmmMapper mapper_;
};

TEST_F(CudaVmmMapperTest, MapsFromOffsetZeroInWholeGranulesOnTheNamedDevice) {
  // A tensor at offset 3 MiB + 256 of a 10 MiB allocation on GPU 1.
  const uint64_t offset = 3 * kMiB + 256, size = 4 * kMiB + 100;
  core::FdRegionSpec spec = Allocation(10 * kMiB, 1, offset, size, kGpu1);
  {
    auto region = mapper_.Map(spec);
    ASSERT_TRUE(region.ok()) << region.status();
    ASSERT_EQ(driver_.mapped.size(), 1u);
    const uint64_t va = driver_.mapped.begin()->first;
    // offset + size = 7 MiB + 356 -> 4 granules of 2 MiB, from offset 0.
    EXPECT_EQ(driver_.mapped.begin()->second.first, 8 * kMiB);
    EXPECT_EQ(driver_.mapped.begin()->second.second, 1);
    EXPECT_EQ(driver_.access_device.at(va), 1);  // read-write for that device only
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*region)->data()), va + offset);
    EXPECT_EQ((*region)->size(), size);
    EXPECT_EQ((*region)->memory_kind(), core::MemoryKind::kCudaDevice);
    EXPECT_EQ((*region)->device_uuid(), kGpu1);
    EXPECT_EQ(driver_.handles.size(), 1u);
    EXPECT_EQ(driver_.handle_device.begin()->second, 1);  // imported on the named device
    driver_.calls.clear();
  }
  // Destroying the region gives back everything, in reverse order.
  EXPECT_TRUE(Clean());
  EXPECT_THAT(driver_.calls, ::testing::ElementsAre("unmap", "free", "release"));
  EXPECT_EQ(driver_.bad_calls, 0);
}

// cuMemUnmap / cuMemRelease may synchronize the device: while a stream of
// the device waits on a client's event (its FreeGate closed) the region's
// teardown is deferred, its bytes still counted, until the gate opens; the
// gate's drainer runs it then.
TEST_F(CudaVmmMapperTest, TeardownWaitsForTheFreeGate) {
  core::FdRegionSpec spec = Allocation(4 * kMiB, 0, 0, kMiB, kGpu0);
  core::FreeGate& gate = core::FreeGate::ForDevice(0);
  const size_t reserved = gate.reserved();
  auto region = mapper_.Map(spec);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(gate.reserved(), reserved + 1);  // room for its teardown
  driver_.calls.clear();
  gate.Enter();
  region->reset();
  EXPECT_TRUE(driver_.calls.empty());
  EXPECT_EQ(driver_.mapped.size(), 1u);
  EXPECT_EQ(gate.deferred(), 1u);
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_TRUE(Clean());
  EXPECT_THAT(driver_.calls, ::testing::ElementsAre("unmap", "free", "release"));
  EXPECT_EQ(driver_.bad_calls, 0);
  EXPECT_EQ(gate.reserved(), reserved);
}

// The review's items 1 and 2: the gate is the mapping's device's. A stuck
// client wait on GPU 0 does not hold back the teardown of a GPU 1 mapping;
// and a map that fails gives its room back.
TEST_F(CudaVmmMapperTest, ATeardownWaitsOnlyForItsOwnDevicesGate) {
  core::FreeGate& zero = core::FreeGate::ForDevice(0);
  core::FreeGate& one = core::FreeGate::ForDevice(1);
  const size_t reserved = one.reserved();
  auto region = mapper_.Map(Allocation(4 * kMiB, 1, 0, kMiB, kGpu1));
  ASSERT_TRUE(region.ok()) << region.status();
  driver_.calls.clear();
  zero.Enter();
  region->reset();
  EXPECT_TRUE(Clean());
  EXPECT_THAT(driver_.calls, ::testing::ElementsAre("unmap", "free", "release"));
  EXPECT_EQ(one.reserved(), reserved);
  zero.Leave();
  // A map that fails (cuMemMap refuses) holds no room.
  core::FdRegionSpec spec = Allocation(4 * kMiB, 1, 0, kMiB, kGpu1);
  driver_.FailAt(FakeDriver::kMap, -1);
  EXPECT_FALSE(mapper_.Map(spec).ok());
  EXPECT_TRUE(Clean());
  EXPECT_EQ(one.reserved(), reserved);
}

// A Map that fails part way (imported, reserved, cuMemMap refused) while
// the device's gate is closed: its partial teardown is deferred like a
// region's, never run on the request thread behind a client's wait (the
// sixth review's item 1).
TEST_F(CudaVmmMapperTest, AFailedMapsTeardownWaitsForTheFreeGate) {
  core::FreeGate& gate = core::FreeGate::ForDevice(0);
  const size_t reserved = gate.reserved();
  core::FdRegionSpec spec = Allocation(4 * kMiB, 0, 0, kMiB, kGpu0);
  driver_.FailAt(FakeDriver::kMap, -1);
  driver_.calls.clear();
  gate.Enter();
  EXPECT_FALSE(mapper_.Map(spec).ok());
  for (const std::string& call : driver_.calls) {
    EXPECT_TRUE(call != "unmap" && call != "free" && call != "release") << call << " ran inline";
  }
  EXPECT_EQ(gate.deferred(), 1u);
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
  EXPECT_EQ(gate.reserved(), reserved);
}

// The seventh review's item 2a: a Map refused before anything of the
// device was acquired (its first import fails) gives its room back at once:
// no no-op entry holds the gate's room until the gate opens, so failing
// Maps behind a stuck wait cannot fill device k's room for every tenant.
TEST_F(CudaVmmMapperTest, AMapFailingBeforeAnyImportGivesItsRoomBackAtOnce) {
  core::FreeGate& gate = core::FreeGate::ForDevice(0);
  const size_t reserved = gate.reserved();
  driver_.FailAt(FakeDriver::kImport, -1);
  gate.Enter();  // a stuck wait on device 0
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)).ok());
  }
  EXPECT_EQ(gate.deferred(), 0u);
  EXPECT_EQ(gate.reserved(), reserved);
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
}

// The sixth review: teardowns queued behind a stuck wait keep memory
// mapped with no byte bound. Past the device gate's max_deferred_bytes a
// new mapping on that device is RESOURCE_EXHAUSTED naming the limit and the
// device (nothing imported); other devices map; it passes again once the
// teardowns ran.
TEST_F(CudaVmmMapperTest, DeferredTeardownBytesPastTheLimitRefuseNewMappingsThere) {
  core::FreeGate& zero = core::FreeGate::ForDevice(0);
  zero.set_max_deferred_bytes(3 * kMiB);
  zero.Enter();
  for (int i = 0; i < 2; ++i) {  // each maps one 2 MiB granule
    auto region = mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, kGpu0));
    ASSERT_TRUE(region.ok()) << region.status();
    region->reset();
  }
  EXPECT_EQ(zero.deferred_bytes(), 4 * kMiB);
  driver_.calls.clear();
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)),
              StatusIs(StatusCode::kResourceExhausted,
                       "cuda_vmm: a mapping: device 0 has 4194304 bytes waiting for their "
                       "deferred teardown, more than the limit of 3145728"));
  EXPECT_THAT(driver_.calls, ::testing::Not(::testing::Contains("import")));
  auto other = mapper_.Map(Allocation(4 * kMiB, 1, 0, kMiB, kGpu1));
  EXPECT_TRUE(other.ok()) << other.status();
  other = absl::InternalError("dropped");
  zero.Leave();
  EXPECT_TRUE(Clean());
  EXPECT_TRUE(mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)).ok());
  zero.set_max_deferred_bytes(core::FreeGate::kDefaultMaxDeferredBytes);
  EXPECT_TRUE(Clean());
}

// The granule is the imported allocation's own (its properties from the
// handle), not one made up for the device: an allocation of 8 MiB granules
// on a device whose default is 2 MiB maps in 8 MiB granules.
TEST_F(CudaVmmMapperTest, TheGranuleIsTheAllocationsOwn) {
  core::FdRegionSpec spec = Allocation(16 * kMiB, 0, kMiB, kMiB, kGpu0);
  driver_.allocations[spec.fd->get()].granularity = 8 * kMiB;
  auto region = mapper_.Map(spec);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_EQ(driver_.mapped.size(), 1u);
  EXPECT_EQ(driver_.mapped.begin()->second.first, 8 * kMiB);
  region->reset();
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
}

TEST_F(CudaVmmMapperTest, AFailureAtEveryStepLeaksNothing) {
  const struct {
    FakeDriver::Step step;
    CudaVmmDriver::Result result;
    StatusCode code;
  } cases[] = {
      {FakeDriver::kImport, CudaVmmDriver::kInvalidValue, StatusCode::kInvalidArgument},
      {FakeDriver::kImport, 999, StatusCode::kInvalidArgument},
      {FakeDriver::kImport, CudaVmmDriver::kOutOfMemory, StatusCode::kInvalidArgument},
      {FakeDriver::kLocation, 999, StatusCode::kInternal},
      {FakeDriver::kGetGranularity, 999, StatusCode::kInternal},
      {FakeDriver::kReserve, CudaVmmDriver::kOutOfMemory, StatusCode::kResourceExhausted},
      {FakeDriver::kReserve, 999, StatusCode::kInternal},
      {FakeDriver::kMap, CudaVmmDriver::kOutOfMemory, StatusCode::kResourceExhausted},
      {FakeDriver::kMap, 999, StatusCode::kInternal},
      {FakeDriver::kSetAccess, 999, StatusCode::kInternal},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(absl::StrCat("step ", c.step, " result ", c.result));
    driver_.fail_at = c.step;
    driver_.fail_result = c.result;
    EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)), StatusIs(c.code));
    EXPECT_TRUE(Clean());
    EXPECT_EQ(driver_.bad_calls, 0);
  }
  driver_.fail_at = FakeDriver::kNone;
  auto region = mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, kGpu0));
  EXPECT_TRUE(region.ok()) << region.status();
}

TEST_F(CudaVmmMapperTest, ASizePastTheAllocationIsRefusedAndLeavesNothingMapped) {
  // 4 MiB allocation; the client claims 2 MiB at offset 3 MiB. The driver's
  // refusal is reported without claiming its cause.
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, 3 * kMiB, 2 * kMiB, kGpu0)),
              StatusIs(StatusCode::kInvalidArgument,
                       "cuMemMap refused to map 6291456 bytes from the start of the allocation "
                       "(fd.offset 3145728 + fd.size 2097152 = 5242880, fd.allocation_size 0"));
  EXPECT_TRUE(Clean());
  // Exactly up to the end is fine, whatever the alignment of offset and size.
  EXPECT_TRUE(mapper_.Map(Allocation(4 * kMiB, 0, 3 * kMiB + 1, kMiB - 1, kGpu0)).ok());
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
}

TEST_F(CudaVmmMapperTest, TheAllocationMustLiveOnTheClaimedDevice) {
  // On GPU 1, claimed on GPU 0: refused, naming both, nothing held.
  EXPECT_THAT(
      mapper_.Map(Allocation(4 * kMiB, 1, 0, kMiB, kGpu0)),
      StatusIs(StatusCode::kFailedPrecondition,
               absl::StrCat("fd.device_uuid is ", kGpu0, " but the allocation lives on ", kGpu1)));
  EXPECT_TRUE(driver_.mapped.empty());
  EXPECT_TRUE(Clean());
  // Host-located memory (CU_MEM_LOCATION_TYPE_HOST) is not device memory.
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, -1, 0, kMiB, kGpu0)),
              StatusIs(StatusCode::kFailedPrecondition, "not device memory"));
  EXPECT_TRUE(Clean());
  // A device the server does not see: refused before any driver call.
  driver_.calls.clear();
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, "GPU-ffff")),
              StatusIs(StatusCode::kFailedPrecondition,
                       "fd.device_uuid \"GPU-ffff\" is not a device of this server's backend"));
  EXPECT_TRUE(driver_.calls.empty());
  // A device the driver sees but the backend does not use (GPU 2): refused
  // the same way, before any driver call (no context is created there),
  // even when the allocation does live on it.
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 2, 0, kMiB, kGpu2)),
              StatusIs(StatusCode::kFailedPrecondition,
                       absl::StrCat("fd.device_uuid \"", kGpu2,
                                    "\" is not a device of this server's backend (", kGpu0, ", ",
                                    kGpu1, ")")));
  EXPECT_TRUE(driver_.calls.empty());
  EXPECT_TRUE(Clean());
  CudaVmmMapperOptions none = Options();
  none.device_uuids.clear();
  CudaVmmMapper no_devices(&driver_, none);
  EXPECT_THAT(no_devices.Map(Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)),
              StatusIs(StatusCode::kFailedPrecondition, "backend (none)"));
  EXPECT_TRUE(driver_.calls.empty());
  // UUIDs compare without regard to case.
  std::string upper = kGpu0;
  for (char& ch : upper) ch = static_cast<char>(toupper(ch));
  auto region = mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, upper));
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->device_uuid(), kGpu0);
}

TEST_F(CudaVmmMapperTest, SpecsAreCheckedBeforeTheDriverIsCalled) {
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, 0, 0, kGpu0)),
              StatusIs(StatusCode::kInvalidArgument, "fd.size must be > 0"));
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, "")),
              StatusIs(StatusCode::kInvalidArgument, "fd.device_uuid is empty"));
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, UINT64_MAX - 5, 6, kGpu0)),
              StatusIs(StatusCode::kOutOfRange, "overflows"));
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, UINT64_MAX - 5, 5, kGpu0)),
              StatusIs(StatusCode::kOutOfRange, "exceeds the 17179869184 bytes of device"));
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, 0, 16 * 1024 * kMiB + 1, kGpu0)),
              StatusIs(StatusCode::kOutOfRange, "bytes of device"));
  core::FdRegionSpec host = Allocation(4 * kMiB, 0, 0, kMiB, kGpu0);
  host.kind = core::FdKind::kHostMemory;
  EXPECT_THAT(mapper_.Map(host), StatusIs(StatusCode::kInvalidArgument, "host_shm"));
  EXPECT_THAT(mapper_.Map(core::CudaIpcSpec{}), StatusIs(StatusCode::kInvalidArgument));
  core::FdRegionSpec no_fd = Allocation(4 * kMiB, 0, 0, kMiB, kGpu0);
  no_fd.fd = nullptr;
  EXPECT_THAT(mapper_.Map(no_fd), StatusIs(StatusCode::kInvalidArgument, "no file descriptor"));
  EXPECT_TRUE(driver_.calls.empty());
}

TEST_F(CudaVmmMapperTest, OnlyNvidiaDescriptorsPass) {
  UniqueFd memfd(memfd_create("host", MFD_CLOEXEC));
  EXPECT_THAT(mapper_.Inspect(memfd.get()),
              StatusIs(StatusCode::kInvalidArgument, "FD_KIND_HOST_MEMORY"));
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  EXPECT_THAT(mapper_.Inspect(read_end.get()), StatusIs(StatusCode::kInvalidArgument, "a pipe"));
  UniqueFd dir(open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EXPECT_THAT(mapper_.Inspect(dir.get()), StatusIs(StatusCode::kInvalidArgument, "directory"));
  EXPECT_THAT(mapper_.Inspect(-1), StatusIs(StatusCode::kInvalidArgument));
  UniqueFd null(open("/dev/null", O_RDWR | O_CLOEXEC));
  EXPECT_TRUE(mapper_.Inspect(null.get()).ok());
  // With the real major, /dev/null (1:3) is another device.
  CudaVmmMapperOptions real = Options();
  real.nvidia_major = kNvidiaDeviceMajor;
  CudaVmmMapper real_major(&driver_, real);
  EXPECT_THAT(real_major.Inspect(null.get()),
              StatusIs(StatusCode::kInvalidArgument, "is not an NVIDIA device (major 195)"));
  // A regular file spec is refused by Map as well, before any driver call.
  core::FdRegionSpec spec = Allocation(4 * kMiB, 0, 0, kMiB, kGpu0);
  spec.fd = std::make_shared<const UniqueFd>(memfd_create("host", MFD_CLOEXEC));
  EXPECT_THAT(mapper_.Map(spec), StatusIs(StatusCode::kInvalidArgument, "regular file"));
  EXPECT_TRUE(driver_.calls.empty());
}

TEST_F(CudaVmmMapperTest, WithoutCudaEverythingIsFailedPreconditionFirst) {
  driver_.available = absl::FailedPreconditionError("cuda_vmm: the server sees no CUDA device");
  UniqueFd memfd(memfd_create("host", MFD_CLOEXEC));
  EXPECT_THAT(mapper_.Inspect(memfd.get()),
              StatusIs(StatusCode::kFailedPrecondition, "no CUDA device"));
  EXPECT_THAT(mapper_.Map(Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)),
              StatusIs(StatusCode::kFailedPrecondition, "no CUDA device"));
  EXPECT_TRUE(driver_.calls.empty());
}

// fd.allocation_size: exactly the allocation is mapped (a driver that refuses
// partial maps of imported allocations then maps it); a value below
// offset + size or not whole granules is INVALID_ARGUMENT naming the field
// before anything is mapped; a larger one than the allocation is refused by
// cuMemMap and reported without blaming a particular field.
TEST_F(CudaVmmMapperTest, AStatedAllocationSizeIsMappedWhole) {
  driver_.refuse_partial = true;
  const uint64_t offset = 3 * kMiB + 256, size = 100;
  core::FdRegionSpec spec = Allocation(20 * kMiB, 0, offset, size, kGpu0);
  // Without the size: the driver refuses the 4 MiB partial map, and the
  // message says what to do.
  EXPECT_THAT(mapper_.Map(spec),
              StatusIs(StatusCode::kInvalidArgument, "set fd.allocation_size to its size"));
  EXPECT_TRUE(Clean());
  spec.allocation_size = 20 * kMiB;
  {
    auto region = mapper_.Map(spec);
    ASSERT_TRUE(region.ok()) << region.status();
    ASSERT_EQ(driver_.mapped.size(), 1u);
    EXPECT_EQ(driver_.mapped.begin()->second.first, 20 * kMiB);
    EXPECT_EQ(driver_.reserved.begin()->second, 20 * kMiB);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*region)->data()),
              driver_.mapped.begin()->first + offset);
    EXPECT_EQ((*region)->size(), size);
  }
  EXPECT_TRUE(Clean());
  driver_.calls.clear();
  spec.allocation_size = offset + size - 1;
  EXPECT_THAT(mapper_.Map(spec), StatusIs(StatusCode::kInvalidArgument,
                                          absl::StrCat("fd.allocation_size ", offset + size - 1,
                                                       " is less than fd.offset")));
  EXPECT_TRUE(driver_.calls.empty());
  spec.allocation_size = 20 * kMiB + 4096;
  EXPECT_THAT(mapper_.Map(spec), StatusIs(StatusCode::kInvalidArgument,
                                          "is not a multiple of the allocation's granularity"));
  EXPECT_TRUE(Clean());
  spec.allocation_size = 22 * kMiB;  // whole granules, larger than the allocation
  EXPECT_THAT(mapper_.Map(spec),
              StatusIs(StatusCode::kInvalidArgument,
                       "fd.allocation_size or fd.offset + fd.size may exceed the allocation"));
  EXPECT_TRUE(Clean());
  spec.allocation_size = 32 * 1024 * kMiB;
  EXPECT_THAT(mapper_.Map(spec), StatusIs(StatusCode::kOutOfRange, "fd.allocation_size"));
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
}

// The cap on mapped bytes counts the mapped lengths of live regions: a Map
// that would pass it is RESOURCE_EXHAUSTED before anything is acquired, a
// failed Map gives its bytes back, and so does a destroyed region.
TEST_F(CudaVmmMapperTest, MappedBytesAreCapped) {
  CudaVmmMapperOptions capped = Options();
  capped.max_mapped_bytes_per_device = 10 * kMiB;
  CudaVmmMapper mapper(&driver_, capped);
  auto a = mapper.Map(Allocation(8 * kMiB, 0, 0, 3 * kMiB, kGpu0));  // maps 4 MiB
  ASSERT_TRUE(a.ok()) << a.status();
  core::FdRegionSpec whole = Allocation(8 * kMiB, 0, 0, kMiB, kGpu0);
  whole.allocation_size = 8 * kMiB;  // 4 + 8 > 10
  driver_.calls.clear();
  EXPECT_THAT(mapper.Map(whole),
              StatusIs(StatusCode::kResourceExhausted,
                       "mapping 8388608 more bytes (fd.offset + fd.size = 1048576, "
                       "fd.allocation_size 8388608) would pass the server's cap of 10485760 "
                       "mapped VMM bytes on device GPU-00000000-0000-0000-0000-00000000000a "
                       "(4194304 mapped now"));
  AwaitVmmTeardowns();  // its imports' release, queued, before the driver is read or told to fail
  EXPECT_THAT(driver_.calls, ::testing::Not(::testing::Contains("reserve")));
  EXPECT_EQ(driver_.mapped.size(), 1u);
  // A failed map gives its bytes back.
  driver_.fail_at = FakeDriver::kSetAccess;
  EXPECT_THAT(mapper.Map(Allocation(8 * kMiB, 0, 0, 6 * kMiB, kGpu0)),
              StatusIs(StatusCode::kInternal));
  AwaitVmmTeardowns();
  driver_.fail_at = FakeDriver::kNone;
  auto b = mapper.Map(Allocation(8 * kMiB, 0, 0, 6 * kMiB, kGpu0));  // 4 + 6 = 10: at the cap
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(mapper.Map(Allocation(8 * kMiB, 0, 0, 1, kGpu0)),
              StatusIs(StatusCode::kResourceExhausted, "cap of 10485760"));
  a->reset();  // a destroyed region gives its bytes back (once its teardown ran)
  AwaitVmmTeardowns();
  EXPECT_TRUE(mapper.Map(Allocation(8 * kMiB, 0, 0, 1, kGpu0)).ok());
  b->reset();
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
}

// Random offsets, sizes and granularities against the rule: mapped iff
// offset + size <= the allocation; then the mapping is the least whole
// number of granules covering offset + size, and everything is given back.
TEST_F(CudaVmmMapperTest, RandomSpecsMapExactlyTheLeastCoveringGranules) {
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 300; ++i) {
    driver_.granularity = uint64_t{1} << (12 + rng() % 10);
    const uint64_t granules = 1 + rng() % 6;
    const uint64_t alloc = granules * driver_.granularity;
    const uint64_t offset = rng() % (alloc + driver_.granularity);
    const uint64_t size = 1 + rng() % (alloc + 1);
    SCOPED_TRACE(absl::StrCat("g=", driver_.granularity, " alloc=", alloc, " offset=", offset,
                              " size=", size));
    auto region = mapper_.Map(Allocation(alloc, 0, offset, size, kGpu0));
    if (offset + size > alloc) {
      EXPECT_THAT(region, StatusIs(StatusCode::kInvalidArgument, "cuMemMap refused"));
    } else {
      ASSERT_TRUE(region.ok()) << region.status();
      ASSERT_EQ(driver_.mapped.size(), 1u);
      const uint64_t length = driver_.mapped.begin()->second.first;
      EXPECT_EQ(length % driver_.granularity, 0u);
      EXPECT_GE(length, offset + size);
      EXPECT_LT(length - (offset + size), driver_.granularity);
      EXPECT_EQ(reinterpret_cast<uintptr_t>((*region)->data()),
                driver_.mapped.begin()->first + offset);
      region->reset();
    }
    ASSERT_TRUE(Clean());
  }
  EXPECT_EQ(driver_.bad_calls, 0);
}

// Through the registry: VMM buffers count against the same limits as the
// others, double unregister is NOT_FOUND, and an unregister while an op
// holds a lease defers the unmap to the lease's release.
TEST_F(CudaVmmMapperTest, RegistryLeasesLimitsAndDoubleUnregister) {
  core::RegistryLimits limits;
  limits.max_buffers_per_session = 2;
  limits.max_buffers = 3;
  core::BufferRegistry registry(nullptr, nullptr, &mapper_, limits, nullptr);
  auto info = registry.Register("s1", "a", Allocation(4 * kMiB, 0, 0, kMiB, kGpu0));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, "cuda_vmm");
  EXPECT_EQ(info->device_uuid, kGpu0);
  EXPECT_EQ(info->size, kMiB);
  ASSERT_TRUE(registry.Register("s1", "b", Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)).ok());
  EXPECT_THAT(registry.Register("s1", "c", Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)),
              StatusIs(StatusCode::kResourceExhausted, "max_buffers_per_session"));
  ASSERT_TRUE(registry.Register("s2", "a", Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)).ok());
  EXPECT_THAT(registry.Register("s3", "a", Allocation(4 * kMiB, 0, 0, kMiB, kGpu0)),
              StatusIs(StatusCode::kResourceExhausted, "max_buffers"));
  AwaitVmmTeardowns();
  EXPECT_EQ(driver_.mapped.size(), 3u);  // the refused ones mapped nothing

  absl::StatusOr<core::BufferLease> lease = registry.Acquire("s1", "a");
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(registry.Unregister("s1", "a").ok());
  EXPECT_THAT(registry.Unregister("s1", "a"), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(driver_.mapped.size(), 3u);  // the op's lease keeps it mapped
  lease->reset();
  AwaitVmmTeardowns();
  EXPECT_EQ(driver_.mapped.size(), 2u);
  registry.UnregisterAll("s1");
  registry.UnregisterAll("s2");
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
}

}  // namespace
}  // namespace tokensel::memory
