#include "server/core/admission.h"

#include "absl/strings/str_cat.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->Release();
    owner_ = other.owner_;
    other.owner_ = nullptr;
  }
  return *this;
}

Admission::Ticket::~Ticket() {
  if (owner_ != nullptr) owner_->Release();
}

Admission::Admission(uint32_t max_inflight, ServiceMetrics* metrics)
    : max_inflight_(max_inflight), metrics_(metrics) {}

absl::StatusOr<Admission::Ticket> Admission::Admit() {
  {
    tokensel::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("server: shutting down, not accepting requests");
    if (inflight_ >= max_inflight_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("server: ", inflight_, " requests in flight, the limit (max_inflight) is ",
                       max_inflight_, "; retry later"));
    }
    ++inflight_;
    if (metrics_ != nullptr) metrics_->SetInflight(inflight_);
  }
  return Ticket(this);
}

void Admission::Release() {
  tokensel::MutexLock lock(&mu_);
  --inflight_;
  if (metrics_ != nullptr) metrics_->SetInflight(inflight_);
}

bool Admission::Drain(absl::Duration timeout) {
  tokensel::MutexLock lock(&mu_);
  draining_ = true;
  auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return inflight_ == 0; };
  return mu_.AwaitWithTimeout(idle, timeout);
}

bool Admission::draining() const {
  tokensel::MutexLock lock(&mu_);
  return draining_;
}

uint32_t Admission::inflight() const {
  tokensel::MutexLock lock(&mu_);
  return inflight_;
}

}  // namespace tokensel::core
