// HostShmMapper against real POSIX shm objects created by the test.
#include "server/memory/host_shm_mapper.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::StatusIs;

const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

// A name under `prefix` unique to this process and call.
std::string UniqueName(absl::string_view prefix = "/tokensel") {
  static std::atomic<int> counter{0};
  return absl::StrCat(prefix, "-test-", getpid(), "-", counter++);
}

std::string DevShmPath(const std::string& name) { return absl::StrCat("/dev/shm", name); }

// Byte i of an object holds Pattern(i).
uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>((i * 131 + 7) % 251); }

// A shm object the test creates (mode 0600, filled with Pattern) and
// unlinks when done. `map()` is an independent mapping of the whole object.
class ShmObject {
 public:
  explicit ShmObject(uint64_t size, std::string name = UniqueName()) : name_(std::move(name)) {
    fd_ = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd_, 0) << "shm_open " << name_ << ": " << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(size)), 0);
    size_ = size;
    map_ = static_cast<uint8_t*>(
        mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(map_, MAP_FAILED);
    for (uint64_t i = 0; i < size; ++i) map_[i] = Pattern(i);
  }
  ~ShmObject() {
    munmap(map_, size_);
    close(fd_);
    Unlink();
  }
  void Unlink() {
    if (!unlinked_) shm_unlink(name_.c_str());
    unlinked_ = true;
  }
  const std::string& name() const { return name_; }
  int fd() const { return fd_; }
  uint8_t* map() const { return map_; }

 private:
  std::string name_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint8_t* map_ = nullptr;
  bool unlinked_ = false;
};

core::RegionSpec Spec(const std::string& name, uint64_t offset, uint64_t size) {
  return core::HostShmSpec{name, offset, size};
}

int OpenFdCount() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

TEST(HostShmMapperTest, MapsTheWindowAndSharesWritesBothWays) {
  ShmObject obj(3 * kPage + 100);
  HostShmMapper mapper;
  const uint64_t offset = kPage + 7;  // not page aligned
  const uint64_t size = 1000 + kPage;
  auto region = mapper.Map(Spec(obj.name(), offset, size));
  ASSERT_OK(region);
  EXPECT_EQ((*region)->size(), size);
  EXPECT_EQ((*region)->memory_kind(), core::MemoryKind::kHost);
  EXPECT_EQ((*region)->device_uuid(), "");
  auto* data = static_cast<uint8_t*>((*region)->data());
  for (uint64_t i = 0; i < size; ++i) ASSERT_EQ(data[i], Pattern(offset + i)) << "byte " << i;

  data[0] = 0xAB;
  data[size - 1] = 0xCD;
  EXPECT_EQ(obj.map()[offset], 0xAB);
  EXPECT_EQ(obj.map()[offset + size - 1], 0xCD);
  obj.map()[offset + 5] = 0xEF;
  EXPECT_EQ(data[5], 0xEF);
  // The bytes just outside the window are untouched.
  EXPECT_EQ(obj.map()[offset - 1], Pattern(offset - 1));
  EXPECT_EQ(obj.map()[offset + size], Pattern(offset + size));
}

TEST(HostShmMapperTest, ExactFitAndLastByte) {
  ShmObject obj(2 * kPage);
  HostShmMapper mapper;
  ASSERT_OK(mapper.Map(Spec(obj.name(), 0, 2 * kPage)));
  auto last = mapper.Map(Spec(obj.name(), 2 * kPage - 1, 1));
  ASSERT_OK(last);
  EXPECT_EQ(*static_cast<uint8_t*>((*last)->data()), Pattern(2 * kPage - 1));
}

TEST(HostShmMapperTest, ClosesTheDescriptorAfterMapping) {
  ShmObject obj(kPage);
  HostShmMapper mapper;
  const int before = OpenFdCount();
  std::vector<std::unique_ptr<core::MappedRegion>> regions;
  for (int i = 0; i < 20; ++i) {
    auto region = mapper.Map(Spec(obj.name(), 0, kPage));
    ASSERT_OK(region);
    regions.push_back(*std::move(region));
  }
  EXPECT_EQ(OpenFdCount(), before);
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 0, kPage + 1)), StatusIs(StatusCode::kOutOfRange));
  EXPECT_EQ(OpenFdCount(), before);
}

TEST(HostShmMapperTest, ManyMappingsOfOneObjectSeeEachOther) {
  const uint64_t object_size = 8 * kPage;
  ShmObject obj(object_size);
  HostShmMapper mapper;
  constexpr int kRegions = 64;
  std::vector<std::unique_ptr<core::MappedRegion>> regions;
  for (int i = 0; i < kRegions; ++i) {
    const uint64_t offset = static_cast<uint64_t>(i) * 97;
    auto region = mapper.Map(Spec(obj.name(), offset, object_size - offset));
    ASSERT_OK(region);
    regions.push_back(*std::move(region));
  }
  // Byte 10000 of the object, written through each region in turn, is seen
  // by every other region at its own offset.
  for (int writer = 0; writer < kRegions; ++writer) {
    const uint64_t w_off = static_cast<uint64_t>(writer) * 97;
    static_cast<uint8_t*>(regions[writer]->data())[10000 - w_off] = static_cast<uint8_t>(writer);
    for (int reader = 0; reader < kRegions; ++reader) {
      const uint64_t r_off = static_cast<uint64_t>(reader) * 97;
      ASSERT_EQ(static_cast<uint8_t*>(regions[reader]->data())[10000 - r_off], writer)
          << "writer " << writer << " reader " << reader;
    }
  }
  EXPECT_EQ(obj.map()[10000], kRegions - 1);
}

TEST(HostShmMapperTest, MappingSurvivesUnlink) {
  ShmObject obj(kPage);
  HostShmMapper mapper;
  auto region = mapper.Map(Spec(obj.name(), 16, 256));
  ASSERT_OK(region);
  obj.Unlink();
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 16, 256)), StatusIs(StatusCode::kNotFound, obj.name()));
  auto* data = static_cast<uint8_t*>((*region)->data());
  for (uint64_t i = 0; i < 256; ++i) ASSERT_EQ(data[i], Pattern(16 + i));
  data[3] = 0x42;
  EXPECT_EQ(obj.map()[19], 0x42);
}

TEST(HostShmMapperTest, UnknownObjectIsNotFound) {
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(UniqueName(), 0, 8)),
              StatusIs(StatusCode::kNotFound, "no such shared-memory object"));
}

TEST(HostShmMapperTest, NameOutsideThePrefixIsDenied) {
  ShmObject outside(kPage, UniqueName("/other"));
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(outside.name(), 0, 8)),
              StatusIs(StatusCode::kPermissionDenied, "outside the server's shm prefix"));

  ShmObject obj(kPage);  // "/tokensel-test-..."
  HostShmMapper narrow(HostShmMapperOptions{.prefix = "/tokensel-prod"});
  EXPECT_THAT(narrow.Map(Spec(obj.name(), 0, 8)),
              StatusIs(StatusCode::kPermissionDenied, "\"/tokensel-prod\""));
  HostShmMapper exact(HostShmMapperOptions{.prefix = "/tokensel-test-"});
  EXPECT_OK(exact.Map(Spec(obj.name(), 0, 8)));
}

TEST(HostShmMapperTest, MalformedNamesAreInvalid) {
  HostShmMapper mapper;
  const std::string cases[] = {
      "",
      "tokensel-x",                  // no leading '/'
      "/tokensel/x",                 // a further '/'
      "/tokensel-a/../etc",          // '/' and ".."
      "/tokensel..x",                // ".."
      std::string("/tokensel\0x", 11),  // NUL
      "/tokensel" + std::string(300, 'a'),
      "/",
  };
  for (const std::string& name : cases) {
    EXPECT_THAT(mapper.Map(Spec(name, 0, 8)),
                StatusIs(StatusCode::kInvalidArgument, "host_shm.shm_name"))
        << "name of length " << name.size() << ": " << name.c_str();
  }
  EXPECT_THAT(mapper.Map(Spec("/tokensel/x", 0, 8)), StatusIs(StatusCode::kInvalidArgument, "'/'"));
  EXPECT_THAT(mapper.Map(Spec("/tokensel..x", 0, 8)),
              StatusIs(StatusCode::kInvalidArgument, "\"..\""));
}

TEST(HostShmMapperTest, SymlinkIsDenied) {
  ShmObject target(kPage);
  const std::string link = UniqueName();
  ASSERT_EQ(symlink(DevShmPath(target.name()).c_str(), DevShmPath(link).c_str()), 0)
      << std::strerror(errno);
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(link, 0, 8)), StatusIs(StatusCode::kPermissionDenied, "symlink"));
  unlink(DevShmPath(link).c_str());
  EXPECT_OK(mapper.Map(Spec(target.name(), 0, 8)));  // the target itself is fine
}

TEST(HostShmMapperTest, DirectoryIsDenied) {
  const std::string name = UniqueName();
  ASSERT_EQ(mkdir(DevShmPath(name).c_str(), 0700), 0) << std::strerror(errno);
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(name, 0, 8)), StatusIs(StatusCode::kPermissionDenied, "directory"));
  rmdir(DevShmPath(name).c_str());
}

TEST(HostShmMapperTest, FifoIsDenied) {
  const std::string name = UniqueName();
  ASSERT_EQ(mkfifo(DevShmPath(name).c_str(), 0600), 0) << std::strerror(errno);
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(name, 0, 8)),
              StatusIs(StatusCode::kPermissionDenied, "not a regular shm object"));
  unlink(DevShmPath(name).c_str());
}

TEST(HostShmMapperTest, ObjectOfAnotherUserIsDenied) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown a shm object to uid 65534";
  ShmObject obj(kPage);
  ASSERT_EQ(fchown(obj.fd(), 65534, 65534), 0) << std::strerror(errno);
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 0, 8)),
              StatusIs(StatusCode::kPermissionDenied, "owned by uid 65534"));
  HostShmMapper trusting(HostShmMapperOptions{.trusted_uids = {geteuid(), 65534}});
  EXPECT_OK(trusting.Map(Spec(obj.name(), 0, 8)));
}

TEST(HostShmMapperTest, NoTrustedUidDeniesEverything) {
  ShmObject obj(kPage);
  HostShmMapper mapper(HostShmMapperOptions{.trusted_uids = {}});
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 0, 8)),
              StatusIs(StatusCode::kPermissionDenied, absl::StrCat("uid ", geteuid())));
}

TEST(HostShmMapperTest, RangePastTheObjectIsOutOfRange) {
  ShmObject obj(4096);
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 4000, 200)),
              StatusIs(StatusCode::kOutOfRange, "= 4200 exceeds the size"));
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 4000, 200)),
              StatusIs(StatusCode::kOutOfRange, "(4096 bytes)"));
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 4096, 1)), StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 0, 4097)), StatusIs(StatusCode::kOutOfRange));
}

TEST(HostShmMapperTest, OffsetPlusSizeOverflowIsOutOfRange) {
  ShmObject obj(4096);
  HostShmMapper mapper;
  const uint64_t offset = UINT64_MAX - 7;  // 2^64 - 8
  EXPECT_THAT(mapper.Map(Spec(obj.name(), offset, 16)),
              StatusIs(StatusCode::kOutOfRange, "overflows"));
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 8, UINT64_MAX)),
              StatusIs(StatusCode::kOutOfRange, "overflows"));
}

TEST(HostShmMapperTest, ZeroSizeIsInvalid) {
  ShmObject obj(4096);
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(Spec(obj.name(), 0, 0)),
              StatusIs(StatusCode::kInvalidArgument, "host_shm.size"));
}

TEST(HostShmMapperTest, CudaIpcSpecIsInvalid) {
  HostShmMapper mapper;
  EXPECT_THAT(mapper.Map(core::CudaIpcSpec{std::string(64, 'x'), "GPU-0", 0, 8}),
              StatusIs(StatusCode::kInvalidArgument, "cuda_ipc"));
}

TEST(HostShmMapperTest, ValidatePrefix) {
  EXPECT_OK(HostShmMapper::ValidatePrefix("/tokensel"));
  EXPECT_OK(HostShmMapper::ValidatePrefix("/"));
  EXPECT_THAT(HostShmMapper::ValidatePrefix(""), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(HostShmMapper::ValidatePrefix("tokensel"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(HostShmMapper::ValidatePrefix("/a/b"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(HostShmMapper::ValidatePrefix("/a.."), StatusIs(StatusCode::kInvalidArgument));
  // A mapper with a bad prefix refuses every name.
  ShmObject obj(kPage);
  HostShmMapper bad(HostShmMapperOptions{.prefix = "tokensel"});
  EXPECT_THAT(bad.Map(Spec(obj.name(), 0, 8)), StatusIs(StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace tokensel::memory
