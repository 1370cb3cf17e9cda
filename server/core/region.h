// Memory regions that clients register: the seam between the registry and
// the ways of mapping memory (server/memory: POSIX shm, CUDA IPC).
#ifndef TOKENSEL_SERVER_CORE_REGION_H_
#define TOKENSEL_SERVER_CORE_REGION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"
#include "server/core/fd_channel.h"

namespace tokensel::core {

enum class MemoryKind : uint8_t { kHost, kCudaDevice };

// Memory the caller passed as a file descriptor over the fd channel
// (fd_channel.h): [offset, offset + size) of the object behind `fd`. There is
// deliberately no spec that names memory: the server never opens an object
// with its own rights on a client's behalf.
// One physical allocation of a CUDA VMM buffer that spans several
// (FdRegionSpec::segments; PassedFd.segments).
struct VmmSegmentSpec {
  std::shared_ptr<const UniqueFd> fd;
  uint64_t allocation_size = 0;  // > 0: the allocation's size as the client states it
};

// The most allocations one VMM buffer may span (PassedFd.segments). Each
// needs an fd ticket waiting at registration, so the fd channel's
// per-session ticket limit (FdTicketLimits::max_per_session) is at least
// this. 128 PyTorch large-pool chunks of 20 MiB are 2.5 GiB.
inline constexpr size_t kMaxVmmSegments = 128;

struct FdRegionSpec {
  std::shared_ptr<const UniqueFd> fd;
  FdKind kind = FdKind::kHostMemory;
  uint64_t offset = 0;
  uint64_t size = 0;
  // kCudaVmm: the GPU the allocation lives on, by UUID (as CudaIpcSpec);
  // must be empty for host memory.
  std::string device_uuid;
  // kCudaVmm: the whole allocation's size as the client states it (0 =
  // unknown); must be 0 for host memory.
  uint64_t allocation_size = 0;
  // kCudaVmm only, when the buffer spans several allocations: mapped back to
  // back in this order, and [offset, offset + size) counts from the first
  // one's start. When set, `fd` is null and `allocation_size` 0 (the
  // segments supersede them); empty for the single-allocation form.
  std::vector<VmmSegmentSpec> segments;
  // kCudaVmm: the registering peer's principal (Peer::Principal(), set by
  // the front end; empty: unknown, tests). Its deferred teardowns count in
  // that peer's share of the device's FreeGate (free_gate.h, ReserveFor).
  std::string owner;
};

struct CudaIpcSpec {
  std::string handle;  // exactly 64 bytes (cudaIpcMemHandle_t of the allocation base)
  std::string device_uuid;
  uint64_t offset = 0;
  uint64_t size = 0;
  // The registering peer's principal (as FdRegionSpec::owner, set by the
  // front end): a handle this registration opens counts in that peer's
  // share of the device's FreeGate until its close ran (review2 of the
  // seventh session, finding 1).
  std::string owner;
};

using RegionSpec = std::variant<FdRegionSpec, CudaIpcSpec>;

// "host_shm" (host memory by fd), "cuda_vmm" or "cuda_ipc": the kind a
// BufferInfo reports.
absl::string_view RegionKindName(const RegionSpec& spec);

// What a received descriptor is, as its mapper sees it (RegionMapper::Inspect).
struct FdInfo {
  uint64_t size = 0;    // the object's size now
  bool sealed = false;  // it cannot shrink (F_SEAL_SHRINK)
};

// A mapped region [data, data + size). Unmapped when destroyed. Immutable
// after construction, so any thread may read it.
class MappedRegion {
 public:
  virtual ~MappedRegion() = default;
  virtual void* data() const = 0;
  virtual uint64_t size() const = 0;
  virtual MemoryKind memory_kind() const = 0;
  virtual std::string device_uuid() const { return {}; }
  // Host memory that cannot shrink under the server (a sealed memfd).
  virtual bool sealed() const { return false; }
  // True once an access found the memory gone (the owner truncated the
  // object under the mapping): the region now reads zeros and swallows
  // writes, and whatever used it since has undefined results. Set from a
  // signal handler; any thread may read it.
  virtual bool faulted() const { return false; }
};

// Maps one kind of region. Implementations validate everything about the
// spec (names, ownership, handle size, offset + size overflow and bounds)
// and return precise errors: INVALID_ARGUMENT (malformed), NOT_FOUND (no
// such object), PERMISSION_DENIED (not allowed), OUT_OF_RANGE (offset/size
// past the object), FAILED_PRECONDITION (no device / wrong device).
// Thread-safe.
class RegionMapper {
 public:
  virtual ~RegionMapper() = default;
  virtual absl::StatusOr<std::unique_ptr<MappedRegion>> Map(const RegionSpec& spec) = 0;
  // Mappers of descriptors (FdRegionSpec): checks a descriptor as it arrives
  // on the fd channel, before a ticket is issued for it, with the errors Map
  // would give. Does not take ownership. Other mappers: UNIMPLEMENTED.
  virtual absl::StatusOr<FdInfo> Inspect(int fd) const;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_REGION_H_
