// The release paths run in destructors, possibly while unwinding a
// std::bad_alloc: they must not allocate. Here every operator new of the
// calling thread fails (throws std::bad_alloc) around the release calls of
// BlockPool (a Release that trims), StreamPool (a Release beyond the idle
// cap: destroyed) and FreeGate (FreeOrDefer into reserved room, Leave). A release
// that allocates throws out of the EXPECT_NO_THROW (the old BlockPool's
// trim built a std::vector of the blocks to free). Also a VMM region's
// teardown (cuda_vmm_mapper.cc): nothing to allocate, always through the
// device's FreeGate.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "gtest/gtest.h"
#include "server/backends/block_pool.h"
#include "server/backends/stream_pool.h"
#include "server/core/free_gate.h"
#include "server/memory/cuda_vmm_mapper.h"
#include "tests/server/memory/fake_cuda_vmm_driver.h"

namespace {
thread_local bool fail_allocations = false;
}  // namespace

// GCC sees the std::free of memory from the operator new below as a
// mismatch: both are this file's, over malloc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

// The global allocation functions of this binary: malloc, unless failing.
void* operator new(size_t n) {
  if (fail_allocations) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace tokensel::testing {
namespace {

using backends::BlockPool;
using backends::StreamPool;
using core::FreeGate;

// Every operator new of this thread fails while one is alive.
struct FailAllocations {
  FailAllocations() { fail_allocations = true; }
  ~FailAllocations() { fail_allocations = false; }
  FailAllocations(const FailAllocations&) = delete;
  FailAllocations& operator=(const FailAllocations&) = delete;
};

TEST(ReleaseNoThrowTest, AllocationFailuresAreInjected) {
  EXPECT_THROW(
      {
        FailAllocations fail;
        std::vector<int> v(4);
      },
      std::bad_alloc);
}

TEST(ReleaseNoThrowTest, ABlockPoolReleaseThatTrimsAllocatesNothing) {
  int frees = 0;
  BlockPool pool(
      "pool", 1024, 4096, [](size_t bytes) -> absl::StatusOr<void*> { return std::malloc(bytes); },
      [&frees](void* p) {
        ++frees;
        std::free(p);
      });
  std::vector<BlockPool::Block> blocks;
  for (size_t kb : {1, 2, 3, 4}) blocks.push_back(*pool.Acquire(kb * 1024));
  for (const BlockPool::Block& b : blocks) {
    EXPECT_NO_THROW({
      FailAllocations fail;
      pool.Release(b);
    });
  }
  EXPECT_GT(frees, 0);  // the trim ran under the failing allocator
  EXPECT_LE(pool.cached_bytes(), pool.max_cached_bytes());
  EXPECT_EQ(pool.blocks_in_use(), 0u);
}

TEST(ReleaseNoThrowTest, StreamPoolAndFreeGateReleasesAllocateNothing) {
  static int destroyed = 0;  // the destroy function counts (no allocation)
  char slots[8] = {};
  size_t made = 0;
  StreamPool pool(
      2, [&]() -> absl::StatusOr<void*> { return static_cast<void*>(&slots[made++]); },
      [](void* /*stream*/, intptr_t /*arg*/) { ++destroyed; }, 0);
  std::vector<void*> held;
  held.reserve(6);
  for (int i = 0; i < 6; ++i) held.push_back(*pool.Acquire());
  for (void* s : held) {
    EXPECT_NO_THROW({
      FailAllocations fail;
      pool.Release(s);  // idle, or beyond the cap: destroyed
    });
  }
  EXPECT_EQ(destroyed, 4);
  // The gate's deferrals go into room reserved beforehand.
  FreeGate gate;
  static int freed = 0;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(gate.Reserve("test").ok());
  gate.Enter();
  for (int i = 0; i < 4; ++i) {
    EXPECT_NO_THROW({
      FailAllocations fail;
      gate.FreeOrDefer({[](void*, intptr_t) {
                          ++freed;
                          return true;
                        },
                        nullptr, 0, 0});
    });
  }
  EXPECT_EQ(gate.deferred(), 4u);
  EXPECT_EQ(gate.dropped(), 0);
  EXPECT_NO_THROW({
    FailAllocations fail;
    gate.Leave();  // wakes the drainer
  });
  EXPECT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_EQ(freed, 4);
}

// The fifth review's nit: ~VmmRegion allocated a copy of the mapping for
// the gate's entry (new (std::nothrow)) and, out of memory, undid the
// mapping at once on this thread, even with the gate closed (behind a
// client's wait). The mapping is allocated with the Map now: the teardown
// allocates nothing and always goes through the gate.
TEST(ReleaseNoThrowTest, AVmmRegionsTeardownAllocatesNothingAndWaitsForTheGate) {
  memory::FakeCudaVmmDriver driver;
  memory::CudaVmmMapperOptions options;
  options.device_uuids = {memory::kGpu0};
  struct stat st;
  ASSERT_EQ(stat("/dev/null", &st), 0);
  options.nvidia_major = major(st.st_rdev);
  memory::CudaVmmMapper mapper(&driver, options);
  const int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  memory::FakeCudaVmmDriver::Allocation a;
  a.size = 4 * memory::kMiB;
  a.location.on_device = true;
  a.location.type = 1;
  a.location.ordinal = 0;
  driver.allocations[fd] = a;
  core::FdRegionSpec spec;
  spec.fd = std::make_shared<const UniqueFd>(fd);
  spec.kind = core::FdKind::kCudaVmm;
  spec.size = memory::kMiB;
  spec.device_uuid = memory::kGpu0;
  auto region = mapper.Map(spec);
  ASSERT_TRUE(region.ok()) << region.status();
  FreeGate& gate = FreeGate::ForDevice(0);
  gate.Enter();  // a stream of device 0 waits on a client's event
  driver.calls.clear();
  driver.calls.reserve(16);  // an inline undo would record without allocating
  EXPECT_NO_THROW({
    FailAllocations fail;
    region->reset();
  });
  EXPECT_TRUE(driver.calls.empty()) << driver.calls.front() << " ran inline, gate closed";
  EXPECT_EQ(gate.deferred(), 1u);
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_TRUE(driver.Clean());
  EXPECT_EQ(driver.bad_calls, 0);
}

}  // namespace
}  // namespace tokensel::testing
