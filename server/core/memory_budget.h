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
// Per-device charges (WeakCharge): a device backend's BlockPools keep idle
// blocks beyond their caps while a stream of their device waits on a
// client's event (block_pool.h, free_gate.h); those bytes, which no request
// pays for, are charged to THAT DEVICE's account, apart from the requests'
// bytes. The rule:
//  - a reservation (Grow) counts the requests' bytes only: R <= total, and
//    no charge refuses a request's bytes (inline results, the CPU path,
//    staging that reuses a charged block);
//  - a pool of device d allocates a NEW block only while R + C_d <= total
//    (WeakCharge::OverShare), C_d the charge of d's pools alone: a stuck
//    client on device k refuses new blocks on k only.
// The bound it implies: every block a request allocates on d was reserved
// first, so at each allocation d's blocks in use (bounded by R, up to twice
// for reused blocks as before) plus C_d are within the total, and between
// allocations d's pools only shrink: each device's pools hold at most about
// the total plus their caps, as before. C_d is that device's share: at most
// the total (plus a request's blocks). Without a closed gate every charge is
// 0 and nothing changed; with k devices' gates closed the server holds at
// most R + C_1 + ... + C_k <= (k + 1) x total (plus the caps), not 1 x
// total as the one shared account did. No per-device rule can do better:
// the blocks in use when a device's gate closes (up to the total) turn into
// its charge when released; capping the sum again would let one device's
// stuck client refuse the others' blocks, which is what this replaces.
//
// Thread-safe; a Reservation is used by one thread at a time.
#ifndef TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_
#define TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "server/core/device_slot.h"

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
    // when the request or the requests together would go over their bound
    // (the pools' charges are not counted: see above). Memory a device
    // backend takes from its BlockPools counts the same: reusing a charged
    // block takes its charge over (the pool gives it back).
    absl::Status Grow(uint64_t bytes, absl::string_view what);
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

 private:
  struct Anchor;

 public:
  // Memory that exists already and cannot be returned now (a BlockPool's
  // idle blocks beyond its cap while frees wait, block_pool.h), charged to
  // one device's account even beyond the bounds: until it is given back
  // that device's pools find that much less room for new blocks (OverShare;
  // requests' bytes do not see it, see above). Weak: it may outlive its
  // budget (a pool destroyed after it: tests, tools), and then charges and
  // gives back nothing. Never throws. Used by one thread at a time.
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
    // Whether the requests' bytes plus the charge of this charge's device
    // (every WeakCharge of it) exceed the total: a pool of the device must
    // not allocate a new block then (see above); false when tied to no
    // budget.
    bool OverShare() const;
    uint64_t bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    WeakCharge(std::shared_ptr<Anchor> anchor, size_t slot)
        : anchor_(std::move(anchor)), slot_(slot) {}
    std::shared_ptr<Anchor> anchor_;
    size_t slot_ = 0;
    uint64_t bytes_ = 0;
  };
  // A new, empty charge on device `ordinal`'s account (never fails). One
  // account per device slot (device_slot.h: the ordinals beyond 63 share
  // one, as their FreeGate).
  WeakCharge OpenWeakCharge(int ordinal) { return WeakCharge(anchor_, DeviceSlot(ordinal)); }

  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t per_request_bytes() const { return per_request_bytes_; }
  // The requests' bytes plus every charge (the tokensel_request_memory_bytes
  // gauge).
  uint64_t used_bytes() const;
  uint64_t request_bytes() const;             // the requests' alone
  uint64_t charged_bytes() const;             // every device's charges
  uint64_t charged_bytes(int ordinal) const;  // device `ordinal`'s account

 private:
  absl::Status Take(uint64_t held, uint64_t bytes, absl::string_view what);
  void Give(uint64_t bytes);
  // A WeakCharge's bytes on account `slot`, added / given back.
  void Force(size_t slot, uint64_t bytes) noexcept;
  void Uncharge(size_t slot, uint64_t bytes) noexcept;
  bool OverShare(size_t slot) const;
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  uint64_t requests_ ABSL_GUARDED_BY(mu_) = 0;                         // Reservations' bytes
  uint64_t charged_ ABSL_GUARDED_BY(mu_) = 0;                          // every account's
  std::array<uint64_t, kDeviceSlots> charges_ ABSL_GUARDED_BY(mu_){};  // per account
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_
