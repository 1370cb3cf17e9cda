// In-process server harness for the server/grpc tests: a Server on a unix
// socket in a fresh temporary directory, a channel and stub to it, and raw
// clients for the standard health and reflection services (Debian ships no
// generated client code for them, so their few fields are encoded by hand).
#ifndef TOKENSEL_TESTS_SERVER_GRPC_GRPC_TEST_UTIL_H_
#define TOKENSEL_TESTS_SERVER_GRPC_GRPC_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "server/app/server.h"
#include "tokensel/v1/tokensel.grpc.pb.h"

namespace tokensel::server::testing {

class InProcessServer {
 public:
  // Starts a CPU-backend server with `options` (listen and backend are
  // overridden; the exposer is off unless options.metrics_address is set to
  // something other than the default, e.g. "127.0.0.1:0").
  static absl::StatusOr<std::unique_ptr<InProcessServer>> Start(ServerOptions options = {});
  ~InProcessServer();

  Server& server() { return *server_; }
  const std::string& address() const { return address_; }
  v1::TokenSelect::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

  // OpenSession; the id, or an empty string on failure (test asserts).
  std::string OpenSession(const std::string& client_name = "test");
  // A context carrying `session` as tokensel-session metadata.
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& session);

 private:
  InProcessServer() = default;
  std::string dir_;
  std::string address_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TokenSelect::Stub> stub_;
};

// InProcessServer::Start(options), failing the current test (nullptr) on
// an error.
std::unique_ptr<InProcessServer> StartServer(ServerOptions options = {});

// A gRPC status as an absl::Status (same code and message).
absl::Status ToAbsl(const grpc::Status& status);

// grpc.health.v1.Health/Check; the ServingStatus number (kServing,
// kNotServing) or the RPC's error.
inline constexpr int kServing = 1;
inline constexpr int kNotServing = 2;
absl::StatusOr<int> HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service);

// grpc.reflection.v1alpha.ServerReflection list_services: the service names.
absl::StatusOr<std::vector<std::string>> ReflectionListServices(
    const std::shared_ptr<grpc::Channel>& channel);

// Row-major little-endian bytes of `values`.
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}
template <typename T>
std::vector<T> FromBytes(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// An inline tensor.
v1::Tensor InlineTensor(v1::DType dtype, std::vector<int64_t> shape, std::string data);

}  // namespace tokensel::server::testing

#endif  // TOKENSEL_TESTS_SERVER_GRPC_GRPC_TEST_UTIL_H_
