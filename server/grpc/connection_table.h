// ConnectionTable: who is on every connection the server accepted, and the
// connection caps.
//
// The accept loop (accept_loop.h) accepts every connection itself, asks the
// kernel who connected (unix: SO_PEERCRED; TCP: the remote address) and
// records it here, keyed by the connection's descriptor, before it hands
// the connection to gRPC. A call finds its peer from gRPC's peer string
// (PeerOf): a unix connection that gRPC got through AddInsecureChannelFromFd
// is "fd:<n>" (looked up here), a TCP one "ipv4:a.b.c.d:port" /
// "ipv6:[addr]:port" (the address is the peer; no lookup needed).
//
// gRPC tells nobody when it closes a connection, so every entry also holds
// the (device, inode) of its socket: Sweep() fstat()s the descriptors and
// drops those that are closed or now name another file. The accept loop
// sweeps periodically and before refusing a connection for a cap.
//
// Descriptor reuse: a new connection that gets the number of a closed one
// replaces its entry at accept, before gRPC sees it. gRPC closes a
// connection's descriptor only once the transport is destroyed, which waits
// for the calls on it, so a call's "fd:<n>" names its own connection while
// the call runs. The residual race: a caller that asks PeerOf for a peer
// string after its call finished can get the identity of a newer connection
// with the same number. Ask during the call.
//
// Caps (Add): at most `max_connections` connections in all and
// `max_connections_per_peer` per principal (core::Peer::Principal(): a uid,
// a TCP address); fd-channel connections count too. Gauges
// tokensel_connections{transport} follow every change.
//
// Thread-safe. PeerOf takes a shared lock (the RPC path); Add, Remove and
// Sweep are called by the accept loop.
#ifndef TOKENSEL_SERVER_GRPC_CONNECTION_TABLE_H_
#define TOKENSEL_SERVER_GRPC_CONNECTION_TABLE_H_

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "server/core/peer.h"
#include "server/core/service_metrics.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace tokensel::server {

enum class Transport : uint8_t { kUnix, kTcp, kFdChannel };
inline constexpr int kTransportCount = 3;
// "unix", "tcp", "fd_channel" (the metrics' transport label).
absl::string_view TransportName(Transport transport);

enum class RefuseReason : uint8_t { kMaxConnections, kMaxConnectionsPerPeer, kFdLimit };
// "max_connections", "max_connections_per_peer", "fd_limit" (the reason label).
absl::string_view RefuseReasonName(RefuseReason reason);

// The peer of a gRPC peer string without a table: "ipv4:10.0.0.7:5000" ->
// Tcp("10.0.0.7"), "ipv6:[::1]:5000" (or percent-encoded brackets) ->
// Tcp("::1"); anything else -> Peer{} (kUnknown).
core::Peer TcpPeerFromGrpcPeer(absl::string_view grpc_peer);

class ConnectionTable {
 public:
  // `metrics` may be null.
  ConnectionTable(uint32_t max_connections, uint32_t max_connections_per_peer,
                  core::ServiceMetrics* metrics);
  ConnectionTable(const ConnectionTable&) = delete;
  ConnectionTable& operator=(const ConnectionTable&) = delete;

  // Records the accepted connection `fd` (open; its socket's inode is taken
  // now). Over a cap it sweeps first (at most every 50 ms) and, still over,
  // records nothing and returns the reason: the caller closes `fd`. An entry
  // already at `fd` (a closed connection) is replaced.
  std::optional<RefuseReason> Add(int fd, Transport transport, const core::Peer& peer);
  // Forgets `fd`; for connections the caller closes itself (fd channel).
  void Remove(int fd);
  // Drops every entry whose descriptor is closed or names another file;
  // returns how many.
  int Sweep();

  // "fd:<n>" -> the recorded unix peer; TCP peer strings -> their address;
  // anything else (or an unknown fd) -> Peer{}.
  core::Peer PeerOf(absl::string_view grpc_peer) const;

  size_t size() const;
  size_t count(Transport transport) const;
  size_t count_for(const std::string& principal) const;
  uint32_t max_connections() const { return max_connections_; }
  uint32_t max_connections_per_peer() const { return max_per_peer_; }

 private:
  struct Entry {
    dev_t dev = 0;
    ino_t ino = 0;
    Transport transport = Transport::kUnix;
    core::Peer peer;
    std::string principal;
  };
  void EraseLocked(absl::flat_hash_map<int, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<RefuseReason> OverCapLocked(const std::string& principal) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const uint32_t max_connections_;
  const uint32_t max_per_peer_;
  core::ServiceMetrics* const metrics_;

  mutable tokensel::Mutex mu_;
  absl::flat_hash_map<int, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> per_principal_ ABSL_GUARDED_BY(mu_);
  std::array<size_t, kTransportCount> per_transport_ ABSL_GUARDED_BY(mu_) = {};
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The peer of the call `ctx` (ctx.peer() through `table`). Without a table
// only TCP peers are known (unix calls -> Peer{}). For handlers: call it
// while the call runs (see "Descriptor reuse" above).
core::Peer PeerOf(const ConnectionTable* table, const grpc::ServerContextBase& ctx);

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_CONNECTION_TABLE_H_
