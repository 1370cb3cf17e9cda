// The connection flags every networked subcommand shares, and the clients
// built from them:
//   --server   target: unix:///abs/path, host:port or https://host:port
//              (default: the server's default unix:///run/tokensel/tokensel.sock)
//   --tls, --tls_ca, --tls_server_name, --auth_token_file
//              TLS and the bearer token of a secured TCP listener
//              (credentials.h: which target gets TLS, the environment)
//   --timeout  per-call deadline
//   --session  an existing session id (buffers); empty = open a new one
//
// CLI calls fail fast (wait_for_ready off): an unreachable server is
// UNAVAILABLE at once instead of waiting for the deadline.
#ifndef TOKENSEL_CLIENT_CLI_CONNECTION_H_
#define TOKENSEL_CLIENT_CLI_CONNECTION_H_

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tokensel/client/client.h"
#include "tokensel/client/session.h"

namespace tokensel::cli {

// "server", "timeout", the security flags (credentials.h), then `more`.
std::vector<std::string> ConnectionFlags(std::initializer_list<const char*> more = {});

std::string TargetFlag();
absl::Duration TimeoutFlag();
std::string SessionFlag();  // "session" (declared here, accepted by `buffers`)

bool IsUnixTarget(absl::string_view target);

// A client with its own connection (its own channel and subchannel, so
// several clients to one target do not share a transport), deadline
// `timeout`, message limits 256 MiB (the server enforces its own). TLS and
// the token follow the security flags and environment (credentials.h);
// INVALID_ARGUMENT when they do not fit the target.
absl::StatusOr<client::Client> Connect(const std::string& target, absl::Duration timeout,
                                       bool wait_for_ready = false);
// Connect(TargetFlag(), TimeoutFlag()).
absl::StatusOr<client::Client> ConnectFromFlags();

// A new session named `client_name` through `client`.
absl::StatusOr<std::unique_ptr<client::Session>> OpenSession(const client::Client& client,
                                                             const std::string& client_name);

// grpc.health.v1.Health/Check(service) on client's channel: the status name
// ("SERVING", "NOT_SERVING", ...). Defined in health.cc.
absl::StatusOr<std::string> CheckHealth(const client::Client& client, const std::string& service);

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_CONNECTION_H_
