#include "client/cli/connection.h"

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "client/cli/credentials.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "tokensel/client/fd_channel.h"

ABSL_FLAG(std::string, server, tokensel::client::kDefaultTarget,
          "tokensel-server target: unix:///abs/path, host:port or https://host:port.\n"
          "TCP is TLS with --tls_ca/--tls/--tls_server_name/a token or https://, else\n"
          "plaintext (a server started with --insecure_tcp)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30), "deadline of each call");
ABSL_FLAG(std::string, session, "",
          "an existing session id (from the worker that owns it); empty = open a new session");

namespace tokensel::cli {

namespace {
constexpr int kMaxMessageBytes = 256 << 20;
}  // namespace

std::vector<std::string> ConnectionFlags(std::initializer_list<const char*> more) {
  std::vector<std::string> flags = {"server", "timeout"};
  for (std::string& f : SecurityFlags()) flags.push_back(std::move(f));
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

std::string TargetFlag() { return absl::GetFlag(FLAGS_server); }
absl::Duration TimeoutFlag() { return absl::GetFlag(FLAGS_timeout); }
std::string SessionFlag() { return absl::GetFlag(FLAGS_session); }

bool IsUnixTarget(absl::string_view target) { return absl::StartsWith(target, "unix:"); }

absl::StatusOr<client::Client> Connect(const std::string& target, absl::Duration timeout,
                                       bool wait_for_ready) {
  if (target.empty()) return absl::InvalidArgumentError("--server is empty");
  if (timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("--timeout must be > 0");
  absl::StatusOr<TargetSecurity> security = ResolveSecurity(target);
  if (!security.ok()) return security.status();
  SetLastTargetSecurity(*security);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> credentials = ChannelCredentialsFor(*security, &args);
  auto channel = grpc::CreateCustomChannel(security->target, credentials, args);
  client::ClientOptions options;
  options.auth_token = security->token;  // sent per call, only over TLS
  options.deadline = timeout;
  options.max_message_bytes = kMaxMessageBytes;
  options.wait_for_ready = wait_for_ready;
  // Memory is registered by descriptor on the fd channel beside the socket.
  options.fd_channel = client::FdChannelPath(target);
  return client::Client::FromChannel(std::move(channel), options);
}

absl::StatusOr<client::Client> ConnectFromFlags() { return Connect(TargetFlag(), TimeoutFlag()); }

absl::StatusOr<std::unique_ptr<client::Session>> OpenSession(const client::Client& client,
                                                             const std::string& client_name) {
  client::SessionOptions options;
  options.client_name = client_name;
  return client::Session::Open(client, options);
}

}  // namespace tokensel::cli
