// HostShmMapper: maps POSIX shared-memory objects that co-located workers
// register (RegionSpec = core::HostShmSpec), for servers without a GPU or
// for host-side buffers.
//
// Policy, checked before anything is mapped:
//   - shm_name starts with '/' and with the configured prefix, contains no
//     other '/', no "..", no NUL byte, and is at most NAME_MAX bytes after
//     the leading '/'.
//   - The object is opened with shm_open(O_RDWR | O_NOFOLLOW | O_CLOEXEC):
//     a symlink is refused (glibc opens /dev/shm/<name>, so O_NOFOLLOW
//     applies to the object itself).
//   - fstat on the opened descriptor (no check-then-open race): it must be
//     a regular file owned by one of the trusted uids.
//   - [offset, offset + size) must lie inside the object; size > 0.
// Only the page-aligned window covering [offset, offset + size) is mapped
// (MAP_SHARED, read/write); the descriptor is closed right after mmap. The
// mapping stays valid if the owner unlinks the object meanwhile. If the
// owner truncates the object below the mapped window, accesses fault
// (SIGBUS): trusted owners must not shrink registered objects.
//
// Errors (messages name the field and the values):
//   INVALID_ARGUMENT   not a HostShmSpec; malformed name; size == 0
//   PERMISSION_DENIED  name outside the prefix; symlink; not a regular
//                      object (directory, FIFO, ...); untrusted owner;
//                      EACCES/EPERM from shm_open
//   NOT_FOUND          no such object
//   OUT_OF_RANGE       offset + size overflows or exceeds the object size
//   RESOURCE_EXHAUSTED out of descriptors or address space
//   FAILED_PRECONDITION the mapper's own prefix is invalid
//   INTERNAL           any other system error
//
// Thread-safe: Map keeps no mutable state.
#ifndef TOKENSEL_SERVER_MEMORY_HOST_SHM_MAPPER_H_
#define TOKENSEL_SERVER_MEMORY_HOST_SHM_MAPPER_H_

#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/region.h"

namespace tokensel::memory {

struct HostShmMapperOptions {
  // Every shm_name must start with this. It must itself start with '/' and
  // contain no other '/' and no "..".
  std::string prefix = "/tokensel";
  // Owners whose objects may be mapped. Default: the server's effective uid.
  // Empty = nobody (every registration is PERMISSION_DENIED).
  std::vector<uid_t> trusted_uids = {::geteuid()};
};

class HostShmMapper final : public core::RegionMapper {
 public:
  explicit HostShmMapper(HostShmMapperOptions options = {});

  // OK if `prefix` is usable as a shm prefix (see HostShmMapperOptions);
  // INVALID_ARGUMENT naming the problem otherwise. Call at startup to reject
  // a bad --shm_prefix early; Map re-checks (FAILED_PRECONDITION).
  static absl::Status ValidatePrefix(absl::string_view prefix);

  // The checks of the name alone (no system calls), as Map applies them.
  absl::Status ValidateName(absl::string_view shm_name) const;

  absl::StatusOr<std::unique_ptr<core::MappedRegion>> Map(const core::RegionSpec& spec) override;

  const HostShmMapperOptions& options() const { return options_; }

 private:
  const HostShmMapperOptions options_;
};

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_HOST_SHM_MAPPER_H_
