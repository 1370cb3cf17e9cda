// MemoryBudget: every byte a request makes the server allocate is counted
// here before it is allocated, against a bound per request and a bound over
// all requests in flight. Beyond either, the request fails with
// RESOURCE_EXHAUSTED at once (nothing waits for memory).
//
// What a request counts (the executor reserves, see executor.h): staging for
// inline inputs and outputs, the kernels' scratch (Backend::ScratchBytes),
// the inline results it returns, for as long as they are held. A tiny
// request cannot make the server allocate gigabytes: zero-strided views and
// huge dims are paid for here, in bytes, before anything runs.
//
//   MemoryBudget::Reservation r = budget.Open();
//   RETURN_IF_ERROR(r.Grow(staging_bytes, "inputs"));   // before allocating
//   ...                                                  // released with r
//
// Thread-safe; a Reservation is used by one thread at a time.
#ifndef TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_
#define TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"

namespace tokensel::core {

class ServiceMetrics;

class MemoryBudget {
 public:
  // `total_bytes` bounds the sum over live reservations, `per_request_bytes`
  // each one (both > 0). `metrics` may be null.
  MemoryBudget(uint64_t total_bytes, uint64_t per_request_bytes, ServiceMetrics* metrics);

  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();

    // Adds `bytes` for `what` (named in the error: "staging for out",
    // "scratch of TopKTokens", ...). RESOURCE_EXHAUSTED, reserving nothing,
    // when the request or the server would go over its bound.
    absl::Status Grow(uint64_t bytes, absl::string_view what);
    // Adds `bytes` even beyond the bounds: memory that exists already and
    // cannot be returned now (a BlockPool's idle blocks beyond its cap
    // while frees wait, block_pool.h). Never fails, never throws; until it
    // is given back, every Grow finds that much less room (and fails while
    // the server is over its bound).
    void GrowPastBounds(uint64_t bytes) noexcept;
    // Gives `bytes` (at most what is held) back.
    void Shrink(uint64_t bytes);
    uint64_t bytes() const { return bytes_; }
    // A reservation that is not tied to a budget accepts everything.
    bool bound() const { return budget_ != nullptr; }

   private:
    friend class MemoryBudget;
    explicit Reservation(MemoryBudget* budget) : budget_(budget) {}
    MemoryBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // A new, empty reservation (never fails).
  Reservation Open() { return Reservation(this); }

  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t per_request_bytes() const { return per_request_bytes_; }
  uint64_t used_bytes() const;

 private:
  absl::Status Take(uint64_t held, uint64_t bytes, absl::string_view what);
  void Give(uint64_t bytes);
  void Force(uint64_t bytes) noexcept;

  const uint64_t total_bytes_;
  const uint64_t per_request_bytes_;
  ServiceMetrics* const metrics_;
  mutable tokensel::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_
