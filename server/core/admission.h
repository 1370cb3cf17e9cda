// Admission control: bounds the requests in flight and refuses new ones
// while draining.
//
//   ASSIGN_OR_RETURN(Admission::Ticket ticket, admission.Admit());
//   ... work ...   // the ticket releases its slot when destroyed
//
// Admit() never waits: RESOURCE_EXHAUSTED when `max_inflight` requests are
// already in flight, UNAVAILABLE once Drain() has begun. Thread-safe.
#ifndef TOKENSEL_SERVER_CORE_ADMISSION_H_
#define TOKENSEL_SERVER_CORE_ADMISSION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace tokensel::core {

class ServiceMetrics;

class Admission {
 public:
  class Ticket {
   public:
    Ticket() = default;
    explicit Ticket(Admission* owner) : owner_(owner) {}
    Ticket(Ticket&& other) noexcept : owner_(other.owner_) { other.owner_ = nullptr; }
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();

   private:
    Admission* owner_ = nullptr;
  };

  Admission(uint32_t max_inflight, ServiceMetrics* metrics);

  absl::StatusOr<Ticket> Admit();
  // Refuses new requests from now on and waits up to `timeout` for the ones
  // in flight. Returns true when none is left.
  bool Drain(absl::Duration timeout);
  bool draining() const;
  uint32_t inflight() const;

 private:
  void Release();

  const uint32_t max_inflight_;
  ServiceMetrics* const metrics_;
  mutable tokensel::Mutex mu_;
  uint32_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_ADMISSION_H_
