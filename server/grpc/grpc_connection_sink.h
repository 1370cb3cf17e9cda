// GrpcConnectionSink: hands the accept loop's connections to a running
// grpc::Server.
//  - unix: grpc::AddInsecureChannelFromFd. gRPC (1.51) names such a
//    connection's peer "fd:<n>" (ConnectionTable::PeerOf looks it up).
//  - TCP: the ExternalConnectionAcceptor of the TCP listeners' credentials
//    (ServerBuilder::experimental().AddExternalConnectionAcceptor(FROM_FD,
//    creds)), so TLS, the bearer token and the handshake timeout apply as on
//    a gRPC-owned port. Peer: "ipv4:a.b.c.d:port" / "ipv6:[addr]:port".
// gRPC owns the descriptor from then on and closes it with the connection.
// The server must be started and not yet shut down (an acceptor that is not
// running leaks the descriptor): stop the accept loop before
// grpc::Server::Shutdown.
#ifndef TOKENSEL_SERVER_GRPC_GRPC_CONNECTION_SINK_H_
#define TOKENSEL_SERVER_GRPC_GRPC_CONNECTION_SINK_H_

#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_posix.h"
#include "server/grpc/accept_loop.h"

namespace tokensel::server {

class GrpcConnectionSink final : public ConnectionSink {
 public:
  // `tcp` may be null when there are no TCP listeners. Not owned.
  GrpcConnectionSink(grpc::Server* server, grpc::experimental::ExternalConnectionAcceptor* tcp)
      : server_(server), tcp_(tcp) {}

  void HandOff(Transport transport, int listener_fd, UniqueFd fd) override {
    if (transport == Transport::kUnix) {
      grpc::AddInsecureChannelFromFd(server_, fd.release());
    } else if (transport == Transport::kTcp && tcp_ != nullptr) {
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters params;
      params.listener_fd = listener_fd;
      params.fd = fd.release();
      tcp_->HandleNewConnection(&params);
    }
    // Anything else: closed by `fd`.
  }

 private:
  grpc::Server* const server_;
  grpc::experimental::ExternalConnectionAcceptor* const tcp_;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_GRPC_CONNECTION_SINK_H_
