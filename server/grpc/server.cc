#include "server/grpc/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
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
#include "kernels/tensor_view.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/backends/make_backend.h"
#include "server/grpc/grpc_connection_sink.h"
#include "server/grpc/listeners.h"
#include "server/grpc/service.h"
#include "server/grpc/tcp_security.h"
#include "server/grpc/unix_socket.h"
#include "server/grpc/work_queue.h"
#include "server/memory/cuda_ipc_mapper.h"
#include "server/memory/host_fd_mapper.h"
#include "server/memory/sigbus_guard.h"

#ifndef TOKENSEL_VERSION
#define TOKENSEL_VERSION "unknown"
#endif

namespace tokensel::server {
namespace {

constexpr char kServiceName[] = "tokensel.v1.TokenSelect";
// How long idle streams and not-yet-admitted calls get once every admitted
// request has drained (see Shutdown).
constexpr absl::Duration kIdleStreamGrace = absl::Milliseconds(500);

int ClampToInt(uint64_t v) { return static_cast<int>(std::min<uint64_t>(v, INT_MAX)); }

// Buffers across sessions: each is one memory map, and the process may hold
// vm.max_map_count of them (gRPC, malloc and the stacks need some too).
uint32_t DefaultMaxBuffersTotal() {
  uint64_t max_map_count = 65530;  // the kernel's default
  if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    unsigned long long v = 0;
    if (std::fscanf(f, "%llu", &v) == 1 && v > 0) max_map_count = v;
    std::fclose(f);
  }
  return static_cast<uint32_t>(std::clamp<uint64_t>(max_map_count / 4, 64, 16384));
}

// What requests may hold at once: a quarter of physical memory.
uint64_t DefaultMemoryBudgetBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return uint64_t{4} << 30;
  return std::max<uint64_t>(static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4,
                            uint64_t{256} << 20);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  std::unique_ptr<Server> server(new Server(std::move(options)));
  absl::Status status = server->Init();
  if (!status.ok()) {
    server->Shutdown(absl::ZeroDuration());
    return status;
  }
  return server;
}

Server::Server(ServerOptions options)
    : options_(std::move(options)), fd_receiver_(options_.fd_receiver) {}

Server::~Server() { Shutdown(); }

absl::Status Server::Init() {
  if (options_.listen.empty()) return absl::InvalidArgumentError("listen: no address given");
  if (options_.max_inflight == 0) return absl::InvalidArgumentError("max_inflight must be > 0");
  if (options_.max_buffers_total > memory::SigbusGuard::kCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("max_buffers_total must be <= ",
                                                   memory::SigbusGuard::kCapacity));
  }
  if (options_.max_connections == 0 || options_.max_connections_per_peer == 0) {
    return absl::InvalidArgumentError("max_connections and max_connections_per_peer must be > 0");
  }

  ASSIGN_OR_RETURN(backend_, backends::MakeBackend(options_.backend, options_.threads));
  ASSIGN_OR_RETURN(host_memory_, memory::HostFdMapper::Create());
  cuda_ipc_ = memory::MakeCudaIpcMapper();

  metrics_ = std::make_unique<core::ServiceMetrics>(TOKENSEL_VERSION, backend_->name());
  core::RegistryLimits registry_limits;
  registry_limits.max_buffers_per_session = options_.max_buffers;
  registry_limits.max_buffers =
      options_.max_buffers_total != 0 ? options_.max_buffers_total : DefaultMaxBuffersTotal();
  registry_ = std::make_unique<core::BufferRegistry>(host_memory_.get(), cuda_ipc_.get(),
                                                     registry_limits, metrics_.get());
  core::SessionLimits session_limits;
  session_limits.default_ttl = options_.session_ttl;
  session_limits.max_ttl = std::max(options_.max_session_ttl, options_.session_ttl);
  session_limits.max_sessions = options_.max_sessions;
  session_limits.max_sessions_per_peer = options_.max_sessions_per_peer;
  sessions_ = std::make_unique<core::SessionManager>(
      session_limits,
      [this](const std::string& session) {
        registry_->UnregisterAll(session);
        tickets_->DropSession(session);
      },
      metrics_.get());
  tickets_ = std::make_unique<core::FdTickets>(sessions_.get(), host_memory_.get(),
                                               core::FdTicketLimits());
  // The fd channel delivers to the tickets (unless a test brought its own).
  if (fd_receiver_ == nullptr) fd_receiver_ = tickets_.get();
  const uint64_t budget_bytes = options_.memory_budget_bytes != 0 ? options_.memory_budget_bytes
                                                                  : DefaultMemoryBudgetBytes();
  const uint64_t request_bytes = options_.max_request_memory_bytes != 0
                                     ? options_.max_request_memory_bytes
                                     : std::min(budget_bytes, uint64_t{1} << 30);
  budget_ = std::make_unique<core::MemoryBudget>(budget_bytes, request_bytes, metrics_.get());
  admission_ = std::make_unique<core::Admission>(options_.max_inflight, metrics_.get());
  const FdLimit fd_limit = RaiseFdLimit();
  const uint32_t max_connections = ConnectionCapForFdLimit(options_.max_connections, fd_limit.soft);
  if (max_connections < options_.max_connections) {
    TS_LOG(WARNING) << "max_connections " << options_.max_connections << " lowered to "
                    << max_connections << ": RLIMIT_NOFILE allows " << fd_limit.soft
                    << " descriptors and the server keeps some for everything else";
  }
  connections_ = std::make_unique<ConnectionTable>(
      max_connections, std::min(options_.max_connections_per_peer, max_connections),
      metrics_.get());
  core::ExecutorLimits executor_limits;
  executor_limits.max_inline_bytes = options_.max_message_bytes;
  executor_limits.max_response_bytes = options_.max_message_bytes;
  executor_limits.max_op_work = options_.max_op_elements;
  executor_ = std::make_unique<core::Executor>(backend_.get(), registry_.get(), metrics_.get(),
                                               executor_limits, budget_.get());
  const int threads = options_.threads > 0
                          ? options_.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_ = std::make_unique<WorkQueue>(threads);

  ServiceDeps deps;
  deps.sessions = sessions_.get();
  deps.registry = registry_.get();
  deps.admission = admission_.get();
  deps.executor = executor_.get();
  deps.metrics = metrics_.get();
  deps.tickets = tickets_.get();
  deps.workers = workers_.get();
  deps.connections = connections_.get();
  ServerDescription& d = deps.description;
  d.version = TOKENSEL_VERSION;
  d.backend = std::string(backend_->name());
  d.devices = backend_->devices();
  d.max_message_bytes = options_.max_message_bytes;
  d.max_buffers_per_session = options_.max_buffers;
  d.max_buffers_total = registry_limits.max_buffers;
  d.max_sessions_per_peer = options_.max_sessions_per_peer;
  d.max_op_elements = options_.max_op_elements;
  d.max_request_memory_bytes = budget_->per_request_bytes();
  d.memory_budget_bytes = budget_->total_bytes();
  d.max_inflight = options_.max_inflight;
  d.session_ttl_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(options_.session_ttl));
  d.max_rank = kernels::kMaxRank;
  d.shm_prefix = options_.shm_prefix;
  d.memory_kinds = {"host_shm"};
  if (backend_->CanAccess(core::MemoryKind::kCudaDevice)) d.memory_kinds.push_back("cuda_ipc");
  const bool any_unix =
      std::any_of(options_.listen.begin(), options_.listen.end(),
                  [](const std::string& a) { return absl::StartsWith(a, "unix:"); });
  d.fd_channel = fd_receiver_ != nullptr && any_unix;
  service_ = std::make_unique<TokenSelectService>(std::move(deps));

  RETURN_IF_ERROR(StartGrpc());
  RETURN_IF_ERROR(StartExposer());
  reaper_ = std::thread([this] { ReaperLoop(); });

  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus("", true);
    health->SetServingStatus(kServiceName, true);
  }
  return absl::OkStatus();
}

absl::Status Server::StartGrpc() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::vector<ListenAddress> addresses;
  std::vector<std::string> tcp_listeners;
  for (const std::string& raw : options_.listen) {
    ASSIGN_OR_RETURN(ListenAddress address, ParseListenAddress(raw));
    if (!address.unix_path.has_value()) tcp_listeners.push_back(address.address);
    addresses.push_back(std::move(address));
  }
  // Every option is checked before anything is bound or removed.
  std::optional<gid_t> socket_gid;
  if (!options_.unix_socket_group.empty()) {
    ASSIGN_OR_RETURN(socket_gid, ResolveGroup(options_.unix_socket_group));
  }
  TcpSecurityOptions tcp_options;
  tcp_options.tls_cert_file = options_.tls_cert_file;
  tcp_options.tls_key_file = options_.tls_key_file;
  tcp_options.auth_token_file = options_.auth_token_file;
  tcp_options.insecure_tcp = options_.insecure_tcp;
  ASSIGN_OR_RETURN(TcpSecurity tcp_security, TcpSecurity::Load(tcp_options, tcp_listeners));
  if (!tcp_listeners.empty()) RETURN_IF_ERROR(tcp_security.Probe());

  AcceptLoopOptions loop_options;
  loop_options.fd_channel_idle_timeout = options_.fd_channel_idle_timeout;
  accept_loop_ = std::make_unique<AcceptLoop>(loop_options, connections_.get(), metrics_.get());
  for (const ListenAddress& address : addresses) {
    if (address.unix_path.has_value()) {
      UnixListenOptions unix_options;
      unix_options.group = socket_gid;
      const std::string& path = *address.unix_path;
      ASSIGN_OR_RETURN(UniqueFd fd, ListenUnix(path, unix_options));
      socket_paths_.push_back(path);
      accept_loop_->AddListener(Transport::kUnix, std::move(fd));
      if (fd_receiver_ != nullptr) {
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
  return accept_loop_->Start(sink_.get(), fd_receiver_);
}

absl::Status Server::StartExposer() {
  if (options_.metrics_address.empty()) return absl::OkStatus();
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(options_.metrics_address);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "metrics_address ", options_.metrics_address, ": cannot serve metrics: ", e.what()));
  }
  exposer_->RegisterCollectable(metrics_->registry());
  const std::vector<int> ports = exposer_->GetListeningPorts();
  metrics_address_ =
      ports.empty() ? options_.metrics_address : WithPort(options_.metrics_address, ports[0]);
  return absl::OkStatus();
}

void Server::ReaperLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_reaper_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_reaper_),
                         std::max(options_.reap_interval, absl::Milliseconds(10)));
    if (stop_reaper_) break;
    mu_.Unlock();
    const int reaped = sessions_->ReapExpired();
    if (reaped > 0) {
      TS_LOG(INFO) << "expired " << reaped << " idle session(s)";
    }
    tickets_->ReapExpired();
    mu_.Lock();
  }
}

void Server::Shutdown(absl::Duration grace) {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + grace;
  if (grpc_server_ != nullptr) {
    grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
    if (health != nullptr) health->SetServingStatus(false);
  }
  absl::Time grpc_deadline = deadline;
  if (admission_ != nullptr && !admission_->Drain(grace)) {
    TS_LOG(WARNING) << "shutdown: " << admission_->inflight()
                    << " request(s) still running after the grace period";
  } else {
    // Every admitted request has finished; what is left are idle long-lived
    // streams (health Watch, an idle Stream) and calls that arrived during the
    // drain, which only need a moment to be answered UNAVAILABLE.
    grpc_deadline = std::min(deadline, absl::Now() + kIdleStreamGrace);
  }
  // No connection may reach gRPC once it shuts down (see grpc_connection_sink.h).
  if (accept_loop_ != nullptr) accept_loop_->Stop();
  if (grpc_server_ != nullptr) grpc_server_->Shutdown(absl::ToChronoTime(grpc_deadline));
  if (workers_ != nullptr) workers_->Stop();
  {
    absl::MutexLock lock(&mu_);
    stop_reaper_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  if (sessions_ != nullptr) sessions_->CloseAll();
  exposer_.reset();
  for (const std::string& path : socket_paths_) ::unlink(path.c_str());
  socket_paths_.clear();
}

}  // namespace tokensel::server
