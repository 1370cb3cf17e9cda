// grpc::Status -> absl::Status, the one conversion every client call uses.
#ifndef TOKENSEL_CLIENT_STATUS_H_
#define TOKENSEL_CLIENT_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tokensel::client {

// Same code (gRPC and absl share the google.rpc.Code numbering; an unknown
// number becomes UNKNOWN) and the server's message unchanged. OK -> OkStatus.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_STATUS_H_
