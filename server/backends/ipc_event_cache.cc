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
  // Destroyed after the lock is released: a dropped LRU entry, or the
  // extra event of a lost race (below). Declared before the lock scopes.
  std::shared_ptr<IpcEvent> dropped;
  std::shared_ptr<IpcEvent> extra;
  {
    tokensel::MutexLock lock(&mu_);
    if (std::shared_ptr<IpcEvent> hit = FindLocked(session, key)) return hit;
  }
  // The open (cudaIpcOpenEventHandle of the client's bytes, and on an error
  // the probe) runs with no lock held (the seventh review): the driver may
  // be slow on it (a first open, an exporter that is exiting), and
  // BeginSession / EndSession take this lock from SessionManager's paths,
  // so a lock held here would stall every Open and, behind it, every
  // request's session Touch on every device. Two Gets of one session and
  // handle may both open; the first to insert wins, the other's event is
  // destroyed unused (opening one event handle twice is allowed:
  // ipc_event_cache.h). Nothing is added (no entry, no session) if the
  // open fails.
  ASSIGN_OR_RETURN(const StreamDevice::Event opened, device_->OpenIpcEvent(handle, field));
  auto event = std::make_shared<IpcEvent>(device_, opened);
  tokensel::MutexLock lock(&mu_);
  ++opens_;
  // Not live (ended meanwhile, or never begun: ipc_event_cache.h): this
  // request's event alone, not cached (no entry would ever be removed).
  auto live = sessions_.find(session);
  if (live == sessions_.end()) return event;
  if (std::shared_ptr<IpcEvent> first = FindLocked(session, key)) {
    extra = std::move(event);
    return first;
  }
  Lru& lru = live->second;
  lru.emplace_front(key, event);
  if (lru.size() > per_session_) {
    dropped = std::move(lru.back().second);
    lru.pop_back();
  }
  // `dropped` / `extra` may be the last references: they are destroyed
  // when this returns, after `lock` (declared after them) has released the
  // mutex.
  return event;
}

std::shared_ptr<IpcEvent> IpcEventCache::FindLocked(const std::string& session,
                                                    const std::string& key) {
  // Only this session's entries: an event another session opened for the
  // same bytes is never handed out here (ipc_event_cache.h).
  auto s = sessions_.find(session);
  if (s == sessions_.end()) return nullptr;
  Lru& lru = s->second;
  for (auto it = lru.begin(); it != lru.end(); ++it) {
    if (it->first == key) {
      lru.splice(lru.begin(), lru, it);
      return lru.front().second;
    }
  }
  return nullptr;
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
