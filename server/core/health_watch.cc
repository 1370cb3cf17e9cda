#include "server/core/health_watch.h"

#include "common/log.h"

namespace tokensel::core {

bool HealthWatch::Poll() {
  if (backend_->healthy()) return true;
  if (!reported_.exchange(true, std::memory_order_acq_rel)) {
    TS_LOG(ERROR) << "health: NOT_SERVING: the " << backend_->name()
                  << " backend can no longer run ops on every device (see the error above); "
                     "restart the server";
    if (on_unhealthy_) on_unhealthy_();
  }
  return false;
}

}  // namespace tokensel::core
