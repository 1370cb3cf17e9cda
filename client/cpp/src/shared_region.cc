#include "tokensel/client/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tokensel/client/fd_channel.h"

namespace tokensel::client {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view call, absl::string_view name) {
  const std::string message = absl::StrCat(call, " ", name, ": ", std::strerror(err));
  switch (err) {
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CheckName(absl::string_view name, absl::string_view required_prefix) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != absl::string_view::npos ||
      name.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm name \"", name, "\" must be \"/\" followed by 1..254 characters without '/'"));
  }
  if (!absl::StartsWith(name, required_prefix)) {
    return absl::InvalidArgumentError(absl::StrCat("shm name \"", name,
                                                   "\" does not start with the server's prefix \"",
                                                   required_prefix, "\""));
  }
  return absl::OkStatus();
}

// Maps `fd` read-write (closes it on failure).
absl::StatusOr<uint8_t*> MapFd(int fd, uint64_t size, absl::string_view name) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "mmap", name);
  }
  return static_cast<uint8_t*>(p);
}

// Gives `fd` its pages now, charged to this process (a first touch by the
// server would charge them to the server's memory cgroup), and fails early
// when the memory is not there.
absl::Status Allocate(int fd, uint64_t size, absl::string_view name) {
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err == 0 || err == EOPNOTSUPP) return absl::OkStatus();
  if (err == ENOSPC || err == ENOMEM) {
    return absl::ResourceExhaustedError(
        absl::StrCat("fallocate ", name, ": ", size, " bytes: ", std::strerror(err)));
  }
  return ErrnoStatus(err, "fallocate", name);
}

}  // namespace

absl::StatusOr<SharedRegion> SharedRegion::Create(std::string name, uint64_t size,
                                                  SharedRegionOptions options) {
  absl::Status status = CheckName(name, options.required_prefix);
  if (!status.ok()) return status;
  if (size == 0 || size > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm ", name, ": size ", size, " must be in [1, 2^63)"));
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, "shm_open", name);
  absl::Status sized = ftruncate(fd, static_cast<off_t>(size)) == 0
                           ? Allocate(fd, size, name)
                           : ErrnoStatus(errno, "ftruncate", name);
  if (!sized.ok()) {
    close(fd);
    shm_unlink(name.c_str());
    return sized;
  }
  absl::StatusOr<uint8_t*> data = MapFd(fd, size, name);
  if (!data.ok()) {
    shm_unlink(name.c_str());
    return data.status();
  }
  SharedRegion region;
  region.name_ = std::move(name);
  region.size_ = size;
  region.data_ = *data;
  region.fd_ = fd;
  region.unlink_ = options.unlink_on_destroy;
  return region;
}

absl::StatusOr<SharedRegion> SharedRegion::CreateSealed(absl::string_view label, uint64_t size) {
  if (label.size() > 200) {
    return absl::InvalidArgumentError(
        absl::StrCat("memfd label is ", label.size(), " characters; at most 200"));
  }
  if (size == 0 || size > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("memfd ", label, ": size ", size, " must be in [1, 2^63)"));
  }
  const std::string name = absl::StrCat("memfd:", label);
  const int fd =
      memfd_create(absl::StrCat("tokensel-", label).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoStatus(errno, "memfd_create", name);
  absl::Status sized = ftruncate(fd, static_cast<off_t>(size)) == 0
                           ? Allocate(fd, size, name)
                           : ErrnoStatus(errno, "ftruncate", name);
  // Its size is fixed from now on: the server's mapping can never lose pages.
  if (sized.ok() && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    sized = ErrnoStatus(errno, "fcntl(F_ADD_SEALS)", name);
  }
  if (!sized.ok()) {
    close(fd);
    return sized;
  }
  absl::StatusOr<uint8_t*> data = MapFd(fd, size, name);
  if (!data.ok()) return data.status();
  SharedRegion region;
  region.name_ = name;
  region.size_ = size;
  region.data_ = *data;
  region.fd_ = fd;
  region.unlink_ = false;
  return region;
}

absl::StatusOr<SharedRegion> SharedRegion::Open(std::string name, SharedRegionOptions options) {
  absl::Status status = CheckName(name, options.required_prefix);
  if (!status.ok()) return status;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "shm_open", name);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "fstat", name);
  }
  if (st.st_size <= 0) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("shm ", name, " is empty"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  absl::StatusOr<uint8_t*> data = MapFd(fd, size, name);
  if (!data.ok()) return data.status();
  SharedRegion region;
  region.name_ = std::move(name);
  region.size_ = size;
  region.data_ = *data;
  region.fd_ = fd;
  region.unlink_ = false;
  return region;
}

std::string SharedRegion::UniqueName(absl::string_view prefix, absl::string_view tag) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(prefix, tag, "-", getpid(), "-", counter.fetch_add(1));
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept { *this = std::move(other); }

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::exchange(other.name_, std::string());
    size_ = std::exchange(other.size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    fd_ = std::exchange(other.fd_, -1);
    unlink_ = std::exchange(other.unlink_, false);
  }
  return *this;
}

SharedRegion::~SharedRegion() { Reset(); }

void SharedRegion::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  if (unlink_ && !name_.empty()) shm_unlink(name_.c_str());
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
  unlink_ = false;
  name_.clear();
}

v1::RegisterBufferRequest SharedRegion::RegisterRequest(std::string buffer_name, uint64_t offset,
                                                        uint64_t size) const {
  v1::RegisterBufferRequest request;
  request.set_name(std::move(buffer_name));
  v1::PassedFd* passed = request.mutable_fd();
  passed->set_ticket(LocalFdTicket(fd_));
  passed->set_offset(offset);
  passed->set_size(size != 0 ? size : (offset < size_ ? size_ - offset : 0));
  return request;
}

}  // namespace tokensel::client
