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
// bytes. Pinned host pools have an account of their own, the HOST account
// (kHostAccount), apart from every device's: their frees pass the host
// gate, which any device's closed gate closes (free_gate.h), so charging
// them to their device let one device's stuck client fill another device's
// account and refuse its device blocks (the seventh review's item 1). The
// rule:
//  - a reservation (Grow) counts the requests' bytes only: R <= total, and
//    no charge refuses a request's bytes (inline results, the CPU path,
//    staging that reuses a charged block);
//  - a pool of account a (a device d, or the host) allocates a NEW block
//    only while R + C_a <= total (WeakCharge::OverShare), C_a the charge of
//    that account's pools alone: a stuck client on device k refuses new
//    device blocks on k only; it closes the host gate too, so once C_host is
//    full it refuses new PINNED blocks on every device (pinned frees cannot
//    run anywhere then: unavoidable, free_gate.h), never device blocks.
// The bound it implies: every block a request allocates was reserved first,
// so at each allocation an account's blocks in use (bounded by R, up to
// twice for reused blocks as before) plus its charge are within the total,
// and between allocations its pools only shrink: each account's pools hold
// at most about the total plus their caps, as before. C_a is at most the
// total (plus a request's blocks). Without a closed gate every charge is 0
// and nothing changed: a pool charges only while its gate is closed (a
// Release, or the drainer's trim, that finds it closed; block_pool.h), and
// the opening's trim gives the charge back (the second read of the seventh
// review, finding 2: a Release over the cap charged also with the gate
// open, until the drainer trimmed, and so refused every other pool of the
// account, all the devices' pinned pools for the host account, with no
// client stuck). Between an opening and its trim on the gate's drainer the
// closed period's charge still counts. With k devices' gates closed (k >= 1: the host gate
// is closed too) the server holds at most
// R + C_1 + ... + C_k + C_host <= (k + 2) x total (plus the caps), not
// 1 x total as the one shared account did, and not (n + 1) x total for n
// devices as when every device's pinned pool charged its device (the
// seventh review). No per-account rule can do better: the blocks in use
// when a gate closes (up to the total) turn into its charge when released;
// capping the sum again would let one device's stuck client refuse the
// others' blocks, which is what this replaces.
//
// Thread-safe; a Reservation is used by one thread at a time.
#ifndef TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_
#define TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_

#include <array>
#include <climits>
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
  // one account (a device's, or the host's) even beyond the bounds: until
  // it is given back that account's pools find that much less room for new blocks (OverShare;
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
    // Whether the requests' bytes plus the charge of this charge's account
    // (every WeakCharge of it) exceed the total: a pool of the account must
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
  // The account of the pinned host pools (see above): pass it as the
  // ordinal of OpenWeakCharge and charged_bytes.
  static constexpr int kHostAccount = INT_MIN;
  // A new, empty charge on device `ordinal`'s account, or the host's for
  // kHostAccount (never fails). One account per device slot (device_slot.h:
  // the ordinals beyond 63 share one, as their FreeGate), one for the host.
  WeakCharge OpenWeakCharge(int ordinal) { return WeakCharge(anchor_, AccountSlot(ordinal)); }

  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t per_request_bytes() const { return per_request_bytes_; }
  // The requests' bytes plus every charge (the tokensel_request_memory_bytes
  // gauge).
  uint64_t used_bytes() const;
  uint64_t request_bytes() const;             // the requests' alone
  uint64_t charged_bytes() const;             // every account's charges
  uint64_t charged_bytes(int ordinal) const;  // device `ordinal`'s account (or kHostAccount)

 private:
  absl::Status Take(uint64_t held, uint64_t bytes, absl::string_view what);
  void Give(uint64_t bytes);
  // A WeakCharge's bytes on account `slot`, added / given back.
  void Force(size_t slot, uint64_t bytes) noexcept;
  void Uncharge(size_t slot, uint64_t bytes) noexcept;
  bool OverShare(size_t slot) const;
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The host account's slot follows the device slots.
  static constexpr size_t kHostSlot = kDeviceSlots;
  static constexpr size_t AccountSlot(int ordinal) {
    return ordinal == kHostAccount ? kHostSlot : DeviceSlot(ordinal);
  }

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
  uint64_t requests_ ABSL_GUARDED_BY(mu_) = 0;                             // Reservations' bytes
  uint64_t charged_ ABSL_GUARDED_BY(mu_) = 0;                              // every account's
  std::array<uint64_t, kDeviceSlots + 1> charges_ ABSL_GUARDED_BY(mu_){};  // per account
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_MEMORY_BUDGET_H_
