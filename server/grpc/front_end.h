// GrpcFrontEnd: the transport of a tokensel server — its listeners, who is on
// each connection, TCP security, the TokenSelect service with the standard
// health and reflection services, the op WorkQueue and the order they stop
// in. It owns no server state: sessions, buffers, admission and the executor
// are given (ServiceDeps) by the composition root (server/app/server.h).
//
//   ASSIGN_OR_RETURN(auto front_end, GrpcFrontEnd::Start(options, deps));
//   front_end->SetServing(true);          // health SERVING
//   ...
//   front_end->SetServing(false);         // health NOT_SERVING, first on shutdown
//   front_end->Stop(deadline);            // accept loop, gRPC, workers, sockets
//
// Listeners: "unix:///abs/path" (or "unix:rel/path") and "host:port". The
// front end binds and accepts them itself (accept_loop.h) and hands gRPC each
// accepted connection; a ConnectionTable (connection_table.h) knows the peer
// of every connection (unix: SO_PEERCRED uid/gid/pid; TCP: address) and
// enforces `max_connections` / `max_connections_per_peer` (the first lowered
// to what RLIMIT_NOFILE leaves room for, see ConnectionCapForFdLimit; the
// soft limit is raised to the hard one first). Unix sockets follow the rules
// of unix_socket.h (directory created 0750 if missing, no directory others
// can write unless sticky, a stale socket removed only if ours, bound under
// umask 0177, then `unix_socket_group` and mode 0660) and are removed by
// Stop; the socket's permissions are the unix callers' authentication. With
// an `fd_receiver`, every unix listener gets an fd channel beside it (path +
// ".fd", SOCK_SEQPACKET, same rules; fd_channel_protocol.h) and the
// description's fd_channel is true. TCP listeners use the credentials of
// TcpSecurity (tcp_security.h): TLS and a bearer token, or, only with
// `insecure_tcp`, less; a TCP listener without TLS and token fails Start
// unless `insecure_tcp`. Handshakes (TLS, HTTP/2 preface) must finish within
// `handshake_timeout`. Port 0 picks a free port; listen_addresses() reports
// the resolved one.
//
// Thread-safe: SetServing and Stop may race with requests; Stop is
// idempotent and the destructor calls it.
#ifndef TOKENSEL_SERVER_GRPC_FRONT_END_H_
#define TOKENSEL_SERVER_GRPC_FRONT_END_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "server/core/fd_channel.h"
#include "server/grpc/accept_loop.h"
#include "server/grpc/connection_table.h"
#include "server/grpc/handlers.h"
#include "server/grpc/tcp_security.h"

namespace grpc {
class Server;
namespace experimental {
class ExternalConnectionAcceptor;
}  // namespace experimental
}  // namespace grpc

namespace tokensel::server {

class TokenSelectService;
class WorkQueue;

struct FrontEndOptions {
  std::vector<std::string> listen;  // at least one
  std::string unix_socket_group;    // name or gid; empty = the server's gid
  TcpSecurityOptions tcp_security;
  uint64_t max_message_bytes = uint64_t{64} << 20;
  absl::Duration handshake_timeout = absl::Seconds(10);
  uint32_t max_connections = 4096;  // > 0
  uint32_t max_connections_per_peer = 256;
  absl::Duration fd_channel_idle_timeout = absl::Seconds(30);
  int worker_threads = 1;  // the op WorkQueue, >= 1
  // Serves the fd channel beside every unix listener; null: no fd channel.
  // Not owned, must outlive the front end.
  core::FdReceiver* fd_receiver = nullptr;
};

class GrpcFrontEnd {
 public:
  // `deps` carries the core objects (which must outlive the front end) and
  // the description; `workers` and `connections` are the front end's own and
  // are filled in here, as is description.fd_channel. Binds every listener.
  // INVALID_ARGUMENT for a bad listen address, socket group or TCP security
  // file/policy (all checked before anything is bound or removed),
  // FAILED_PRECONDITION when a listener cannot bind, a live server owns the
  // socket or gRPC cannot start. On error nothing stays bound.
  static absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> Start(FrontEndOptions options,
                                                             ServiceDeps deps);
  ~GrpcFrontEnd();
  GrpcFrontEnd(const GrpcFrontEnd&) = delete;
  GrpcFrontEnd& operator=(const GrpcFrontEnd&) = delete;

  // One per listen address, with the port resolved.
  const std::vector<std::string>& listen_addresses() const { return listen_addresses_; }
  // Who is on each connection; PeerOf(&connections(), ctx) for a call.
  const ConnectionTable& connections() const { return *connections_; }

  // Health of "" and "tokensel.v1.TokenSelect".
  void SetServing(bool serving);

  // New connections are no longer accepted, gRPC shuts down with `deadline`
  // (then cancels what is left), the workers finish their queue, the sockets
  // are removed. Idempotent.
  void Stop(absl::Time deadline);

 private:
  explicit GrpcFrontEnd(FrontEndOptions options);
  absl::Status Init(ServiceDeps deps);

  const FrontEndOptions options_;
  std::unique_ptr<ConnectionTable> connections_;
  std::unique_ptr<WorkQueue> workers_;
  std::unique_ptr<TokenSelectService> service_;
  std::unique_ptr<AcceptLoop> accept_loop_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tcp_acceptor_;
  std::unique_ptr<ConnectionSink> sink_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::vector<std::string> listen_addresses_;
  std::vector<std::string> socket_paths_;  // unix listeners + fd channels, removed by Stop

  tokensel::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_FRONT_END_H_
