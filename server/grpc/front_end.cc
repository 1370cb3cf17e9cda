#include "server/grpc/front_end.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/grpc/grpc_connection_sink.h"
#include "server/grpc/listeners.h"
#include "server/grpc/service.h"
#include "server/grpc/unix_socket.h"
#include "server/grpc/work_queue.h"

namespace tokensel::server {
namespace {

constexpr char kServiceName[] = "tokensel.v1.TokenSelect";

int ClampToInt(uint64_t v) { return static_cast<int>(std::min<uint64_t>(v, INT_MAX)); }

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> GrpcFrontEnd::Start(FrontEndOptions options,
                                                                  ServiceDeps deps) {
  std::unique_ptr<GrpcFrontEnd> front_end(new GrpcFrontEnd(std::move(options)));
  absl::Status status = front_end->Init(std::move(deps));
  if (!status.ok()) {
    front_end->Stop(absl::Now());
    return status;
  }
  return front_end;
}

GrpcFrontEnd::GrpcFrontEnd(FrontEndOptions options) : options_(std::move(options)) {}

GrpcFrontEnd::~GrpcFrontEnd() { Stop(absl::Now()); }

absl::Status GrpcFrontEnd::Init(ServiceDeps deps) {
  if (options_.listen.empty()) return absl::InvalidArgumentError("listen: no address given");
  if (options_.max_connections == 0 || options_.max_connections_per_peer == 0) {
    return absl::InvalidArgumentError("max_connections and max_connections_per_peer must be > 0");
  }
  // Every option is checked before anything is bound or removed.
  std::vector<ListenAddress> addresses;
  std::vector<std::string> tcp_listeners;
  for (const std::string& raw : options_.listen) {
    ASSIGN_OR_RETURN(ListenAddress address, ParseListenAddress(raw));
    if (!address.unix_path.has_value()) tcp_listeners.push_back(address.address);
    addresses.push_back(std::move(address));
  }
  std::optional<gid_t> socket_gid;
  if (!options_.unix_socket_group.empty()) {
    ASSIGN_OR_RETURN(socket_gid, ResolveGroup(options_.unix_socket_group));
  }
  ASSIGN_OR_RETURN(TcpSecurity tcp_security,
                   TcpSecurity::Load(options_.tcp_security, tcp_listeners));
  if (!tcp_listeners.empty()) RETURN_IF_ERROR(tcp_security.Probe());

  const FdLimit fd_limit = RaiseFdLimit();
  const uint32_t max_connections = ConnectionCapForFdLimit(options_.max_connections, fd_limit.soft);
  if (max_connections < options_.max_connections) {
    TS_LOG(WARNING) << "max_connections " << options_.max_connections << " lowered to "
                    << max_connections << ": RLIMIT_NOFILE allows " << fd_limit.soft
                    << " descriptors and the server keeps some for everything else";
  }
  connections_ = std::make_unique<ConnectionTable>(
      max_connections, std::min(options_.max_connections_per_peer, max_connections), deps.metrics);
  workers_ = std::make_unique<WorkQueue>(std::max(1, options_.worker_threads));
  deps.workers = workers_.get();
  deps.connections = connections_.get();
  const bool any_unix = std::any_of(addresses.begin(), addresses.end(),
                                    [](const ListenAddress& a) { return a.unix_path.has_value(); });
  deps.description.fd_channel = options_.fd_receiver != nullptr && any_unix;
  core::ServiceMetrics* const metrics = deps.metrics;
  service_ = std::make_unique<TokenSelectService>(std::move(deps));

  AcceptLoopOptions loop_options;
  loop_options.fd_channel_idle_timeout = options_.fd_channel_idle_timeout;
  accept_loop_ = std::make_unique<AcceptLoop>(loop_options, connections_.get(), metrics);
  for (const ListenAddress& address : addresses) {
    if (address.unix_path.has_value()) {
      UnixListenOptions unix_options;
      unix_options.group = socket_gid;
      const std::string& path = *address.unix_path;
      ASSIGN_OR_RETURN(UniqueFd fd, ListenUnix(path, unix_options));
      socket_paths_.push_back(path);
      accept_loop_->AddListener(Transport::kUnix, std::move(fd));
      if (options_.fd_receiver != nullptr) {
        unix_options.type = SOCK_SEQPACKET;
        const std::string fd_path = FdChannelPath(path);
        ASSIGN_OR_RETURN(UniqueFd channel, ListenUnix(fd_path, unix_options));
        socket_paths_.push_back(fd_path);
        accept_loop_->AddListener(Transport::kFdChannel, std::move(channel));
        TS_LOG(INFO) << "fd channel on " << fd_path;
      }
      listen_addresses_.push_back(address.address);
    } else {
      ASSIGN_OR_RETURN(TcpListener tcp, ListenTcp(address));
      for (UniqueFd& fd : tcp.fds) accept_loop_->AddListener(Transport::kTcp, std::move(fd));
      listen_addresses_.push_back(WithPort(address.address, tcp.port));
    }
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(ClampToInt(options_.max_message_bytes));
  builder.SetMaxSendMessageSize(ClampToInt(options_.max_message_bytes));
  builder.AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(
          std::clamp<int64_t>(absl::ToInt64Milliseconds(options_.handshake_timeout), 1, INT_MAX)));
  if (!tcp_listeners.empty()) {
    tcp_acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        tcp_security.credentials());
  }
  builder.RegisterService(service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listen: could not start the gRPC server for ", absl::StrJoin(options_.listen, ", ")));
  }
  sink_ = std::make_unique<GrpcConnectionSink>(grpc_server_.get(), tcp_acceptor_.get());
  return accept_loop_->Start(sink_.get(), options_.fd_receiver);
}

void GrpcFrontEnd::SetServing(bool serving) {
  if (grpc_server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  if (health == nullptr) return;
  if (serving) {
    health->SetServingStatus("", true);
    health->SetServingStatus(kServiceName, true);
  } else {
    health->SetServingStatus(false);
  }
}

void GrpcFrontEnd::Stop(absl::Time deadline) {
  tokensel::MutexLock lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  // No connection may reach gRPC once it shuts down (see grpc_connection_sink.h).
  if (accept_loop_ != nullptr) accept_loop_->Stop();
  if (grpc_server_ != nullptr) grpc_server_->Shutdown(absl::ToChronoTime(deadline));
  if (workers_ != nullptr) workers_->Stop();
  for (const std::string& path : socket_paths_) ::unlink(path.c_str());
  socket_paths_.clear();
}

}  // namespace tokensel::server
