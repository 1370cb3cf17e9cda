#include "server/core/fd_tickets.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/core/secure_random.h"

namespace tokensel::core {

FdTickets::FdTickets(SessionManager* sessions, const RegionMapper* host, FdTicketLimits limits,
                     Clock clock)
    : FdTickets(sessions, host, nullptr, limits, std::move(clock)) {}

FdTickets::FdTickets(SessionManager* sessions, const RegionMapper* host,
                     const RegionMapper* cuda_vmm, FdTicketLimits limits, Clock clock)
    : sessions_(sessions),
      host_(host),
      cuda_vmm_(cuda_vmm),
      limits_(limits),
      clock_(clock ? std::move(clock) : Clock([] { return absl::Now(); })) {}

FdTickets::~FdTickets() = default;

absl::StatusOr<FdReceipt> FdTickets::Receive(const Peer& peer, const std::string& session_id,
                                             FdKind kind, UniqueFd fd) {
  // Who may hand over a descriptor for this session: its owner only.
  RETURN_IF_ERROR(sessions_->Touch(session_id, peer).status());
  const RegionMapper* mapper = kind == FdKind::kCudaVmm ? cuda_vmm_ : host_;
  if (mapper == nullptr) {
    return absl::FailedPreconditionError(kind == FdKind::kCudaVmm
                                             ? "kind: cuda_vmm: this server cannot map CUDA VMM "
                                               "memory (its backend does not use CUDA devices)"
                                             : "kind: this server cannot map host memory");
  }
  ASSIGN_OR_RETURN(FdInfo info, mapper->Inspect(fd.get()));
  FdReceipt receipt;
  receipt.ticket = SecureRandomHex128();
  receipt.object_size = info.size;
  receipt.sealed = info.sealed;
  auto held = std::make_shared<const UniqueFd>(std::move(fd));
  {
    tokensel::MutexLock lock(&mu_);
    uint32_t& mine = per_session_[session_id];
    if (mine >= limits_.max_per_session) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session: ", mine,
                       " descriptors are waiting for RegisterBuffer already, the limit per "
                       "session is ",
                       limits_.max_per_session, " (tickets expire after ",
                       absl::FormatDuration(limits_.ttl), ")"));
    }
    if (tickets_.size() >= limits_.max_total) {
      if (mine == 0) per_session_.erase(session_id);
      return absl::ResourceExhaustedError(absl::StrCat(
          "server: ", tickets_.size(), " descriptors are waiting for RegisterBuffer, the limit is ",
          limits_.max_total, "; retry later"));
    }
    ++mine;
    tickets_.emplace(receipt.ticket,
                     Entry{session_id, kind, std::move(held), clock_() + limits_.ttl});
  }
  return receipt;
}

absl::StatusOr<FdTickets::Redeemed> FdTickets::Redeem(const std::string& session_id,
                                                      const std::string& ticket) {
  tokensel::MutexLock lock(&mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.session != session_id || it->second.expires <= clock_()) {
    return absl::NotFoundError(
        "fd.ticket: no such ticket in this session (tickets are single-use and expire after " +
        absl::FormatDuration(limits_.ttl) + "; send the descriptor on the fd channel again)");
  }
  Redeemed out{std::move(it->second.fd), it->second.kind};
  auto count = per_session_.find(session_id);
  if (count != per_session_.end() && --count->second == 0) per_session_.erase(count);
  tickets_.erase(it);
  return out;
}

absl::StatusOr<std::vector<FdTickets::Redeemed>> FdTickets::RedeemAll(
    const std::string& session_id, const std::vector<std::string>& tickets,
    absl::string_view field) {
  for (size_t i = 0; i < tickets.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (tickets[j] == tickets[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, "[", i, "].ticket is ", field, "[", j,
                         "].ticket again (each descriptor is one allocation, mapped once)"));
      }
    }
  }
  tokensel::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  for (size_t i = 0; i < tickets.size(); ++i) {  // all checked before any is used up
    auto it = tickets_.find(tickets[i]);
    if (it == tickets_.end() || it->second.session != session_id || it->second.expires <= now) {
      return absl::NotFoundError(absl::StrCat(
          field, "[", i,
          "].ticket: no such ticket in this session (tickets are single-use and "
          "expire after ",
          absl::FormatDuration(limits_.ttl), "; send the descriptor on the fd channel again)"));
    }
  }
  std::vector<Redeemed> out;
  out.reserve(tickets.size());
  for (const std::string& ticket : tickets) {
    auto it = tickets_.find(ticket);
    out.push_back(Redeemed{std::move(it->second.fd), it->second.kind});
    auto count = per_session_.find(session_id);
    if (count != per_session_.end() && --count->second == 0) per_session_.erase(count);
    tickets_.erase(it);
  }
  return out;
}

void FdTickets::DropSession(const std::string& session_id) {
  std::vector<std::shared_ptr<const UniqueFd>> dropped;  // closed outside the lock
  tokensel::MutexLock lock(&mu_);
  if (per_session_.erase(session_id) == 0) return;
  for (auto it = tickets_.begin(); it != tickets_.end();) {
    if (it->second.session == session_id) {
      dropped.push_back(std::move(it->second.fd));
      it = tickets_.erase(it);
    } else {
      ++it;
    }
  }
}

int FdTickets::ReapExpired() {
  std::vector<std::shared_ptr<const UniqueFd>> dropped;
  {
    tokensel::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    for (auto it = tickets_.begin(); it != tickets_.end();) {
      if (it->second.expires > now) {
        ++it;
        continue;
      }
      auto count = per_session_.find(it->second.session);
      if (count != per_session_.end() && --count->second == 0) per_session_.erase(count);
      dropped.push_back(std::move(it->second.fd));
      it = tickets_.erase(it);
    }
  }
  if (!dropped.empty()) {
    TS_LOG(DEBUG) << "dropped " << dropped.size() << " unredeemed fd tickets";
  }
  return static_cast<int>(dropped.size());
}

size_t FdTickets::pending() const {
  tokensel::MutexLock lock(&mu_);
  return tickets_.size();
}

}  // namespace tokensel::core
