#include "tokensel/client/status.h"

#include <string>

namespace tokensel::client {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  // google.rpc.Code: OK = 0 .. UNAUTHENTICATED = 16, shared by both enums.
  const absl::StatusCode absl_code =
      (code > 0 && code <= 16) ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

}  // namespace tokensel::client
