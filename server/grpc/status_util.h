// The one place where absl::Status becomes grpc::Status.
//
// absl::StatusCode and grpc::StatusCode share the canonical numbering
// (google.rpc.Code), so codes map 1:1 by number and the message passes
// through unchanged.
#ifndef TOKENSEL_SERVER_GRPC_STATUS_UTIL_H_
#define TOKENSEL_SERVER_GRPC_STATUS_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tokensel::server {

// OK -> grpc::Status::OK; otherwise the same code number and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The canonical upper-case name of a code ("OK", "INVALID_ARGUMENT", ...),
// the `code` label of the RPC metrics: absl::StatusCodeToString, except that
// codes outside 0..16 give "UNKNOWN" (a bounded label set).
std::string StatusCodeName(absl::StatusCode code);

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_STATUS_UTIL_H_
