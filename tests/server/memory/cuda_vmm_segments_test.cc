// CudaVmmMapper with buffers that span several allocations
// (FdRegionSpec::segments, PassedFd.segments: PyTorch's expandable_segments
// maps a segment as consecutive chunks, each its own cuMemCreate
// allocation), over the fake driver: one reservation of the segments' sum,
// each allocation mapped at the sum of the ones before it, one set-access
// over the whole range, and on every failure exactly what was acquired
// given back in reverse order. Descriptors are /dev/null, told to be
// NVIDIA's (the tests cannot make an NVIDIA descriptor).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/free_gate.h"
#include "server/memory/cuda_vmm_mapper.h"
#include "tests/server/memory/fake_cuda_vmm_driver.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::testing::ElementsAreArray;
using ::tokensel::testing::StatusIs;
using FakeDriver = FakeCudaVmmDriver;

class CudaVmmSegmentsTest : public ::testing::Test {
 protected:
  CudaVmmSegmentsTest() : mapper_(&driver_, Options()) {}
  ~CudaVmmSegmentsTest() override { AwaitVmmTeardowns(); }  // the driver outlives them
  bool Clean() {
    AwaitVmmTeardowns();
    return driver_.Clean();
  }

  static CudaVmmMapperOptions Options(uint64_t cap = UINT64_MAX) { return FakeMapperOptions(cap); }

  // A "VMM descriptor" for an allocation of `size` bytes on `ordinal`.
  core::VmmSegmentSpec Segment(uint64_t size, uint64_t declared, int ordinal = 0) {
    core::VmmSegmentSpec segment{driver_.AddAllocation(size, ordinal), declared};
    EXPECT_GE(segment.fd->get(), 0);
    return segment;
  }

  // A buffer over allocations of `sizes` (each stated exactly) on GPU 0.
  core::FdRegionSpec Spec(const std::vector<uint64_t>& sizes, uint64_t offset, uint64_t size) {
    core::FdRegionSpec spec;
    spec.kind = core::FdKind::kCudaVmm;
    spec.offset = offset;
    spec.size = size;
    spec.device_uuid = kGpu0;
    for (uint64_t s : sizes) spec.segments.push_back(Segment(s, s));
    return spec;
  }

  FakeDriver driver_;
  CudaVmmMapper mapper_;
};

// 1, 2, 3 and 5 allocations (20 MiB chunks, the last one smaller): one
// reservation of their sum; allocation i mapped at the sum of the sizes
// before it with the handle imported from descriptor i; one access grant
// over the whole range; the region at va + offset. Destroyed: every mapping
// unmapped last first, the reservation freed, the handles released last
// first.
TEST_F(CudaVmmSegmentsTest, MapsTheAllocationsBackToBackInOneReservation) {
  for (int n : {1, 2, 3, 5}) {
    SCOPED_TRACE(absl::StrCat(n, " segments"));
    std::vector<uint64_t> sizes(n, 20 * kMiB);
    sizes.back() = 4 * kMiB;
    const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
    const uint64_t offset = 3 * kMiB + 256;
    const uint64_t size = total - offset - 100;
    driver_.calls.clear();
    driver_.unmapped.clear();
    driver_.released.clear();
    driver_.access_ranges.clear();
    auto region = mapper_.Map(Spec(sizes, offset, size));
    ASSERT_TRUE(region.ok()) << region.status();
    ASSERT_EQ(driver_.reserved.size(), 1u);
    const uint64_t va = driver_.reserved.begin()->first;
    EXPECT_EQ(driver_.reserved.begin()->second, total);
    ASSERT_EQ(driver_.mapped.size(), static_cast<size_t>(n));
    std::vector<FakeDriver::Handle> imported;  // in import order: 100, 101, ...
    uint64_t at = 0;
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(driver_.mapped.count(va + at), 1u) << "segment " << i;
      EXPECT_EQ(driver_.mapped.at(va + at).first, sizes[i]);
      imported.push_back(driver_.mapped_handle.at(va + at));
      at += sizes[i];
    }
    for (int i = 1; i < n; ++i) EXPECT_EQ(imported[i], imported[i - 1] + 1);
    EXPECT_THAT(driver_.access_ranges,
                ElementsAreArray({std::pair<uint64_t, uint64_t>(va, total)}));
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*region)->data()), va + offset);
    EXPECT_EQ((*region)->size(), size);
    EXPECT_EQ((*region)->device_uuid(), kGpu0);
    // Everything imported and checked before anything is reserved.
    std::vector<std::string> expected;
    for (int i = 0; i < n; ++i) {
      expected.insert(expected.end(), {"import", "location", "granularity"});
    }
    expected.push_back("reserve");
    for (int i = 0; i < n; ++i) expected.push_back("map");
    expected.push_back("access");
    EXPECT_THAT(driver_.calls, ElementsAreArray(expected));

    driver_.calls.clear();
    region->reset();
    EXPECT_TRUE(Clean());
    std::vector<std::string> undo(n, "unmap");
    undo.push_back("free");
    undo.insert(undo.end(), n, "release");
    EXPECT_THAT(driver_.calls, ElementsAreArray(undo));
    std::vector<uint64_t> unmapped;
    for (int i = n - 1; i >= 0; --i) {
      unmapped.push_back(va + std::accumulate(sizes.begin(), sizes.begin() + i, uint64_t{0}));
    }
    EXPECT_THAT(driver_.unmapped, ElementsAreArray(unmapped));
    EXPECT_THAT(driver_.released, ElementsAreArray(imported.rbegin(), imported.rend()));
  }
  EXPECT_EQ(driver_.bad_calls, 0);
}

// A failure at segment k of 5 gives back exactly what was acquired: an
// import, location or granularity failure the k handles imported before
// (nothing reserved); a map failure the k mappings before it, the
// reservation and all 5 handles; a set-access failure everything.
TEST_F(CudaVmmSegmentsTest, AFailureAtSegmentKGivesBackExactlyWhatWasAcquired) {
  const std::vector<uint64_t> sizes(5, 20 * kMiB);
  for (int k = 0; k < 5; ++k) {
    for (FakeDriver::Step step : {FakeDriver::kImport, FakeDriver::kLocation,
                                  FakeDriver::kGetGranularity, FakeDriver::kMap}) {
      SCOPED_TRACE(absl::StrCat("step ", step, " at segment ", k));
      driver_.calls.clear();
      driver_.FailAt(step, k);
      EXPECT_THAT(mapper_.Map(Spec(sizes, 0, 100 * kMiB)),
                  ::testing::Not(::testing::Property(
                      &absl::StatusOr<std::unique_ptr<core::MappedRegion>>::ok, true)));
      EXPECT_TRUE(Clean());
      if (step == FakeDriver::kMap) {
        EXPECT_EQ(driver_.Count("reserve"), 1);
        EXPECT_EQ(driver_.Count("map"), k + 1);
        EXPECT_EQ(driver_.Count("unmap"), k);
        EXPECT_EQ(driver_.Count("free"), 1);
        EXPECT_EQ(driver_.Count("release"), 5);
      } else {
        EXPECT_EQ(driver_.Count("reserve"), 0);
        EXPECT_EQ(driver_.Count("map"), 0);
        EXPECT_EQ(driver_.Count("import"), k + 1);
        EXPECT_EQ(driver_.Count("release"), step == FakeDriver::kImport ? k : k + 1);
      }
    }
  }
  driver_.calls.clear();
  driver_.FailAt(FakeDriver::kSetAccess);
  EXPECT_THAT(mapper_.Map(Spec(sizes, 0, 100 * kMiB)), StatusIs(StatusCode::kInternal));
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.Count("unmap"), 5);
  EXPECT_EQ(driver_.Count("release"), 5);
  // The import's error names the segment.
  driver_.FailAt(FakeDriver::kImport, 2);
  EXPECT_THAT(mapper_.Map(Spec(sizes, 0, 100 * kMiB)),
              StatusIs(StatusCode::kInvalidArgument,
                       "fd.segments[2]: the driver cannot import the descriptor"));
  AwaitVmmTeardowns();  // its teardown, queued, before the driver is changed
  driver_.FailAt(FakeDriver::kNone);
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
}

// Malformed specs: the precise error naming the field, segment and value,
// and nothing mapped (most before any driver call).
TEST_F(CudaVmmSegmentsTest, BadSegmentsAreRefusedNamingTheSegment) {
  const auto before_driver = [&](core::FdRegionSpec spec, StatusCode code, const std::string& msg) {
    driver_.calls.clear();
    EXPECT_THAT(mapper_.Map(spec), StatusIs(code, msg));
    EXPECT_TRUE(driver_.calls.empty());
  };
  // Too many.
  before_driver(Spec(std::vector<uint64_t>(core::kMaxVmmSegments + 1, 2 * kMiB), 0, kMiB),
                StatusCode::kInvalidArgument,
                "fd.segments has 129 entries; a buffer spans at most 128");
  // Exactly the limit is fine.
  {
    auto at_limit = mapper_.Map(Spec(std::vector<uint64_t>(core::kMaxVmmSegments, 2 * kMiB), 0, 1));
    EXPECT_TRUE(at_limit.ok()) << at_limit.status();
  }
  EXPECT_TRUE(Clean());
  // A zero allocation_size.
  core::FdRegionSpec zero = Spec({20 * kMiB, 20 * kMiB}, 0, kMiB);
  zero.segments[1].allocation_size = 0;
  before_driver(zero, StatusCode::kInvalidArgument, "fd.segments[1].allocation_size must be > 0");
  // The sum overflows.
  core::FdRegionSpec overflow = Spec({20 * kMiB, 20 * kMiB, 20 * kMiB}, 0, kMiB);
  overflow.segments[1].allocation_size = UINT64_MAX - 30 * kMiB;
  before_driver(overflow, StatusCode::kInvalidArgument,
                absl::StrCat("the allocation_size sum overflows a 64-bit integer at "
                             "fd.segments[2].allocation_size ",
                             20 * kMiB));
  // offset + size past the sum (by one byte, at any split).
  before_driver(Spec({20 * kMiB, 20 * kMiB, 2 * kMiB}, 5, 42 * kMiB - 4),
                StatusCode::kInvalidArgument,
                "the sum of fd.segments[].allocation_size 44040192 is less than fd.offset 5 + "
                "fd.size 44040188 = 44040193");
  before_driver(Spec({20 * kMiB, 2 * kMiB}, UINT64_MAX, 2), StatusCode::kOutOfRange, "overflows");
  // The sum past the device's memory.
  before_driver(Spec(std::vector<uint64_t>(9, 2048 * kMiB), 0, 1), StatusCode::kOutOfRange,
                "the sum of fd.segments[].allocation_size 19327352832 exceeds the 17179869184 "
                "bytes of device");
  // Both forms at once.
  core::FdRegionSpec both = Spec({20 * kMiB}, 0, kMiB);
  both.allocation_size = 20 * kMiB;
  before_driver(both, StatusCode::kInvalidArgument, "fd.segments supersedes");
  // A missing descriptor.
  core::FdRegionSpec no_fd = Spec({20 * kMiB, 20 * kMiB}, 0, kMiB);
  no_fd.segments[1].fd = nullptr;
  before_driver(no_fd, StatusCode::kInvalidArgument, "fd.segments[1]: fd: no file descriptor");
  // Not an NVIDIA descriptor.
  core::FdRegionSpec pipe_fd = Spec({20 * kMiB, 20 * kMiB, 20 * kMiB}, 0, kMiB);
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  close(fds[1]);
  pipe_fd.segments[2].fd = std::make_shared<const UniqueFd>(fds[0]);
  before_driver(pipe_fd, StatusCode::kInvalidArgument, "fd.segments[2]: fd: a pipe");
  EXPECT_TRUE(Clean());

  // Found by the driver, with nothing left acquired.
  // An allocation smaller than declared: cuMemMap refuses it.
  core::FdRegionSpec small = Spec({20 * kMiB, 20 * kMiB, 20 * kMiB}, 0, 50 * kMiB);
  driver_.allocations[small.segments[1].fd->get()].size = 18 * kMiB;
  EXPECT_THAT(mapper_.Map(small),
              StatusIs(StatusCode::kInvalidArgument,
                       "cuMemMap refused to map 20971520 bytes of fd.segments[1] (its "
                       "allocation_size 20971520)"));
  EXPECT_TRUE(Clean());
  // Not whole granules of that allocation.
  core::FdRegionSpec partial = Spec({20 * kMiB, 20 * kMiB}, 0, kMiB);
  partial.segments[1].allocation_size = 19 * kMiB;
  EXPECT_THAT(mapper_.Map(partial),
              StatusIs(StatusCode::kInvalidArgument,
                       "fd.segments[1].allocation_size 19922944 is not a multiple of the "
                       "allocation's granularity 2097152"));
  EXPECT_TRUE(Clean());
  // A segment whose granule does not divide its place in the buffer.
  core::FdRegionSpec misplaced = Spec({2 * kMiB, 8 * kMiB}, 0, kMiB);
  driver_.allocations[misplaced.segments[1].fd->get()].granularity = 8 * kMiB;
  EXPECT_THAT(mapper_.Map(misplaced),
              StatusIs(StatusCode::kInvalidArgument,
                       "fd.segments[1] maps at offset 2097152 of the buffer (the allocations "
                       "before it), not a multiple of its granularity 8388608"));
  EXPECT_TRUE(Clean());
  // A segment on another device than the buffer's.
  core::FdRegionSpec elsewhere = Spec({20 * kMiB}, 0, kMiB);
  elsewhere.segments.push_back(Segment(20 * kMiB, 20 * kMiB, 1));
  EXPECT_THAT(mapper_.Map(elsewhere),
              StatusIs(StatusCode::kFailedPrecondition,
                       absl::StrCat("fd.segments[1]: fd.device_uuid is ", kGpu0,
                                    " but the allocation lives on ", kGpu1)));
  EXPECT_TRUE(Clean());
  EXPECT_TRUE(driver_.mapped.empty());
  EXPECT_EQ(driver_.bad_calls, 0);
}

// The mapped-bytes cap counts the whole reservation (every segment).
TEST_F(CudaVmmSegmentsTest, TheCapCountsEverySegment) {
  CudaVmmMapper mapper(&driver_, Options(50 * kMiB));
  driver_.calls.clear();
  EXPECT_THAT(mapper.Map(Spec({20 * kMiB, 20 * kMiB, 20 * kMiB}, 0, kMiB)),
              StatusIs(StatusCode::kResourceExhausted,
                       "mapping 62914560 more bytes (fd.offset + fd.size = 1048576, 3 "
                       "fd.segments) would pass the server's cap of 52428800"));
  EXPECT_EQ(driver_.Count("reserve"), 0);
  EXPECT_TRUE(Clean());
  auto a = mapper.Map(Spec({20 * kMiB, 20 * kMiB}, 0, kMiB));  // 40 of 50
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(mapper.Map(Spec({6 * kMiB, 6 * kMiB}, 0, kMiB)),
              StatusIs(StatusCode::kResourceExhausted, "(41943040 mapped now"));
  auto b = mapper.Map(Spec({6 * kMiB, 4 * kMiB}, 0, kMiB));  // 50 of 50
  ASSERT_TRUE(b.ok()) << b.status();
  a->reset();  // gives back all 40 (once its teardown ran)
  AwaitVmmTeardowns();
  auto c = mapper.Map(Spec({20 * kMiB, 20 * kMiB}, 0, kMiB));
  ASSERT_TRUE(c.ok()) << c.status();
  a->reset();
  b->reset();
  c->reset();
  EXPECT_TRUE(Clean());
  EXPECT_EQ(driver_.bad_calls, 0);
}

}  // namespace
}  // namespace tokensel::memory
