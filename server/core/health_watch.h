// HealthWatch: turns the server's health NOT_SERVING when its backend stops
// being able to run ops (Backend::healthy(), e.g. a sticky CUDA error killed
// a device's context: server/backends/cuda_backend.h).
//
//   HealthWatch watch(&backend, [&] { front_end->SetServing(false); });
//   ... periodically (the server's reaper loop, every --reap_interval):
//   watch.Poll();
//
// Poll reads backend.healthy(); the first time it is false it logs and calls
// `on_unhealthy`, exactly once: a failed backend never comes back (only a new
// process gets a working CUDA context), so health never returns to SERVING
// and the orchestrator's probe restarts the server. Until then the other
// devices keep serving; a device that failed answers its ops UNAVAILABLE.
// Polling, not a push from the backend: the backend is in server/backends and
// knows nothing of health, and a probe period of a second is far below any
// orchestrator's probe interval.
//
// Thread-safe (Poll may be called from any thread, concurrently).
#ifndef TOKENSEL_SERVER_CORE_HEALTH_WATCH_H_
#define TOKENSEL_SERVER_CORE_HEALTH_WATCH_H_

#include <atomic>
#include <functional>
#include <utility>

#include "server/core/backend.h"

namespace tokensel::core {

class HealthWatch {
 public:
  // `backend` must outlive this object.
  HealthWatch(const Backend* backend, std::function<void()> on_unhealthy)
      : backend_(backend), on_unhealthy_(std::move(on_unhealthy)) {}

  // Whether the backend is healthy now (see above for the side effect).
  bool Poll();

  bool reported() const { return reported_.load(std::memory_order_acquire); }

 private:
  const Backend* const backend_;
  const std::function<void()> on_unhealthy_;
  std::atomic<bool> reported_{false};
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_HEALTH_WATCH_H_
