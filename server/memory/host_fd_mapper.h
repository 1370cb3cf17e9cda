// HostFdMapper: maps host memory a co-located client handed over as a file
// descriptor on the fd channel (RegionSpec = core::FdRegionSpec of kind
// kHostMemory).
//
// The descriptor is the proof of access: the client opened (or memfd_create'd)
// the object itself, so the server maps exactly what the client could map and
// never opens anything by name with its own rights. What a client could still
// use against the server is refused, by Inspect (when the descriptor arrives)
// and again by Map (when it is registered):
//   - anything but a regular file on tmpfs or hugetlbfs (memfd, POSIX shm,
//     a file in /dev/shm): INVALID_ARGUMENT. A file on a disk, NFS or FUSE
//     filesystem would let page faults in the server's op threads wait on
//     I/O the client controls; pipes, sockets and devices cannot be mapped.
//   - a descriptor not open for reading and writing, or write-sealed
//     (F_SEAL_WRITE / F_SEAL_FUTURE_WRITE): PERMISSION_DENIED.
// Map also checks size > 0 (INVALID_ARGUMENT) and that [offset, offset +
// size) lies inside the object as it is now, without overflow (OUT_OF_RANGE),
// then maps the page-aligned window covering it MAP_SHARED read/write (the
// descriptor is not kept; the mapping outlives it and an unlink).
//
// Truncation. An object sealed with F_SEAL_SHRINK (what the tokensel clients
// create: memfds with MFD_ALLOW_SEALING) cannot shrink; seals are never
// removed, so this holds for the mapping's life. Any other object may be
// truncated by its owner under the mapping, and touching the lost pages
// raises SIGBUS: every window is registered with SigbusGuard, which absorbs
// the fault (zero pages) and marks the region faulted() for the executor,
// which fails the op and unregisters the buffer. Hugetlb windows are guarded
// the same way (a huge page that cannot be allocated also faults).
//
// Memory accounting: pages of a tmpfs object that the server is first to
// touch are charged to the server's memory cgroup. Clients should allocate
// their objects (fallocate, or by writing them) before registering; the
// tokensel clients do.
//
// Thread-safe: no mutable state (SigbusGuard locks its own table).
#ifndef TOKENSEL_SERVER_MEMORY_HOST_FD_MAPPER_H_
#define TOKENSEL_SERVER_MEMORY_HOST_FD_MAPPER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "server/core/region.h"

namespace tokensel::memory {

class HostFdMapper final : public core::RegionMapper {
 public:
  // INTERNAL if the SIGBUS guard cannot be installed.
  static absl::StatusOr<std::unique_ptr<HostFdMapper>> Create();

  absl::StatusOr<core::FdInfo> Inspect(int fd) const override;
  absl::StatusOr<std::unique_ptr<core::MappedRegion>> Map(const core::RegionSpec& spec) override;

 private:
  HostFdMapper() = default;
};

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_HOST_FD_MAPPER_H_
