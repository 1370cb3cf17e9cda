// CudaVmmMapper with the real driver: VMM memory another process allocated
// with cuMemCreate and exported as a POSIX descriptor
// (tokensel_cuda_vmm_exporter, cuda_vmm_exporter.cc) is checked, imported,
// mapped, read, bounds-checked and released. Label `gpu`; skips without a
// GPU and fails on a broken one (tests/testing/gpu_device.h). Built only
// with CUDA. What it proves on a device that the fake-driver unit test
// (cuda_vmm_mapper_test.cc) cannot: the exported descriptor is an NVIDIA
// character device (major 195, the Inspect rule), the imported allocation
// reports its device, the driver refuses a map past the allocation, and the
// data read through the server's mapping is the exporter's.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/gpu_uuid.h"
#include "gtest/gtest.h"
#include "server/memory/cuda_vmm_mapper.h"
#include "tests/testing/gpu_device.h"
#include "tests/testing/scm_rights.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using ::tokensel::testing::RecvWithFd;
using ::tokensel::testing::StatusIs;

constexpr int kSocketFd = 3;  // as cuda_vmm_exporter.cc

class Exporter {
 public:
  bool Start() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      const int mine = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
      dup2(mine, kSocketFd);  // dup2 clears FD_CLOEXEC on the target
      char exporter[] = TOKENSEL_CUDA_VMM_EXPORTER_BINARY;
      char* argv[] = {exporter, nullptr};
      execv(exporter, argv);
      _exit(127);
    }
    close(sv[1]);
    socket_ = sv[0];
    std::string text;
    int fd = -1;
    if (!RecvWithFd(socket_, &text, &fd)) return false;
    fd_ = std::make_shared<const UniqueFd>(fd);
    std::vector<std::string> parts = absl::StrSplit(text, absl::ByAnyChar(" \n"));
    return parts.size() >= 3 && !parts[0].empty() && (uuid_ = parts[0], true) &&
           absl::SimpleAtoi(parts[1], &bytes_) && absl::SimpleAtoi(parts[2], &granularity_);
  }
  int Stop() {
    if (socket_ >= 0) close(socket_);
    socket_ = -1;
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Exporter() { Stop(); }

  core::FdRegionSpec Spec(uint64_t offset, uint64_t size, const std::string& uuid) const {
    core::FdRegionSpec spec;
    spec.fd = fd_;
    spec.kind = core::FdKind::kCudaVmm;
    spec.offset = offset;
    spec.size = size;
    spec.device_uuid = uuid;
    return spec;
  }
  int fd() const { return fd_->get(); }
  const std::string& uuid() const { return uuid_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t granularity() const { return granularity_; }

 private:
  pid_t pid_ = -1;
  int socket_ = -1;
  std::shared_ptr<const UniqueFd> fd_;
  std::string uuid_;
  uint64_t bytes_ = 0;
  uint64_t granularity_ = 0;
};

std::vector<unsigned char> CopyOut(const core::MappedRegion& region, size_t n) {
  std::vector<unsigned char> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), region.data(), n, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(CudaVmmDeviceTest, MapsAVmmAllocationOfAnotherProcess) {
  TOKENSEL_REQUIRE_GPU();
  Exporter exporter;
  ASSERT_TRUE(exporter.Start());
  ASSERT_EQ(exporter.bytes(), 2 * exporter.granularity());
  // The descriptor the driver exported is what Inspect expects.
  struct stat st;
  ASSERT_EQ(fstat(exporter.fd(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << std::oct << st.st_mode;
  EXPECT_EQ(major(st.st_rdev), kNvidiaDeviceMajor);
  CudaVmmMapperOptions options;  // every visible device, as a MultiDeviceBackend
  int visible = 0;
  ASSERT_EQ(cudaGetDeviceCount(&visible), cudaSuccess);
  for (int d = 0; d < visible; ++d) {
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d), cudaSuccess);
    options.device_uuids.push_back(FormatGpuUuid(prop.uuid.bytes));
  }
  std::unique_ptr<core::RegionMapper> mapper = MakeCudaVmmMapper(options);
  ASSERT_TRUE(mapper->Inspect(exporter.fd()).ok()) << mapper->Inspect(exporter.fd()).status();
  ASSERT_TRUE(CudaVmmAvailable().ok());

  const uint64_t marker_at = exporter.granularity() + 4096;
  auto marker = mapper->Map(exporter.Spec(marker_at, 256, exporter.uuid()));
  ASSERT_TRUE(marker.ok()) << marker.status();
  auto whole = mapper->Map(exporter.Spec(0, exporter.bytes(), exporter.uuid()));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*marker)->memory_kind(), core::MemoryKind::kCudaDevice);
  EXPECT_EQ((*marker)->device_uuid(), exporter.uuid());
  EXPECT_EQ((*marker)->size(), 256u);
  const auto bytes = CopyOut(**marker, 256);
  for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], i) << "byte " << i;
  EXPECT_EQ(CopyOut(**whole, 16), std::vector<unsigned char>(16, 0x5A));
  // The server's mapping writes through to the exporter's memory.
  ASSERT_EQ(cudaMemset((*whole)->data(), 0x11, 1), cudaSuccess);
  EXPECT_EQ(CopyOut(**whole, 1)[0], 0x11);

  // A partial map (the first granule of two, no allocation_size): the driver
  // maps it, and it reads the exporter's fill (byte 0 written just above).
  auto partial = mapper->Map(exporter.Spec(0, 16, exporter.uuid()));
  ASSERT_TRUE(partial.ok()) << partial.status();
  std::vector<unsigned char> fill(16, 0x5A);
  fill[0] = 0x11;
  EXPECT_EQ(CopyOut(**partial, 16), fill);
  partial->reset();

  // The allocation's size stated (fd.allocation_size): mapped whole.
  core::FdRegionSpec stated_spec = exporter.Spec(marker_at, 256, exporter.uuid());
  stated_spec.allocation_size = exporter.bytes();
  auto stated = mapper->Map(stated_spec);
  ASSERT_TRUE(stated.ok()) << stated.status();
  EXPECT_EQ(CopyOut(**stated, 256), bytes);
  stated->reset();

  // A size past the allocation: the driver refuses, precisely reported.
  EXPECT_THAT(mapper->Map(exporter.Spec(exporter.bytes() - 16, 32, exporter.uuid())),
              StatusIs(StatusCode::kInvalidArgument, "cuMemMap refused"));
  EXPECT_THAT(mapper->Map(exporter.Spec(0, 16, "GPU-00000000-0000-0000-0000-000000000000")),
              StatusIs(StatusCode::kFailedPrecondition, "fd.device_uuid"));
  // Another visible device claimed: refused, naming the allocation's own.
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d), cudaSuccess);
    const std::string other = FormatGpuUuid(prop.uuid.bytes);
    if (other == exporter.uuid()) continue;
    EXPECT_THAT(mapper->Map(exporter.Spec(0, 16, other)),
                StatusIs(StatusCode::kFailedPrecondition, "but the allocation lives on"));
  }
  // Host memory posing as VMM: refused before the driver sees it.
  UniqueFd memfd(memfd_create("not-vmm", MFD_CLOEXEC));
  EXPECT_THAT(mapper->Inspect(memfd.get()), StatusIs(StatusCode::kInvalidArgument));

  marker->reset();
  whole->reset();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(exporter.Stop(), 0);  // its unmap and release succeed after ours
}

}  // namespace
}  // namespace tokensel::memory
