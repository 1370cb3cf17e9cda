// FdTickets: the fd channel's receiver (fd_channel.h). Holds each descriptor
// a caller handed over until RegisterBuffer redeems its ticket, and no
// longer than `ttl`.
//
//   Receive(peer, session, kind, fd)  // fd channel: checks, keeps fd -> ticket
//   Redeem(session, ticket)           // RegisterBuffer: ticket -> fd, once
//
// Receive requires the session to exist and to belong to `peer`'s principal
// (SessionManager::Touch, which also renews it), asks the kind's mapper to
// Inspect the descriptor (so a wrong descriptor is refused when it arrives:
// the host mapper takes only regular files on tmpfs/hugetlbfs, the CUDA VMM
// mapper only NVIDIA device descriptors, so neither kind passes as the other),
// and bounds what is held: at most `max_per_session` waiting tickets per
// session and `max_total` in all (RESOURCE_EXHAUSTED beyond; each holds one
// descriptor of the server's). Tickets are 128 random bits; a ticket is
// valid only for the session it was issued to (any other session gets the
// same NOT_FOUND as an unknown ticket). Expired and ended-session tickets
// are dropped by ReapExpired / DropSession (the server's reaper and the
// session's end).
//
// Thread-safe.
#ifndef TOKENSEL_SERVER_CORE_FD_TICKETS_H_
#define TOKENSEL_SERVER_CORE_FD_TICKETS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "server/core/fd_channel.h"
#include "server/core/region.h"
#include "server/core/session_manager.h"

namespace tokensel::core {

struct FdTicketLimits {
  // >= kMaxVmmSegments: a buffer of that many VMM allocations needs as
  // many tickets waiting at once.
  uint32_t max_per_session = kMaxVmmSegments;
  uint32_t max_total = 1024;
  absl::Duration ttl = absl::Seconds(30);
};

class FdTickets final : public FdReceiver {
 public:
  using Clock = std::function<absl::Time()>;

  // `host` inspects kHostMemory descriptors, `cuda_vmm` kCudaVmm ones
  // (null: that kind is refused with FAILED_PRECONDITION).
  FdTickets(SessionManager* sessions, const RegionMapper* host, FdTicketLimits limits,
            Clock clock = nullptr);
  FdTickets(SessionManager* sessions, const RegionMapper* host, const RegionMapper* cuda_vmm,
            FdTicketLimits limits, Clock clock = nullptr);
  ~FdTickets() override;

  absl::StatusOr<FdReceipt> Receive(const Peer& peer, const std::string& session_id, FdKind kind,
                                    UniqueFd fd) override;

  struct Redeemed {
    std::shared_ptr<const UniqueFd> fd;
    FdKind kind;
  };
  // The descriptor behind `ticket`, removed from the store. NOT_FOUND when
  // the session holds no such ticket (unknown, expired, redeemed already or
  // issued to another session).
  absl::StatusOr<Redeemed> Redeem(const std::string& session_id, const std::string& ticket);

  // RedeemAll: the descriptors behind `tickets` (PassedFd.segments), in
  // order, all or none: the request is checked whole before any ticket is
  // used up. INVALID_ARGUMENT when a ticket appears twice (each descriptor
  // maps once), NOT_FOUND as Redeem for the first unknown one; both name
  // `field`[i].ticket.
  absl::StatusOr<std::vector<Redeemed>> RedeemAll(const std::string& session_id,
                                                  const std::vector<std::string>& tickets,
                                                  absl::string_view field);

  // Drops the tickets of an ended session.
  void DropSession(const std::string& session_id);
  // Drops the tickets older than ttl; returns how many.
  int ReapExpired();
  size_t pending() const;

 private:
  struct Entry {
    std::string session;
    FdKind kind;
    std::shared_ptr<const UniqueFd> fd;
    absl::Time expires;
  };

  SessionManager* const sessions_;
  const RegionMapper* const host_;
  const RegionMapper* const cuda_vmm_;
  const FdTicketLimits limits_;
  const Clock clock_;
  mutable tokensel::Mutex mu_;
  std::map<std::string, Entry> tickets_ ABSL_GUARDED_BY(mu_);         // ticket -> entry
  std::map<std::string, uint32_t> per_session_ ABSL_GUARDED_BY(mu_);  // session -> count
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_FD_TICKETS_H_
