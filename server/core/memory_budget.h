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
#include <memory>
#include <mutex>
#include <utility>

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
  // Its WeakCharges charge nothing from here on.
  ~MemoryBudget();
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

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
    // The same for memory a device backend takes from its BlockPools
    // (staging, scratch: block_pool.h), which may reuse an idle block whose
    // bytes the pool's WeakCharge holds: the server's bound counts only the
    // requests' bytes then, not those charges. Reusing a charged block
    // takes over its charge (the pool gives it back), so reuse never fails
    // because of the pools' own charge; a pool allocates a NEW block only
    // while the budget, charges included, is within its total
    // (WeakCharge::OverTotal), so the charges still cap what is allocated.
    absl::Status GrowPooled(uint64_t bytes, absl::string_view what);
    // Gives `bytes` (at most what is held) back.
    void Shrink(uint64_t bytes);
    uint64_t bytes() const { return bytes_; }
    // A reservation that is not tied to a budget accepts everything.
    bool bound() const { return budget_ != nullptr; }

   private:
    friend class MemoryBudget;
    explicit Reservation(MemoryBudget* budget) : budget_(budget) {}
    absl::Status GrowFor(uint64_t bytes, absl::string_view what, bool pooled);
    MemoryBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // A new, empty reservation (never fails).
  Reservation Open() { return Reservation(this); }

 private:
  struct Anchor;

 public:
  // Memory that exists already and cannot be returned now (a BlockPool's
  // idle blocks beyond its cap while frees wait, block_pool.h), charged
  // even beyond the bounds: until it is given back every Grow finds that
  // much less room (and fails while the server is over its bound). Weak:
  // it may outlive its budget (a pool destroyed after it: tests, tools),
  // and then charges and gives back nothing. Never throws. Used by one
  // thread at a time.
  class WeakCharge {
   public:
    WeakCharge() = default;  // tied to no budget: charges nothing
    WeakCharge(WeakCharge&& other) noexcept;
    WeakCharge& operator=(WeakCharge&& other) noexcept;
    WeakCharge(const WeakCharge&) = delete;
    WeakCharge& operator=(const WeakCharge&) = delete;
    ~WeakCharge();  // gives back what it holds

    // The charge becomes `bytes` (grown past the bounds, or shrunk).
    void Set(uint64_t bytes) noexcept;
    // Whether the budget holds more than its total, charges included (a
    // pool must not allocate then, see GrowPooled); false when tied to no
    // budget.
    bool OverTotal() const;
    uint64_t bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    explicit WeakCharge(std::shared_ptr<Anchor> anchor) : anchor_(std::move(anchor)) {}
    std::shared_ptr<Anchor> anchor_;
    uint64_t bytes_ = 0;
  };
  // A new, empty charge (never fails).
  WeakCharge OpenWeakCharge() { return WeakCharge(anchor_); }

  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t per_request_bytes() const { return per_request_bytes_; }
  uint64_t used_bytes() const;

 private:
  // `pooled`: the server's bound counts the requests' bytes only (GrowPooled).
  absl::Status Take(uint64_t held, uint64_t bytes, absl::string_view what, bool pooled = false);
  void Give(uint64_t bytes);
  // A WeakCharge's bytes, added / given back (counted in used_ and charged_).
  void Force(uint64_t bytes) noexcept;
  void Uncharge(uint64_t bytes) noexcept;

  // What a WeakCharge reaches its budget through; null once it is gone.
  struct Anchor {
    std::mutex mu;
    MemoryBudget* budget = nullptr;  // guarded by mu
  };

  const uint64_t total_bytes_;
  const uint64_t per_request_bytes_;
  ServiceMetrics* const metrics_;
  const std::shared_ptr<Anchor> anchor_;
  mutable tokensel::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;     // requests and charges
  uint64_t charged_ ABSL_GUARDED_BY(mu_) = 0;  // of which WeakCharges
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_
