// `tokensel health`: grpc.health.v1.Health/Check.
#include <cstdio>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/json.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tokensel/client/status.h"

ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, service, "", "health service name; \"\" = the whole server");

namespace tokensel::cli {

absl::StatusOr<std::string> CheckHealth(const client::Client& client, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(client.channel());
  auto ctx = client.NewContext();
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const absl::Status status = client::FromGrpcStatus(stub->Check(ctx.get(), request, &response));
  if (!status.ok()) return status;
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

namespace {

int RunHealth() {
  absl::StatusOr<client::Client> client = ConnectFromFlags();
  if (!client.ok()) return Fail("health", client.status());
  absl::StatusOr<std::string> status = CheckHealth(*client, absl::GetFlag(FLAGS_service));
  if (!status.ok()) return Fail("health", status.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"status\":%s}\n", JsonString(*status).c_str());
  } else {
    std::printf("%s\n", status->c_str());
  }
  return *status == "SERVING" ? kExitOk : kExitFailure;
}

}  // namespace

const Command kHealthCommand = {
    "health", "grpc.health.v1 Check; exit 0 only when SERVING",
    "Calls grpc.health.v1.Health/Check and prints the serving status (SERVING,\n"
    "NOT_SERVING, ...). Exit 0 when SERVING, 1 otherwise or when the call fails.",
    ConnectionFlags({"json", "service"}), &RunHealth};

}  // namespace tokensel::cli
