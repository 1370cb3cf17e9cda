// BufferRegistry: the named buffers of every session, handed out as leases.
//
// Acquire() returns a shared_ptr lease; Unregister() removes the name at once
// but the mapping lives until the last lease is released, so an op in flight
// never loses its memory (deferred unregister). Names are unique within a
// session; a session can only use its own buffers.
//
// Thread-safe; every method is O(log n) under one mutex except mapping,
// which happens outside it.
#ifndef TOKENSEL_SERVER_CORE_BUFFER_REGISTRY_H_
#define TOKENSEL_SERVER_CORE_BUFFER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "server/core/region.h"

namespace tokensel::core {

class ServiceMetrics;

struct BufferInfo {
  std::string name;
  std::string kind;  // "host_shm" | "cuda_ipc" | "cuda_vmm"
  uint64_t size = 0;
  std::string device_uuid;
  bool sealed = false;  // host memory that cannot shrink
};

struct RegistryLimits {
  uint32_t max_buffers_per_session = 1024;
  // Buffers (= mappings) across all sessions: bounds the process's memory
  // maps (vm.max_map_count) whatever the number of sessions.
  uint32_t max_buffers = 16384;
};

// A registered buffer; a shared_ptr<const Buffer> is a lease.
class Buffer {
 public:
  Buffer(BufferInfo info, std::unique_ptr<MappedRegion> region)
      : info_(std::move(info)), region_(std::move(region)) {}
  const BufferInfo& info() const { return info_; }
  const MappedRegion& region() const { return *region_; }

 private:
  BufferInfo info_;
  std::unique_ptr<MappedRegion> region_;
};
using BufferLease = std::shared_ptr<const Buffer>;

class BufferRegistry {
 public:
  // `host` maps FdRegionSpec of kind kHostMemory, `cuda_ipc` CudaIpcSpec,
  // `cuda_vmm` FdRegionSpec of kind kCudaVmm; any may be null (that kind is
  // then FAILED_PRECONDITION). Every kind counts against the same buffer
  // limits. `metrics` may be null.
  BufferRegistry(RegionMapper* host, RegionMapper* cuda_ipc, RegistryLimits limits,
                 ServiceMetrics* metrics);
  BufferRegistry(RegionMapper* host, RegionMapper* cuda_ipc, RegionMapper* cuda_vmm,
                 RegistryLimits limits, ServiceMetrics* metrics);
  ~BufferRegistry();

  // INVALID_ARGUMENT: bad name; ALREADY_EXISTS: name taken in this session;
  // RESOURCE_EXHAUSTED: the session's or the server's buffer limit; mapper
  // errors as returned.
  absl::StatusOr<BufferInfo> Register(const std::string& session, const std::string& name,
                                      const RegionSpec& spec);
  // NOT_FOUND if the session has no such buffer.
  absl::Status Unregister(const std::string& session, const std::string& name);
  // Unregisters `name` only if `lease` is what is registered under it (the
  // buffer was not replaced meanwhile); returns whether it did.
  bool UnregisterIfCurrent(const std::string& session, const std::string& name,
                           const BufferLease& lease);
  // NOT_FOUND if nobody registered `name`; PERMISSION_DENIED if only other
  // sessions did.
  absl::StatusOr<BufferLease> Acquire(const std::string& session, const std::string& name) const;
  std::vector<BufferInfo> List(const std::string& session) const;
  // Unregisters every buffer of the session (session closed or expired).
  void UnregisterAll(const std::string& session);

  size_t buffer_count() const;
  uint64_t registered_bytes() const;

 private:
  using Key = std::pair<std::string, std::string>;  // (session, name)
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Unregisters (session, name) if registered and, with `only` non-null, if
  // it is that buffer; returns whether it did.
  bool UnregisterMatching(const std::string& session, const std::string& name, const Buffer* only);
  // The mapper for `spec`, or null.
  RegionMapper* MapperFor(const RegionSpec& spec) const;

  RegionMapper* const host_;
  RegionMapper* const cuda_ipc_;
  RegionMapper* const cuda_vmm_;
  const RegistryLimits limits_;
  ServiceMetrics* const metrics_;
  mutable tokensel::Mutex mu_;
  std::map<Key, BufferLease> buffers_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, std::string> owners_ ABSL_GUARDED_BY(mu_);  // name -> session
  std::map<std::string, uint32_t> per_session_ ABSL_GUARDED_BY(mu_);
  uint64_t registered_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Valid buffer names: 1..128 chars of [A-Za-z0-9_.:/-].
absl::Status ValidateBufferName(absl::string_view name);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_BUFFER_REGISTRY_H_
