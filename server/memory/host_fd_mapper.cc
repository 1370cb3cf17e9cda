#include "server/memory/host_fd_mapper.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/errno_string.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/memory/file_type.h"
#include "server/memory/sigbus_guard.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace tokensel::memory {
namespace {

// A page-aligned window [base, base + length) of an object; data() is
// `delta` bytes into it.
class FdRegion final : public core::MappedRegion {
 public:
  FdRegion(void* base, size_t length, size_t delta, uint64_t size, bool sealed,
           SigbusGuard::Slot slot)
      : base_(base),
        length_(length),
        delta_(delta),
        size_(size),
        sealed_(sealed),
        slot_(std::move(slot)) {}
  ~FdRegion() override {
    // Out of the guard's table before the address range is given back.
    slot_ = SigbusGuard::Slot();
    if (munmap(base_, length_) != 0) {
      TS_LOG(ERROR) << "munmap(" << base_ << ", " << length_ << "): " << ErrnoString(errno);
    }
  }
  FdRegion(const FdRegion&) = delete;
  FdRegion& operator=(const FdRegion&) = delete;

  void* data() const override { return static_cast<char*>(base_) + delta_; }
  uint64_t size() const override { return size_; }
  core::MemoryKind memory_kind() const override { return core::MemoryKind::kHost; }
  bool sealed() const override { return sealed_; }
  bool faulted() const override { return slot_.faulted(); }

 private:
  void* const base_;
  const size_t length_;
  const size_t delta_;
  const uint64_t size_;
  const bool sealed_;
  SigbusGuard::Slot slot_;
};

struct Inspected {
  core::FdInfo info;
  uint64_t alignment = 0;  // of mmap offsets: the page size, or the huge page size
};

absl::StatusOr<Inspected> InspectFd(int fd) {
  if (fd < 0) return absl::InvalidArgumentError("fd: no file descriptor");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fd: fstat failed: ", ErrnoString(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd: a ", FileTypeName(st.st_mode),
                     " cannot be registered; pass a memfd or a POSIX shared-memory object"));
  }
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fd: fstatfs failed: ", ErrnoString(errno)));
  }
  const bool hugetlb = static_cast<uint64_t>(fs.f_type) == HUGETLBFS_MAGIC;
  if (static_cast<uint64_t>(fs.f_type) != TMPFS_MAGIC && !hugetlb) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fd: the file is on a filesystem of type 0x%x; only memory (tmpfs, hugetlbfs: a memfd "
        "or a POSIX shared-memory object) can be registered",
        static_cast<uint64_t>(fs.f_type)));
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::PermissionDeniedError(
        "fd: the descriptor is not open for reading and writing (O_RDWR)");
  }
  const int seals = fcntl(fd, F_GET_SEALS);  // < 0: not a sealable file
  if (seals > 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::PermissionDeniedError("fd: the object is sealed against writes");
  }
  Inspected out;
  out.info.size = static_cast<uint64_t>(st.st_size);
  out.info.sealed = seals > 0 && (seals & F_SEAL_SHRINK) != 0;
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  out.alignment = hugetlb ? std::max<uint64_t>(page, static_cast<uint64_t>(st.st_blksize)) : page;
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostFdMapper>> HostFdMapper::Create() {
  RETURN_IF_ERROR(SigbusGuard::Install());
  return std::unique_ptr<HostFdMapper>(new HostFdMapper());
}

absl::StatusOr<core::FdInfo> HostFdMapper::Inspect(int fd) const {
  ASSIGN_OR_RETURN(Inspected inspected, InspectFd(fd));
  return inspected.info;
}

absl::StatusOr<std::unique_ptr<core::MappedRegion>> HostFdMapper::Map(
    const core::RegionSpec& spec) {
  const auto* fd_spec = std::get_if<core::FdRegionSpec>(&spec);
  if (fd_spec == nullptr || fd_spec->kind != core::FdKind::kHostMemory) {
    return absl::InvalidArgumentError(absl::StrCat("the host memory mapper cannot map a ",
                                                   core::RegionKindName(spec), " region"));
  }
  const uint64_t offset = fd_spec->offset;
  const uint64_t size = fd_spec->size;
  if (!fd_spec->device_uuid.empty()) {
    return absl::InvalidArgumentError(
        "fd.device_uuid is set, but the descriptor is host memory (FD_KIND_HOST_MEMORY)");
  }
  if (fd_spec->allocation_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd.allocation_size is ", fd_spec->allocation_size,
                     ", but the descriptor is host memory (FD_KIND_HOST_MEMORY): it must be 0"));
  }
  if (!fd_spec->segments.empty()) {
    return absl::InvalidArgumentError(
        "fd.segments is set, but the descriptor is host memory (FD_KIND_HOST_MEMORY)");
  }
  if (size == 0) return absl::InvalidArgumentError("fd.size must be > 0");
  if (size > UINT64_MAX - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("fd.offset ", offset, " + fd.size ", size, " overflows a 64-bit integer"));
  }
  const int fd = fd_spec->fd != nullptr ? fd_spec->fd->get() : -1;
  ASSIGN_OR_RETURN(Inspected inspected, InspectFd(fd));
  if (offset + size > inspected.info.size) {
    return absl::OutOfRangeError(absl::StrCat("fd.offset ", offset, " + fd.size ", size, " = ",
                                              offset + size, " exceeds the object's size (",
                                              inspected.info.size, " bytes)"));
  }
  // offset + size <= st_size <= INT64_MAX: the window fits off_t and size_t.
  const uint64_t align = inspected.alignment;
  const uint64_t aligned_offset = offset - offset % align;
  const auto delta = static_cast<size_t>(offset - aligned_offset);
  const uint64_t span = delta + size;
  const auto length = static_cast<size_t>((span + align - 1) / align * align);
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(aligned_offset));
  if (base == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of address space or mappings mapping ", length, " bytes"));
    }
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(
          absl::StrCat("fd: the object cannot be mapped read-write: ", ErrnoString(err)));
    }
    return absl::InternalError(absl::StrCat("mmap of ", length, " bytes at offset ", aligned_offset,
                                            ": ", ErrnoString(err)));
  }
  absl::StatusOr<SigbusGuard::Slot> slot = SigbusGuard::Register(base, length);
  if (!slot.ok()) {
    munmap(base, length);
    return slot.status();
  }
  return std::make_unique<FdRegion>(base, length, delta, size, inspected.info.sealed,
                                    *std::move(slot));
}

}  // namespace tokensel::memory
