#include "server/grpc/status_util.h"

#include <string>

namespace tokensel::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      std::string(status.message()));
}

std::string StatusCodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);  // "" outside the canonical codes
  if (name.empty()) name = "UNKNOWN";
  return name;
}

}  // namespace tokensel::server
