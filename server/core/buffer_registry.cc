#include "server/core/buffer_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {
namespace {

constexpr size_t kMaxNameLength = 128;

bool IsNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':' || c == '/' || c == '-';
}

}  // namespace

absl::Status ValidateBufferName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: is ", name.size(), " characters long, at most ", kMaxNameLength, " are allowed"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i])) {
      // The byte is printed as a code, never echoed: it may be anything.
      return absl::InvalidArgumentError(absl::StrFormat(
          "name: character %d (byte 0x%02x) is not allowed (use A-Z a-z 0-9 _ . : / -)", i,
          static_cast<unsigned char>(name[i])));
    }
  }
  return absl::OkStatus();
}

BufferRegistry::BufferRegistry(RegionMapper* host, RegionMapper* cuda_ipc, RegistryLimits limits,
                               ServiceMetrics* metrics)
    : BufferRegistry(host, cuda_ipc, nullptr, limits, metrics) {}

BufferRegistry::BufferRegistry(RegionMapper* host, RegionMapper* cuda_ipc, RegionMapper* cuda_vmm,
                               RegistryLimits limits, ServiceMetrics* metrics)
    : host_(host), cuda_ipc_(cuda_ipc), cuda_vmm_(cuda_vmm), limits_(limits), metrics_(metrics) {}

RegionMapper* BufferRegistry::MapperFor(const RegionSpec& spec) const {
  if (std::holds_alternative<CudaIpcSpec>(spec)) return cuda_ipc_;
  return std::get<FdRegionSpec>(spec).kind == FdKind::kHostMemory ? host_ : cuda_vmm_;
}

BufferRegistry::~BufferRegistry() = default;

absl::StatusOr<BufferInfo> BufferRegistry::Register(const std::string& session,
                                                    const std::string& name,
                                                    const RegionSpec& spec) {
  if (absl::Status s = ValidateBufferName(name); !s.ok()) return s;
  const absl::string_view kind = RegionKindName(spec);
  RegionMapper* mapper = MapperFor(spec);
  if (mapper == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(kind, ": this server cannot map ", kind, " buffers"));
  }
  const Key key(session, name);
  // Cheap early refusals, so a doomed request does not map anything. They
  // are checked again below, because mapping happens outside the lock.
  auto check_locked = [&]() -> absl::Status {  // mu_ held
    if (buffers_.count(key) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("name: buffer '", name, "' is already registered in this session"));
    }
    auto it = per_session_.find(session);
    if (it != per_session_.end() && it->second >= limits_.max_buffers_per_session) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "name: this session already has ", it->second,
          " buffers, the limit (max_buffers_per_session) is ", limits_.max_buffers_per_session));
    }
    if (buffers_.size() >= limits_.max_buffers) {
      return absl::ResourceExhaustedError(
          absl::StrCat("name: the server holds ", buffers_.size(),
                       " buffers of all sessions, its limit (max_buffers) is ", limits_.max_buffers,
                       "; retry after others unregister"));
    }
    return absl::OkStatus();
  };
  {
    tokensel::MutexLock lock(&mu_);
    if (absl::Status s = check_locked(); !s.ok()) return s;
  }

  absl::StatusOr<std::unique_ptr<MappedRegion>> region = mapper->Map(spec);
  if (!region.ok()) return region.status();
  BufferInfo info;
  info.name = name;
  info.kind = std::string(kind);
  info.size = (*region)->size();
  info.device_uuid = (*region)->device_uuid();
  info.sealed = (*region)->sealed();
  auto buffer = std::make_shared<const Buffer>(info, *std::move(region));

  absl::Status race;
  {
    tokensel::MutexLock lock(&mu_);
    race = check_locked();
    if (race.ok()) {
      buffers_.emplace(key, std::move(buffer));
      owners_.emplace(name, session);
      ++per_session_[session];
      registered_bytes_ += info.size;
      UpdateGaugesLocked();
    }
  }
  // Lost a race with another Register: our mapping is dropped on return,
  // outside the lock.
  if (!race.ok()) return race;
  TS_LOG(DEBUG) << "registered buffer '" << name << "' (" << info.kind << ", " << info.size
                << " bytes)";
  return info;
}

absl::Status BufferRegistry::Unregister(const std::string& session, const std::string& name) {
  return UnregisterMatching(session, name, nullptr)
             ? absl::OkStatus()
             : absl::NotFoundError(
                   absl::StrCat("name: no buffer '", name, "' is registered in this session"));
}

bool BufferRegistry::UnregisterIfCurrent(const std::string& session, const std::string& name,
                                         const BufferLease& lease) {
  return lease != nullptr && UnregisterMatching(session, name, lease.get());
}

bool BufferRegistry::UnregisterMatching(const std::string& session, const std::string& name,
                                        const Buffer* only) {
  BufferLease released;  // the mapping may be dropped here, outside the lock
  {
    tokensel::MutexLock lock(&mu_);
    auto it = buffers_.find(Key(session, name));
    if (it == buffers_.end() || (only != nullptr && it->second.get() != only)) return false;
    released = std::move(it->second);
    buffers_.erase(it);
    auto [begin, end] = owners_.equal_range(name);
    for (auto o = begin; o != end; ++o) {
      if (o->second == session) {
        owners_.erase(o);
        break;
      }
    }
    if (--per_session_[session] == 0) per_session_.erase(session);
    registered_bytes_ -= released->info().size;
    UpdateGaugesLocked();
  }
  return true;
}

absl::StatusOr<BufferLease> BufferRegistry::Acquire(const std::string& session,
                                                    const std::string& name) const {
  tokensel::MutexLock lock(&mu_);
  auto it = buffers_.find(Key(session, name));
  if (it != buffers_.end()) return it->second;
  if (owners_.count(name) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("buffer '", name, "' belongs to another session"));
  }
  return absl::NotFoundError(absl::StrCat("buffer '", name, "' is not registered"));
}

std::vector<BufferInfo> BufferRegistry::List(const std::string& session) const {
  std::vector<BufferInfo> out;
  tokensel::MutexLock lock(&mu_);
  // Keys are ordered by (session, name): the session's buffers are one run,
  // already sorted by name.
  for (auto it = buffers_.lower_bound(Key(session, std::string()));
       it != buffers_.end() && it->first.first == session; ++it) {
    out.push_back(it->second->info());
  }
  return out;
}

void BufferRegistry::UnregisterAll(const std::string& session) {
  std::vector<BufferLease> released;  // dropped outside the lock
  {
    tokensel::MutexLock lock(&mu_);
    auto it = buffers_.lower_bound(Key(session, std::string()));
    while (it != buffers_.end() && it->first.first == session) {
      const std::string& name = it->first.second;
      auto [begin, end] = owners_.equal_range(name);
      for (auto o = begin; o != end; ++o) {
        if (o->second == session) {
          owners_.erase(o);
          break;
        }
      }
      registered_bytes_ -= it->second->info().size;
      released.push_back(std::move(it->second));
      it = buffers_.erase(it);
    }
    per_session_.erase(session);
    UpdateGaugesLocked();
  }
  if (!released.empty()) {
    TS_LOG(DEBUG) << "unregistered " << released.size() << " buffers of an ended session";
  }
}

size_t BufferRegistry::buffer_count() const {
  tokensel::MutexLock lock(&mu_);
  return buffers_.size();
}

uint64_t BufferRegistry::registered_bytes() const {
  tokensel::MutexLock lock(&mu_);
  return registered_bytes_;
}

void BufferRegistry::UpdateGaugesLocked() {
  if (metrics_ == nullptr) return;
  metrics_->SetRegisteredBuffers(static_cast<double>(buffers_.size()));
  metrics_->SetRegisteredBytes(static_cast<double>(registered_bytes_));
}

}  // namespace tokensel::core
