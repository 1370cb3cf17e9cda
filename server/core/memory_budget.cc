#include "server/core/memory_budget.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {

MemoryBudget::MemoryBudget(uint64_t total_bytes, uint64_t per_request_bytes,
                           ServiceMetrics* metrics)
    : total_bytes_(total_bytes),
      per_request_bytes_(std::min(per_request_bytes, total_bytes)),
      metrics_(metrics),
      anchor_(std::make_shared<Anchor>()) {
  anchor_->budget = this;
}

MemoryBudget::~MemoryBudget() {
  std::lock_guard<std::mutex> lock(anchor_->mu);
  anchor_->budget = nullptr;
}

uint64_t MemoryBudget::used_bytes() const {
  tokensel::MutexLock lock(&mu_);
  return requests_ + charged_;  // no overflow: charged_ saturates below UINT64_MAX - total
}

uint64_t MemoryBudget::request_bytes() const {
  tokensel::MutexLock lock(&mu_);
  return requests_;
}

uint64_t MemoryBudget::charged_bytes() const {
  tokensel::MutexLock lock(&mu_);
  return charged_;
}

uint64_t MemoryBudget::charged_bytes(int ordinal) const {
  tokensel::MutexLock lock(&mu_);
  return charges_[AccountSlot(ordinal)];
}

void MemoryBudget::PublishLocked() {
  if (metrics_ != nullptr) metrics_->SetRequestMemory(static_cast<double>(requests_ + charged_));
}

absl::Status MemoryBudget::Take(uint64_t held, uint64_t bytes, absl::string_view what) {
  // held <= per_request_bytes_ (Grow checks it).
  if (held > per_request_bytes_ || bytes > per_request_bytes_ - held) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": needs ", bytes, " bytes of server memory (", held,
                     " already held by this request), above the per-request limit of ",
                     per_request_bytes_, " (--max_request_memory_bytes)"));
  }
  tokensel::MutexLock lock(&mu_);
  // The requests' bytes only: a device's charge refuses only that device's
  // new blocks (OverShare), never a request's bytes (memory_budget.h).
  if (bytes > total_bytes_ - requests_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": needs ", bytes, " bytes of server memory, but requests in flight hold ", requests_,
        " of the server's ", total_bytes_, " (--memory_budget_bytes); retry later"));
  }
  requests_ += bytes;
  PublishLocked();
  return absl::OkStatus();
}

void MemoryBudget::Give(uint64_t bytes) {
  tokensel::MutexLock lock(&mu_);
  requests_ -= std::min(bytes, requests_);
  PublishLocked();
}

void MemoryBudget::Force(size_t slot, uint64_t bytes) noexcept {
  tokensel::MutexLock lock(&mu_);
  // Saturating, below what used_bytes() can add to the requests' total.
  const uint64_t limit = UINT64_MAX - total_bytes_;
  charges_[slot] = bytes > limit - std::min(limit, charges_[slot]) ? limit : charges_[slot] + bytes;
  charged_ = bytes > limit - std::min(limit, charged_) ? limit : charged_ + bytes;
  PublishLocked();
}

void MemoryBudget::Uncharge(size_t slot, uint64_t bytes) noexcept {
  tokensel::MutexLock lock(&mu_);
  charges_[slot] -= std::min(bytes, charges_[slot]);
  charged_ -= std::min(bytes, charged_);
  PublishLocked();
}

bool MemoryBudget::OverShare(size_t slot) const {
  tokensel::MutexLock lock(&mu_);
  return charges_[slot] > total_bytes_ - requests_;
}

MemoryBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr && bytes_ != 0) budget_->Give(bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

MemoryBudget::Reservation::~Reservation() {
  if (budget_ != nullptr && bytes_ != 0) budget_->Give(bytes_);
}

absl::Status MemoryBudget::Reservation::Grow(uint64_t bytes, absl::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  if (budget_ != nullptr) {
    absl::Status s = budget_->Take(bytes_, bytes, what);
    if (!s.ok()) return s;
  }
  bytes_ = bytes > UINT64_MAX - bytes_ ? UINT64_MAX : bytes_ + bytes;  // saturates unbound
  return absl::OkStatus();
}

void MemoryBudget::Reservation::Shrink(uint64_t bytes) {
  bytes = std::min(bytes, bytes_);
  if (bytes == 0) return;
  if (budget_ != nullptr) budget_->Give(bytes);
  bytes_ -= bytes;
}

MemoryBudget::WeakCharge::WeakCharge(WeakCharge&& other) noexcept
    : anchor_(std::move(other.anchor_)),
      slot_(other.slot_),
      bytes_(std::exchange(other.bytes_, 0)) {}

MemoryBudget::WeakCharge& MemoryBudget::WeakCharge::operator=(WeakCharge&& other) noexcept {
  if (this != &other) {
    Set(0);
    anchor_ = std::move(other.anchor_);
    slot_ = other.slot_;
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

MemoryBudget::WeakCharge::~WeakCharge() { Set(0); }

void MemoryBudget::WeakCharge::Set(uint64_t bytes) noexcept {
  if (anchor_ == nullptr || bytes == bytes_) {
    if (anchor_ == nullptr) bytes_ = bytes;
    return;
  }
  // Under the anchor's lock: the budget cannot end meanwhile.
  std::lock_guard<std::mutex> lock(anchor_->mu);
  if (anchor_->budget != nullptr) {
    if (bytes > bytes_) {
      anchor_->budget->Force(slot_, bytes - bytes_);
    } else {
      anchor_->budget->Uncharge(slot_, bytes_ - bytes);
    }
  }
  bytes_ = bytes;
}

bool MemoryBudget::WeakCharge::OverShare() const {
  if (anchor_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(anchor_->mu);
  return anchor_->budget != nullptr && anchor_->budget->OverShare(slot_);
}

}  // namespace tokensel::core
