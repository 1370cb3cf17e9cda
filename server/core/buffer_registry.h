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
  std::string kind;  // "host_shm" | "cuda_ipc"
  uint64_t size = 0;
  std::string device_uuid;
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
  // `host_shm` and `cuda_ipc` map the two kinds of region; either may be null
  // (that kind is then FAILED_PRECONDITION). `metrics` may be null.
  BufferRegistry(RegionMapper* host_shm, RegionMapper* cuda_ipc, uint32_t max_buffers_per_session,
                 ServiceMetrics* metrics);
  ~BufferRegistry();

  // INVALID_ARGUMENT: bad name; ALREADY_EXISTS: name taken in this session;
  // RESOURCE_EXHAUSTED: max_buffers_per_session; mapper errors as returned.
  absl::StatusOr<BufferInfo> Register(const std::string& session, const std::string& name,
                                      const RegionSpec& spec);
  // NOT_FOUND if the session has no such buffer.
  absl::Status Unregister(const std::string& session, const std::string& name);
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

  RegionMapper* const host_shm_;
  RegionMapper* const cuda_ipc_;
  const uint32_t max_buffers_per_session_;
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
