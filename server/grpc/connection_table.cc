#include "server/grpc/connection_table.h"

#include <sys/stat.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "grpcpp/server_context.h"

namespace tokensel::server {
namespace {

// A refusal sweeps first, but not more often than this: a flood of refused
// connects must not turn into a flood of fstat()s.
constexpr absl::Duration kMinSweepInterval = absl::Milliseconds(50);

}  // namespace

absl::string_view TransportName(Transport transport) {
  switch (transport) {
    case Transport::kUnix:
      return "unix";
    case Transport::kTcp:
      return "tcp";
    case Transport::kFdChannel:
      return "fd_channel";
  }
  return "unknown";
}

absl::string_view RefuseReasonName(RefuseReason reason) {
  switch (reason) {
    case RefuseReason::kMaxConnections:
      return "max_connections";
    case RefuseReason::kMaxConnectionsPerPeer:
      return "max_connections_per_peer";
    case RefuseReason::kFdLimit:
      return "fd_limit";
  }
  return "unknown";
}

core::Peer TcpPeerFromGrpcPeer(absl::string_view peer) {
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    const size_t colon = peer.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) return core::Peer{};
    return core::Peer::Tcp(std::string(peer.substr(0, colon)));
  }
  if (absl::ConsumePrefix(&peer, "ipv6:")) {
    // "[::1]:5000", or with the brackets percent-encoded: "%5B::1%5D:5000".
    absl::string_view close;
    if (absl::ConsumePrefix(&peer, "[")) {
      close = "]:";
    } else if (absl::ConsumePrefix(&peer, "%5B") || absl::ConsumePrefix(&peer, "%5b")) {
      close = absl::StrContains(peer, "%5D:") ? "%5D:" : "%5d:";
    } else {
      return core::Peer{};
    }
    const size_t end = peer.rfind(close);
    if (end == absl::string_view::npos || end == 0) return core::Peer{};
    absl::string_view address = peer.substr(0, end);
    // A scope id ("fe80::1%25eth0") stays as is: still one principal per host.
    return core::Peer::Tcp(std::string(address));
  }
  return core::Peer{};
}

ConnectionTable::ConnectionTable(uint32_t max_connections, uint32_t max_connections_per_peer,
                                 core::ServiceMetrics* metrics)
    : max_connections_(max_connections),
      max_per_peer_(max_connections_per_peer),
      metrics_(metrics) {
  MutexLock lock(&mu_);
  PublishLocked();
}

std::optional<RefuseReason> ConnectionTable::OverCapLocked(const std::string& principal) const {
  if (entries_.size() >= max_connections_) return RefuseReason::kMaxConnections;
  auto it = per_principal_.find(principal);
  if (it != per_principal_.end() && it->second >= max_per_peer_) {
    return RefuseReason::kMaxConnectionsPerPeer;
  }
  return std::nullopt;
}

std::optional<RefuseReason> ConnectionTable::Add(int fd, Transport transport,
                                                 const core::Peer& peer) {
  struct stat st;
  // Not a live descriptor (cannot happen for one just accepted): refuse.
  if (::fstat(fd, &st) != 0) return RefuseReason::kMaxConnections;
  Entry entry;
  entry.dev = st.st_dev;
  entry.ino = st.st_ino;
  entry.transport = transport;
  entry.peer = peer;
  entry.principal = peer.Principal();
  bool swept = false;
  while (true) {
    {
      MutexLock lock(&mu_);
      auto old = entries_.find(fd);
      if (old != entries_.end()) EraseLocked(old);  // closed: its number was reused
      std::optional<RefuseReason> over = OverCapLocked(entry.principal);
      if (!over.has_value()) {
        ++per_principal_[entry.principal];
        ++per_transport_[static_cast<int>(transport)];
        entries_.emplace(fd, std::move(entry));
        PublishLocked();
        return std::nullopt;
      }
      if (swept || absl::Now() - last_sweep_ < kMinSweepInterval) return over;
    }
    Sweep();
    swept = true;
  }
}

void ConnectionTable::Remove(int fd) {
  MutexLock lock(&mu_);
  auto it = entries_.find(fd);
  if (it == entries_.end()) return;
  EraseLocked(it);
  PublishLocked();
}

int ConnectionTable::Sweep() {
  struct Snapshot {
    int fd;
    dev_t dev;
    ino_t ino;
  };
  std::vector<Snapshot> snapshot;
  {
    ReaderMutexLock lock(&mu_);
    snapshot.reserve(entries_.size());
    for (const auto& [fd, entry] : entries_) snapshot.push_back({fd, entry.dev, entry.ino});
  }
  // fstat outside the lock: PeerOf is never held up by a sweep.
  std::vector<Snapshot> dead;
  for (const Snapshot& s : snapshot) {
    struct stat st;
    if (::fstat(s.fd, &st) != 0 || st.st_dev != s.dev || st.st_ino != s.ino) dead.push_back(s);
  }
  MutexLock lock(&mu_);
  last_sweep_ = absl::Now();
  int removed = 0;
  for (const Snapshot& s : dead) {
    auto it = entries_.find(s.fd);
    // Replaced meanwhile by a new connection with the same number: keep it.
    if (it == entries_.end() || it->second.dev != s.dev || it->second.ino != s.ino) continue;
    EraseLocked(it);
    ++removed;
  }
  if (removed > 0) PublishLocked();
  return removed;
}

void ConnectionTable::EraseLocked(absl::flat_hash_map<int, Entry>::iterator it) {
  auto p = per_principal_.find(it->second.principal);
  if (p != per_principal_.end() && --p->second == 0) per_principal_.erase(p);
  --per_transport_[static_cast<int>(it->second.transport)];
  entries_.erase(it);
}

void ConnectionTable::PublishLocked() {
  if (metrics_ == nullptr) return;
  for (int t = 0; t < kTransportCount; ++t) {
    metrics_->SetConnections(TransportName(static_cast<Transport>(t)),
                             static_cast<double>(per_transport_[t]));
  }
}

core::Peer ConnectionTable::PeerOf(absl::string_view grpc_peer) const {
  absl::string_view rest = grpc_peer;
  if (absl::ConsumePrefix(&rest, "fd:")) {
    int fd = -1;
    if (!absl::SimpleAtoi(rest, &fd)) return core::Peer{};
    ReaderMutexLock lock(&mu_);
    auto it = entries_.find(fd);
    if (it == entries_.end() || it->second.transport != Transport::kUnix) return core::Peer{};
    return it->second.peer;
  }
  return TcpPeerFromGrpcPeer(grpc_peer);
}

size_t ConnectionTable::size() const {
  ReaderMutexLock lock(&mu_);
  return entries_.size();
}

size_t ConnectionTable::count(Transport transport) const {
  ReaderMutexLock lock(&mu_);
  return per_transport_[static_cast<int>(transport)];
}

size_t ConnectionTable::count_for(const std::string& principal) const {
  ReaderMutexLock lock(&mu_);
  auto it = per_principal_.find(principal);
  return it == per_principal_.end() ? 0 : it->second;
}

core::Peer PeerOf(const ConnectionTable* table, const grpc::ServerContextBase& ctx) {
  const std::string peer = ctx.peer();
  if (table == nullptr) return TcpPeerFromGrpcPeer(peer);
  return table->PeerOf(peer);
}

}  // namespace tokensel::server
