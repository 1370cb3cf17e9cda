// IpcEventCache (contract: ipc_event_cache.h).
#include "server/backends/ipc_event_cache.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/core/backend.h"

namespace tokensel::backends {

absl::StatusOr<std::shared_ptr<IpcEvent>> IpcEventCache::Get(const std::string& session,
                                                             absl::string_view handle,
                                                             absl::string_view field) {
  if (handle.size() != core::IpcEvents::kHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", handle.size(),
                                                   " bytes; a cudaIpcEventHandle_t is exactly ",
                                                   core::IpcEvents::kHandleBytes));
  }
  const std::string key(handle);
  std::shared_ptr<IpcEvent> dropped;  // destroyed after the lock is released
  tokensel::MutexLock lock(&mu_);
  // Only this session's entries: an event another session opened for the
  // same bytes is never handed out here (ipc_event_cache.h).
  if (auto s = sessions_.find(session); s != sessions_.end()) {
    Lru& lru = s->second;
    for (auto it = lru.begin(); it != lru.end(); ++it) {
      if (it->first == key) {
        lru.splice(lru.begin(), lru, it);
        return lru.front().second;
      }
    }
  }
  // Nothing is added (no entry, no session) if the open fails.
  ASSIGN_OR_RETURN(const StreamDevice::Event opened, device_->OpenIpcEvent(handle, field));
  auto event = std::make_shared<IpcEvent>(device_, opened);
  ++opens_;
  // Not live (ended meanwhile, or never begun: ipc_event_cache.h): this
  // request's event alone, not cached (no entry would ever be removed).
  auto live = sessions_.find(session);
  if (live == sessions_.end()) return event;
  Lru& lru = live->second;
  lru.emplace_front(key, event);
  if (lru.size() > per_session_) {
    dropped = std::move(lru.back().second);
    lru.pop_back();
  }
  // `dropped` may be the last reference: it is destroyed when this returns,
  // after `lock` (declared after it) has released the mutex.
  return event;
}

void IpcEventCache::BeginSession(const std::string& session) {
  tokensel::MutexLock lock(&mu_);
  sessions_.try_emplace(session);
}

void IpcEventCache::EndSession(const std::string& session) {
  Lru dropped;  // destroyed (the events released) after the lock is released
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  dropped.swap(it->second);
  sessions_.erase(it);
}

size_t IpcEventCache::cached(const std::string& session) const {
  tokensel::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : it->second.size();
}

size_t IpcEventCache::live_sessions() const {
  tokensel::MutexLock lock(&mu_);
  return sessions_.size();
}

size_t IpcEventCache::opens() const {
  tokensel::MutexLock lock(&mu_);
  return opens_;
}

}  // namespace tokensel::backends
