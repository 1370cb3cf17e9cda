// IpcEventCache: the CUDA IPC events clients name in Execute (wait_event /
// record_event), opened on one device (StreamDevice::OpenIpcEvent, with
// that device current) and kept per session, so a client that reuses its
// events costs one cudaIpcOpenEventHandle per handle, not one per request.
//
// Bound: at most `per_session` (default 64) events per session; opening one
// more drops the session's least recently used (LRU, not an error: a client
// cycling through many events is served, it only pays the opens again).
// Live sessions only (the fifth review): the cache keeps events only for
// sessions it was told are live, between BeginSession (the server calls it
// when it opens the session, before the client learns its id) and
// EndSession (after the session ended: no new request can pass its session
// check). A Get for a session that is not live (a request that passed its
// session check just before the session ended: the client disconnected
// mid-request; or a session never begun) opens the event for that request
// alone, uncached (destroyed when the request lets go), and never creates
// an entry, which nothing would remove again (the fourth review: up to
// `per_session` opened events leaked per race). Exact, with no tombstones:
// an earlier version remembered the last 4096 ended sessions, so a Get
// delayed past 4096 other session ends still cached and leaked. The cache
// holds at most (live sessions) x `per_session` events, and one entry per
// live session. EndSession drops all of the session's events.
// A dropped event is destroyed when
// the last request still using it lets go (IpcEvent is shared with the
// chain and the queued work item): cudaEventDestroy of an event whose
// record is still pending is legal (the driver releases it once the record
// completes).
// Keyed by (session, handle): each session opens its own cudaEvent_t for a
// handle, even one another session named too. One session can therefore
// never use, destroy (by its end or its LRU) or observe (a cache hit, the
// open count) an event another session opened: what a session reaches is
// only what the driver opened for it, from its own bytes. The CUDA
// documentation states no limit on opening one event handle more than once
// in a process (each open returns an event that "behaves like a locally
// created event", destroyed with cudaEventDestroy); if a driver refused the
// second open, that session's request fails (classified as any error of a
// client's event: the device is marked failed only if the probe confirms)
// and other sessions are unaffected. The cost is one open per session and
// handle (at most `per_session` per session are kept).
//
// Trust (as server/memory/cuda_ipc_mapper.h for memory handles): the handle
// is a capability. The server cannot tell which process exported it (the 64
// bytes are opaque; the driver checks only that they name a live
// interprocess event of this node): a client may name any event whose
// handle it learnt. What the driver rejects (wrong length, not an
// interprocess event, its exporter gone, garbage) is INVALID_ARGUMENT naming
// the field; it never marks the device failed unless the driver reports a
// sticky error. Waiting on an event delays only the request that waits;
// recording one signals whoever waits on it, which is what knowing the
// handle allows anyway.
//
// Thread-safe. No driver call runs under the cache's lock (the seventh
// review: Get held it across OpenIpcEvent and its probe, and BeginSession,
// which SessionManager calls under its own lock, waited for it, so one
// client's slow open stalled every session Open and request): Get looks up,
// unlocks, opens, relocks and inserts; of two Gets of one session and
// handle that both opened, the first to insert is kept and the other's
// event destroyed (a second open of a handle is allowed, above). Events
// are destroyed outside the lock. The device outlives the cache and every
// IpcEvent.
#ifndef TOKENSEL_SERVER_BACKENDS_IPC_EVENT_CACHE_H_
#define TOKENSEL_SERVER_BACKENDS_IPC_EVENT_CACHE_H_

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "server/backends/stream_lease.h"

namespace tokensel::backends {

// One opened client event; destroyed (StreamDevice::DestroyEvent) with the
// last reference.
class IpcEvent {
 public:
  IpcEvent(StreamDevice* device, StreamDevice::Event event) : device_(device), event_(event) {}
  ~IpcEvent() { device_->DestroyEvent(event_); }
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;
  StreamDevice::Event get() const { return event_; }

 private:
  StreamDevice* const device_;
  const StreamDevice::Event event_;
};

class IpcEventCache {
 public:
  static constexpr size_t kDefaultPerSession = 64;
  explicit IpcEventCache(StreamDevice* device, size_t per_session = kDefaultPerSession)
      : device_(device), per_session_(per_session < 1 ? 1 : per_session) {}

  // `session`'s event for `handle`, opened on first use. INVALID_ARGUMENT
  // naming `field` for a handle that is not 64 bytes or does not open.
  absl::StatusOr<std::shared_ptr<IpcEvent>> Get(const std::string& session,
                                                absl::string_view handle, absl::string_view field);
  // `session` is live from now (idempotent): Get caches its events.
  void BeginSession(const std::string& session);
  // `session` ended: its events are dropped, and Get caches none any more.
  void EndSession(const std::string& session);

  size_t cached(const std::string& session) const;
  size_t opens() const;  // OpenIpcEvent calls that succeeded so far
  size_t live_sessions() const;

 private:
  // Most recently used first.
  using Lru = std::list<std::pair<std::string, std::shared_ptr<IpcEvent>>>;

  // `session`'s cached event for `key`, made most recently used; null if
  // none (or the session is not live).
  std::shared_ptr<IpcEvent> FindLocked(const std::string& session, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StreamDevice* const device_;
  const size_t per_session_;
  mutable tokensel::Mutex mu_;
  std::map<std::string, Lru> sessions_ ABSL_GUARDED_BY(mu_);  // the live ones, and only they
  size_t opens_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_IPC_EVENT_CACHE_H_
