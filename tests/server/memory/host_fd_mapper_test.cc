// HostFdMapper and SigbusGuard against real memfds, POSIX shm objects and
// other descriptors created by the test.
#include "server/memory/host_fd_mapper.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/memory/sigbus_guard.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::StatusIs;

const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>((i * 131 + 7) % 251); }

// A memfd of `size` bytes filled with Pattern, optionally sealed against
// shrinking, with the test's own mapping of it.
class Memfd {
 public:
  explicit Memfd(uint64_t size, unsigned seals = 0) : size_(size) {
    fd_ = memfd_create("host-fd-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(size)), 0);
    map_ = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(map_, MAP_FAILED);
    for (uint64_t i = 0; i < size; ++i) map_[i] = Pattern(i);
    if (seals != 0) {
      EXPECT_EQ(fcntl(fd_, F_ADD_SEALS, seals), 0) << std::strerror(errno);
    }
  }
  ~Memfd() {
    munmap(map_, size_);
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }
  uint8_t* map() const { return map_; }
  // A spec sharing a duplicate of the descriptor (as the fd channel delivers).
  core::FdRegionSpec Spec(uint64_t offset, uint64_t size) const {
    return core::FdRegionSpec{std::make_shared<const UniqueFd>(fcntl(fd_, F_DUPFD_CLOEXEC, 0)),
                              core::FdKind::kHostMemory, offset, size};
  }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  uint8_t* map_ = nullptr;
};

core::FdRegionSpec SpecOf(int fd, uint64_t offset, uint64_t size) {
  return core::FdRegionSpec{std::make_shared<const UniqueFd>(fd), core::FdKind::kHostMemory, offset,
                            size};
}

std::unique_ptr<HostFdMapper> NewMapper() {
  absl::StatusOr<std::unique_ptr<HostFdMapper>> mapper = HostFdMapper::Create();
  EXPECT_TRUE(mapper.ok()) << mapper.status();
  return *std::move(mapper);
}

TEST(HostFdMapperTest, MapsAnUnalignedWindowSharedBothWays) {
  auto mapper = NewMapper();
  Memfd object(4 * kPage);
  const uint64_t offset = kPage + 100;
  absl::StatusOr<std::unique_ptr<core::MappedRegion>> region =
      mapper->Map(object.Spec(offset, 2 * kPage));
  ASSERT_OK(region);
  EXPECT_EQ((*region)->size(), 2 * kPage);
  EXPECT_EQ((*region)->memory_kind(), core::MemoryKind::kHost);
  EXPECT_FALSE((*region)->sealed());
  EXPECT_FALSE((*region)->faulted());
  auto* data = static_cast<uint8_t*>((*region)->data());
  for (uint64_t i = 0; i < 2 * kPage; ++i) ASSERT_EQ(data[i], Pattern(offset + i)) << i;
  data[5] = 0xAB;  // the server writes, the owner sees it
  EXPECT_EQ(object.map()[offset + 5], 0xAB);
  object.map()[offset + 6] = 0xCD;  // and the other way round
  EXPECT_EQ(data[6], 0xCD);
}

TEST(HostFdMapperTest, TheMappingOutlivesTheDescriptor) {
  auto mapper = NewMapper();
  Memfd object(kPage);
  core::FdRegionSpec spec = object.Spec(0, kPage);
  absl::StatusOr<std::unique_ptr<core::MappedRegion>> region = mapper->Map(spec);
  ASSERT_OK(region);
  spec.fd.reset();  // the server drops its copy right after mapping
  EXPECT_EQ(static_cast<uint8_t*>((*region)->data())[10], Pattern(10));
}

TEST(HostFdMapperTest, SealedMemfdsReportSealedAndCannotShrink) {
  auto mapper = NewMapper();
  Memfd object(2 * kPage, F_SEAL_SHRINK);
  absl::StatusOr<core::FdInfo> info = mapper->Inspect(object.fd());
  ASSERT_OK(info);
  EXPECT_EQ(info->size, 2 * kPage);
  EXPECT_TRUE(info->sealed);
  absl::StatusOr<std::unique_ptr<core::MappedRegion>> region = mapper->Map(object.Spec(0, kPage));
  ASSERT_OK(region);
  EXPECT_TRUE((*region)->sealed());
  EXPECT_NE(ftruncate(object.fd(), 0), 0);  // the kernel enforces it
  EXPECT_EQ(errno, EPERM);
}

TEST(HostFdMapperTest, PosixShmObjectsAreMemoryToo) {
  auto mapper = NewMapper();
  const std::string name = absl::StrCat("/tokensel-fd-test-", getpid());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  shm_unlink(name.c_str());
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kPage)), 0);
  EXPECT_OK(mapper->Map(SpecOf(fd, 0, kPage)).status());
}

TEST(HostFdMapperTest, WhatIsNotSharedMemoryIsRefused) {
  auto mapper = NewMapper();
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  close(pipe_fds[1]);
  EXPECT_THAT(mapper->Map(SpecOf(pipe_fds[0], 0, 8)),
              StatusIs(StatusCode::kInvalidArgument, "a pipe cannot be registered"));
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  close(pair[1]);
  EXPECT_THAT(mapper->Map(SpecOf(pair[0], 0, 8)),
              StatusIs(StatusCode::kInvalidArgument, "a socket cannot be registered"));
  EXPECT_THAT(mapper->Map(SpecOf(open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC), 0, 8)),
              StatusIs(StatusCode::kInvalidArgument, "a directory cannot be registered"));
  EXPECT_THAT(mapper->Inspect(open("/dev/zero", O_RDWR | O_CLOEXEC)),
              StatusIs(StatusCode::kInvalidArgument, "character device"));
  // A regular file on a disk filesystem: its page faults would wait on I/O.
  char path[] = "/var/tmp/tokensel-fd-test-XXXXXX";
  const int file = mkostemp(path, O_CLOEXEC);
  ASSERT_GE(file, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(file, static_cast<off_t>(kPage)), 0);
  EXPECT_THAT(mapper->Map(SpecOf(file, 0, 8)),
              StatusIs(StatusCode::kInvalidArgument, "only memory (tmpfs, hugetlbfs"));
  EXPECT_THAT(mapper->Map(SpecOf(-1, 0, 8)), StatusIs(StatusCode::kInvalidArgument));
}

TEST(HostFdMapperTest, ReadOnlyAndWriteSealedDescriptorsAreDenied) {
  auto mapper = NewMapper();
  Memfd object(kPage);
  const int read_only =
      open(absl::StrCat("/proc/self/fd/", object.fd()).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(read_only, 0);
  EXPECT_THAT(mapper->Map(SpecOf(read_only, 0, 8)),
              StatusIs(StatusCode::kPermissionDenied, "not open for reading and writing"));
  // F_SEAL_WRITE can only be added while nothing maps the memfd writably.
  const int sealed = memfd_create("write-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(sealed, static_cast<off_t>(kPage)), 0);
  ASSERT_EQ(fcntl(sealed, F_ADD_SEALS, F_SEAL_WRITE), 0) << std::strerror(errno);
  EXPECT_THAT(mapper->Map(SpecOf(sealed, 0, 8)),
              StatusIs(StatusCode::kPermissionDenied, "sealed against writes"));
}

TEST(HostFdMapperTest, BoundsAreCheckedAgainstTheObjectAsItIsNow) {
  auto mapper = NewMapper();
  Memfd object(2 * kPage);
  EXPECT_THAT(mapper->Map(object.Spec(0, 0)), StatusIs(StatusCode::kInvalidArgument, "fd.size"));
  EXPECT_THAT(mapper->Map(object.Spec(UINT64_MAX - 4, 8)),
              StatusIs(StatusCode::kOutOfRange, "overflows"));
  EXPECT_THAT(mapper->Map(object.Spec(kPage, kPage + 1)),
              StatusIs(StatusCode::kOutOfRange, "exceeds the object's size (8192"));
  EXPECT_OK(mapper->Map(object.Spec(kPage, kPage)).status());       // exactly to the end
  ASSERT_EQ(ftruncate(object.fd(), static_cast<off_t>(kPage)), 0);  // shrunk since received
  EXPECT_THAT(mapper->Map(object.Spec(kPage, 1)), StatusIs(StatusCode::kOutOfRange));
}

TEST(HostFdMapperTest, OtherSpecsAndKindsAreInvalid) {
  auto mapper = NewMapper();
  EXPECT_THAT(mapper->Map(core::CudaIpcSpec{std::string(64, 'x'), "GPU-0", 0, 8}),
              StatusIs(StatusCode::kInvalidArgument, "cannot map a cuda_ipc region"));
  Memfd object(kPage);
  core::FdRegionSpec vmm = object.Spec(0, 8);
  vmm.kind = core::FdKind::kCudaVmm;
  EXPECT_THAT(mapper->Map(vmm), StatusIs(StatusCode::kInvalidArgument, "cuda_vmm"));
  core::FdRegionSpec sized = object.Spec(0, 8);
  sized.allocation_size = kPage;  // a cuda_vmm field
  EXPECT_THAT(mapper->Map(sized), StatusIs(StatusCode::kInvalidArgument, "fd.allocation_size"));
}

// The owner truncates its unsealed object under the server's mapping: the
// next access must not kill the process; the region reads zeros from then
// on and says it faulted. Other regions are untouched.
TEST(SigbusGuardTest, ATruncatedObjectFaultsItsRegionNotTheProcess) {
  auto mapper = NewMapper();
  Memfd victim(4 * kPage);
  Memfd bystander(kPage);
  auto lost = mapper->Map(victim.Spec(kPage, 3 * kPage));
  auto kept = mapper->Map(bystander.Spec(0, kPage));
  ASSERT_OK(lost);
  ASSERT_OK(kept);
  const size_t guarded = SigbusGuard::registered();
  EXPECT_GE(guarded, 2u);
  ASSERT_EQ(ftruncate(victim.fd(), static_cast<off_t>(kPage)), 0);
  volatile uint8_t* data = static_cast<uint8_t*>((*lost)->data());
  const uint8_t read = data[kPage + 3];  // SIGBUS without the guard
  EXPECT_EQ(read, 0);
  data[2 * kPage] = 7;  // writes land in the private zero pages
  EXPECT_EQ(data[2 * kPage], 7);
  EXPECT_TRUE((*lost)->faulted());
  EXPECT_FALSE((*kept)->faulted());
  EXPECT_EQ(static_cast<uint8_t*>((*kept)->data())[1], Pattern(1));
  lost->reset();  // unmapping a faulted region is fine and frees its slot
  EXPECT_EQ(SigbusGuard::registered(), guarded - 1);
}

TEST(SigbusGuardDeathTest, ASigbusOutsideRegisteredRegionsStillKills) {
  auto mapper = NewMapper();  // the guard is installed
  ASSERT_DEATH(
      {
        const int fd = memfd_create("unguarded", MFD_CLOEXEC);
        if (ftruncate(fd, static_cast<off_t>(kPage)) != 0) std::abort();
        auto* p = static_cast<volatile uint8_t*>(
            mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
        if (ftruncate(fd, 0) != 0) std::abort();
        (void)p[0];
      },
      "");
}

}  // namespace
}  // namespace tokensel::memory
