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
  return used_;
}

absl::Status MemoryBudget::Take(uint64_t held, uint64_t bytes, absl::string_view what,
                                bool pooled) {
  // held <= per_request_bytes_ (Grow checks it).
  if (held > per_request_bytes_ || bytes > per_request_bytes_ - held) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": needs ", bytes, " bytes of server memory (", held,
                     " already held by this request), above the per-request limit of ",
                     per_request_bytes_, " (--max_request_memory_bytes)"));
  }
  tokensel::MutexLock lock(&mu_);
  // used_ may exceed the total after a WeakCharge (Force). Pooled memory
  // may reuse charged blocks: only the requests' bytes count (GrowPooled).
  const uint64_t counted = pooled ? used_ - std::min(charged_, used_) : used_;
  if (counted > total_bytes_ || bytes > total_bytes_ - counted) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": needs ", bytes, " bytes of server memory, but requests in flight hold ", used_,
        " of the server's ", total_bytes_, " (--memory_budget_bytes); retry later"));
  }
  used_ += bytes;
  if (metrics_ != nullptr) metrics_->SetRequestMemory(static_cast<double>(used_));
  return absl::OkStatus();
}

void MemoryBudget::Give(uint64_t bytes) {
  tokensel::MutexLock lock(&mu_);
  used_ -= std::min(bytes, used_);
  if (metrics_ != nullptr) metrics_->SetRequestMemory(static_cast<double>(used_));
}

void MemoryBudget::Force(uint64_t bytes) noexcept {
  tokensel::MutexLock lock(&mu_);
  used_ = bytes > UINT64_MAX - used_ ? UINT64_MAX : used_ + bytes;
  charged_ = bytes > UINT64_MAX - charged_ ? UINT64_MAX : charged_ + bytes;
  if (metrics_ != nullptr) metrics_->SetRequestMemory(static_cast<double>(used_));
}

void MemoryBudget::Uncharge(uint64_t bytes) noexcept {
  tokensel::MutexLock lock(&mu_);
  used_ -= std::min(bytes, used_);
  charged_ -= std::min(bytes, charged_);
  if (metrics_ != nullptr) metrics_->SetRequestMemory(static_cast<double>(used_));
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
  return GrowFor(bytes, what, /*pooled=*/false);
}

absl::Status MemoryBudget::Reservation::GrowPooled(uint64_t bytes, absl::string_view what) {
  return GrowFor(bytes, what, /*pooled=*/true);
}

absl::Status MemoryBudget::Reservation::GrowFor(uint64_t bytes, absl::string_view what,
                                                bool pooled) {
  if (bytes == 0) return absl::OkStatus();
  if (budget_ != nullptr) {
    absl::Status s = budget_->Take(bytes_, bytes, what, pooled);
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
    : anchor_(std::move(other.anchor_)), bytes_(std::exchange(other.bytes_, 0)) {}

MemoryBudget::WeakCharge& MemoryBudget::WeakCharge::operator=(WeakCharge&& other) noexcept {
  if (this != &other) {
    Set(0);
    anchor_ = std::move(other.anchor_);
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
      anchor_->budget->Force(bytes - bytes_);
    } else {
      anchor_->budget->Uncharge(bytes_ - bytes);
    }
  }
  bytes_ = bytes;
}

bool MemoryBudget::WeakCharge::OverTotal() const {
  if (anchor_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(anchor_->mu);
  if (anchor_->budget == nullptr) return false;
  return anchor_->budget->used_bytes() > anchor_->budget->total_bytes();
}

}  // namespace tokensel::core
