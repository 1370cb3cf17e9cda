#include "server/memory/host_shm_mapper.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tokensel::memory {
namespace {

// A window of a shm object mapped MAP_SHARED; data() is `delta` bytes into
// the page-aligned mapping.
class ShmRegion final : public core::MappedRegion {
 public:
  ShmRegion(void* base, size_t length, size_t delta, uint64_t size)
      : base_(base), length_(length), delta_(delta), size_(size) {}
  ~ShmRegion() override {
    if (munmap(base_, length_) != 0) {
      TS_LOG(ERROR) << "munmap(" << base_ << ", " << length_ << "): " << std::strerror(errno);
    }
  }
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  void* data() const override { return static_cast<char*>(base_) + delta_; }
  uint64_t size() const override { return size_; }
  core::MemoryKind memory_kind() const override { return core::MemoryKind::kHost; }

 private:
  void* const base_;
  const size_t length_;
  const size_t delta_;
  const uint64_t size_;
};

// Closes a descriptor on every return path.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  const int fd_;
};

absl::Status OpenError(int err, absl::string_view name) {
  const std::string field = absl::StrCat("host_shm.shm_name \"", name, "\"");
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(absl::StrCat(field, ": no such shared-memory object"));
    case ELOOP:
      return absl::PermissionDeniedError(
          absl::StrCat(field, " is a symlink; only regular shm objects can be registered"));
    case EISDIR:
    case EINVAL:  // glibc's shm_open reports a directory as EINVAL
      return absl::PermissionDeniedError(
          absl::StrCat(field, " is a directory, not a regular shm object"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": permission denied opening it read-write"));
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(absl::StrCat(field, " is not a valid shm name"));
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(
          absl::StrCat("out of file descriptors opening ", field));
    default:
      return absl::InternalError(absl::StrCat("shm_open ", field, ": ", std::strerror(err)));
  }
}

absl::Status CheckBounds(uint64_t offset, uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("host_shm.size must be > 0");
  if (size > UINT64_MAX - offset) {
    return absl::OutOfRangeError(absl::StrCat("host_shm.offset ", offset, " + host_shm.size ",
                                              size, " overflows a 64-bit integer"));
  }
  return absl::OkStatus();
}

}  // namespace

HostShmMapper::HostShmMapper(HostShmMapperOptions options) : options_(std::move(options)) {}

absl::Status HostShmMapper::ValidatePrefix(absl::string_view prefix) {
  if (prefix.empty() || prefix[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("shm prefix \"", prefix, "\" must start with '/'"));
  }
  if (prefix.find('/', 1) != absl::string_view::npos || absl::StrContains(prefix, "..") ||
      prefix.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm prefix \"", prefix, "\" must not contain '/' after the first byte, \"..\" or NUL"));
  }
  if (prefix.size() - 1 > NAME_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm prefix is ", prefix.size(), " bytes; at most ", NAME_MAX + 1));
  }
  return absl::OkStatus();
}

absl::Status HostShmMapper::ValidateName(absl::string_view name) const {
  if (!ValidatePrefix(options_.prefix).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the server's shm prefix \"", options_.prefix, "\" is invalid; host_shm is disabled"));
  }
  if (name.empty()) return absl::InvalidArgumentError("host_shm.shm_name is empty");
  if (name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("host_shm.shm_name contains a NUL byte");
  }
  if (name[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("host_shm.shm_name \"", name, "\" must start with '/'"));
  }
  if (name.size() == 1) {
    return absl::InvalidArgumentError("host_shm.shm_name \"/\" names no object");
  }
  if (name.size() - 1 > NAME_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("host_shm.shm_name is ", name.size(),
                                                   " bytes; at most ", NAME_MAX + 1));
  }
  if (name.find('/', 1) != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_shm.shm_name \"", name, "\" must not contain '/' after the first byte"));
  }
  if (absl::StrContains(name, "..")) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_shm.shm_name \"", name, "\" must not contain \"..\""));
  }
  if (!absl::StartsWith(name, options_.prefix)) {
    return absl::PermissionDeniedError(absl::StrCat("host_shm.shm_name \"", name,
                                                    "\" is outside the server's shm prefix \"",
                                                    options_.prefix, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<core::MappedRegion>> HostShmMapper::Map(
    const core::RegionSpec& spec) {
  const auto* shm = std::get_if<core::HostShmSpec>(&spec);
  if (shm == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the host_shm mapper cannot map a ", core::RegionKindName(spec), " region"));
  }
  RETURN_IF_ERROR(ValidateName(shm->shm_name));
  RETURN_IF_ERROR(CheckBounds(shm->offset, shm->size));

  const std::string& name = shm->shm_name;
  const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) return OpenError(errno, name);
  FdCloser closer(fd);

  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(
        absl::StrCat("fstat host_shm.shm_name \"", name, "\": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat("host_shm.shm_name \"", name, "\" is not a regular shm object"));
  }
  const auto& trusted = options_.trusted_uids;
  if (std::find(trusted.begin(), trusted.end(), st.st_uid) == trusted.end()) {
    TS_LOG(WARNING) << "refused shm object " << name << " owned by uid " << st.st_uid;
    return absl::PermissionDeniedError(absl::StrCat("host_shm.shm_name \"", name,
                                                    "\" is owned by uid ", st.st_uid,
                                                    ", which the server does not trust"));
  }
  const uint64_t object_size = static_cast<uint64_t>(st.st_size);
  if (shm->offset + shm->size > object_size) {
    return absl::OutOfRangeError(absl::StrCat(
        "host_shm.offset ", shm->offset, " + host_shm.size ", shm->size, " = ",
        shm->offset + shm->size, " exceeds the size of \"", name, "\" (", object_size,
        " bytes)"));
  }

  // offset + size <= st_size <= INT64_MAX, so the window fits off_t and size_t.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned_offset = shm->offset - shm->offset % page;
  const size_t delta = static_cast<size_t>(shm->offset - aligned_offset);
  const size_t length = delta + static_cast<size_t>(shm->size);
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(aligned_offset));
  if (base == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of address space mapping ", length, " bytes of \"", name, "\""));
    }
    return absl::InternalError(absl::StrCat("mmap host_shm.shm_name \"", name, "\" (", length,
                                            " bytes at ", aligned_offset,
                                            "): ", std::strerror(err)));
  }
  return std::make_unique<ShmRegion>(base, length, delta, shm->size);
}

}  // namespace tokensel::memory
