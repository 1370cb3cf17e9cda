// Memory regions that clients register: the seam between the registry and
// the ways of mapping memory (server/memory: POSIX shm, CUDA IPC).
#ifndef TOKENSEL_SERVER_CORE_REGION_H_
#define TOKENSEL_SERVER_CORE_REGION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokensel::core {

enum class MemoryKind : uint8_t { kHost, kCudaDevice };

struct HostShmSpec {
  std::string shm_name;  // as given to shm_open, e.g. "/tokensel-w0-acts"
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct CudaIpcSpec {
  std::string handle;  // exactly 64 bytes (cudaIpcMemHandle_t of the allocation base)
  std::string device_uuid;
  uint64_t offset = 0;
  uint64_t size = 0;
};

using RegionSpec = std::variant<HostShmSpec, CudaIpcSpec>;

// "host_shm" or "cuda_ipc".
absl::string_view RegionKindName(const RegionSpec& spec);

// A mapped region [data, data + size). Unmapped when destroyed. Immutable
// after construction, so any thread may read it.
class MappedRegion {
 public:
  virtual ~MappedRegion() = default;
  virtual void* data() const = 0;
  virtual uint64_t size() const = 0;
  virtual MemoryKind memory_kind() const = 0;
  virtual std::string device_uuid() const { return {}; }
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
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_REGION_H_
