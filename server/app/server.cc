#include "server/app/server.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/tensor_view.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/backends/make_backend.h"
#include "server/core/async_requests.h"
#include "server/core/free_gate.h"
#include "server/core/server_description.h"
#include "server/grpc/handlers.h"
#include "server/grpc/listeners.h"
#include "server/memory/cuda_ipc_mapper.h"
#include "server/memory/cuda_vmm_mapper.h"
#include "server/memory/host_fd_mapper.h"
#include "server/memory/sigbus_guard.h"

#ifndef TOKENSEL_VERSION
#define TOKENSEL_VERSION "unknown"
#endif

namespace tokensel::server {
namespace {

// How long idle streams and not-yet-admitted calls get once every admitted
// request has drained (see Shutdown).
constexpr absl::Duration kIdleStreamGrace = absl::Milliseconds(500);

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

Server::Server(ServerOptions options) : options_(std::move(options)) {}

Server::~Server() { Shutdown(); }

Server::StopFreeGates::~StopFreeGates() {
  // Every member that queues teardowns is gone (or leaked with stuck work):
  // what can run within the bound runs, the rest is leaked on purpose,
  // counted and logged (server/core/free_gate.h).
  (void)core::FreeGate::StopAll();
}

absl::Status Server::Init() {
  if (options_.max_inflight == 0) return absl::InvalidArgumentError("max_inflight must be > 0");
  core::AsyncLimits async_limits;
  async_limits.stuck_per_session = options_.max_waits_per_session;
  async_limits.stuck_per_peer = options_.max_waits_per_peer;
  async_limits.stuck_total = options_.max_waits;
  RETURN_IF_ERROR(async_limits.CheckWaitCaps());
  // Every live registration of one peer fits its share of a device's
  // FreeGate rooms (free_gate.h; review2 of the seventh session, NIT 4).
  static_assert(memory::SigbusGuard::kCapacity <= core::FreeGate::kMaxPendingPerOwner);
  if (options_.max_buffers_total > memory::SigbusGuard::kCapacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_buffers_total must be <= ", memory::SigbusGuard::kCapacity));
  }

  if (options_.make_backend) {
    ASSIGN_OR_RETURN(backend_, options_.make_backend());
  } else {
    ASSIGN_OR_RETURN(backend_, backends::MakeBackend(options_.backend, options_.threads));
  }
  ASSIGN_OR_RETURN(host_memory_, memory::HostFdMapper::Create());
  // The CUDA mappers serve only the backend's own devices, and exist only
  // for a backend that accesses CUDA device memory: a CPU backend on a GPU
  // host must not map (and create contexts on) GPUs for clients (without
  // them a cuda_ipc or cuda_vmm registration is FAILED_PRECONDITION).
  if (backend_->CanAccess(core::MemoryKind::kCudaDevice)) {
    std::vector<memory::CudaIpcDevice> ipc_devices;
    for (const core::DeviceDescription& d : backend_->devices()) {
      ipc_devices.push_back({d.ordinal, d.uuid});
    }
    cuda_ipc_ = memory::MakeCudaIpcMapper(std::move(ipc_devices));
    memory::CudaVmmMapperOptions vmm;
    for (const core::DeviceDescription& d : backend_->devices()) vmm.device_uuids.push_back(d.uuid);
    // Mapped VMM bytes (live regions and deferred teardowns) are capped per
    // device at 4x its memory: buffer quotas count buffers, not bytes, each
    // mapping's page tables cost device memory, and a stuck client wait on
    // one device (its teardowns deferred) must not refuse the others.
    vmm.mapped_device_memory_multiple = 4;
    cuda_vmm_ = memory::MakeCudaVmmMapper(std::move(vmm));
  }

  metrics_ = std::make_unique<core::ServiceMetrics>(TOKENSEL_VERSION, backend_->name(),
                                                    backend_->device_labels());
  core::RegistryLimits registry_limits;
  registry_limits.max_buffers_per_session = options_.max_buffers;
  registry_limits.max_buffers =
      options_.max_buffers_total != 0 ? options_.max_buffers_total : DefaultMaxBuffersTotal();
  registry_ = std::make_unique<core::BufferRegistry>(
      host_memory_.get(), cuda_ipc_.get(), cuda_vmm_.get(), registry_limits, metrics_.get());
  async_ = std::make_unique<core::AsyncRequests>(async_limits, metrics_.get());
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
        // Its async Executes still in flight keep what they use (buffer
        // leases, reservation) and complete; its deferred error and its
        // opened events go.
        async_->EndSession(session);
        backend_->EndSession(session);
      },
      metrics_.get());
  // The backend keeps things per live session (its IpcEventCache): begun
  // before the client learns the id, ended by the callback above.
  sessions_->set_on_begin([this](const std::string& session) { backend_->BeginSession(session); });
  tickets_ = std::make_unique<core::FdTickets>(sessions_.get(), host_memory_.get(), cuda_vmm_.get(),
                                               core::FdTicketLimits());
  const uint64_t budget_bytes =
      options_.memory_budget_bytes != 0 ? options_.memory_budget_bytes : DefaultMemoryBudgetBytes();
  const uint64_t request_bytes = options_.max_request_memory_bytes != 0
                                     ? options_.max_request_memory_bytes
                                     : std::min(budget_bytes, uint64_t{1} << 30);
  budget_ = std::make_unique<core::MemoryBudget>(budget_bytes, request_bytes, metrics_.get());
  // The CUDA pools charge it for idle blocks kept beyond their caps while
  // frees wait (server/core/free_gate.h); detached at shutdown.
  backend_->AttachMemoryBudget(budget_.get());
  admission_ = std::make_unique<core::Admission>(options_.max_inflight, metrics_.get());
  core::ExecutorLimits executor_limits;
  executor_limits.max_inline_bytes = options_.max_message_bytes;
  executor_limits.max_response_bytes = options_.max_message_bytes;
  executor_limits.max_op_work = options_.max_op_elements;
  executor_ = std::make_unique<core::Executor>(backend_.get(), registry_.get(), metrics_.get(),
                                               executor_limits, budget_.get());
  const int threads = options_.threads > 0
                          ? options_.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  ServiceDeps deps;
  deps.sessions = sessions_.get();
  deps.registry = registry_.get();
  deps.admission = admission_.get();
  deps.executor = executor_.get();
  deps.async = async_.get();
  deps.metrics = metrics_.get();
  deps.tickets = tickets_.get();
  core::ServerDescription& d = deps.description;
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
  if (backend_->CanAccess(core::MemoryKind::kCudaDevice)) {
    d.memory_kinds.push_back("cuda_ipc");
    if (cuda_vmm_ != nullptr && memory::CudaVmmAvailable().ok()) {
      d.memory_kinds.push_back("cuda_vmm");
    }
  }
  d.ipc_events = backend_->ipc_events() == core::IpcEventSupport::kSupported;
  if (d.ipc_events) {
    d.max_async_executes_per_session = async_->limits().per_session;
    d.max_async_executes = async_->limits().total;
    d.max_stuck_executes_per_session = async_->limits().stuck_per_session;
    d.max_stuck_executes = async_->limits().stuck_total;
    d.max_async_executes_per_peer = async_->limits().per_peer;
    d.max_stuck_executes_per_peer = async_->limits().stuck_per_peer;
  }

  FrontEndOptions front;
  front.listen = options_.listen;
  front.unix_socket_group = options_.unix_socket_group;
  front.tcp_security.tls_cert_file = options_.tls_cert_file;
  front.tcp_security.tls_key_file = options_.tls_key_file;
  front.tcp_security.auth_token_file = options_.auth_token_file;
  front.tcp_security.insecure_tcp = options_.insecure_tcp;
  front.max_message_bytes = options_.max_message_bytes;
  front.handshake_timeout = options_.handshake_timeout;
  front.max_connections = options_.max_connections;
  front.max_connections_per_peer = options_.max_connections_per_peer;
  front.fd_channel_idle_timeout = options_.fd_channel_idle_timeout;
  front.worker_threads = threads;
  // The fd channel delivers to the tickets (unless a test brought its own).
  front.fd_receiver = options_.fd_receiver != nullptr ? options_.fd_receiver : tickets_.get();
  ASSIGN_OR_RETURN(front_end_, GrpcFrontEnd::Start(std::move(front), std::move(deps)));

  RETURN_IF_ERROR(StartExposer());
  health_watch_ = std::make_unique<core::HealthWatch>(backend_.get(),
                                                      [this] { front_end_->SetServing(false); });
  // SERVING before the reaper starts: its first health poll may only ever
  // turn it off.
  front_end_->SetServing(true);
  reaper_ = std::thread([this] { ReaperLoop(); });
  return absl::OkStatus();
}

absl::Status Server::StartExposer() {
  if (options_.metrics_address.empty()) return absl::OkStatus();
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(options_.metrics_address);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(absl::StrCat("metrics_address ", options_.metrics_address,
                                                      ": cannot serve metrics: ", e.what()));
  }
  exposer_->RegisterCollectable(metrics_->registry());
  const std::vector<int> ports = exposer_->GetListeningPorts();
  metrics_address_ =
      ports.empty() ? options_.metrics_address : WithPort(options_.metrics_address, ports[0]);
  return absl::OkStatus();
}

void Server::ReaperLoop() {
  tokensel::MutexLock lock(&mu_);
  while (!stop_reaper_) {
    mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_reaper_; },
                         std::max(options_.reap_interval, absl::Milliseconds(10)));
    if (stop_reaper_) break;
    mu_.Unlock();
    const int reaped = sessions_->ReapExpired();
    if (reaped > 0) {
      TS_LOG(INFO) << "expired " << reaped << " idle session(s)";
    }
    tickets_->ReapExpired();
    health_watch_->Poll();
    mu_.Lock();
  }
}

void Server::Shutdown(absl::Duration grace) {
  tokensel::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + grace;
  if (front_end_ != nullptr) front_end_->SetServing(false);
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
  if (front_end_ != nullptr) front_end_->Stop(grpc_deadline);
  // Async Executes answered before their device work completed still hold
  // buffer leases, reservations and the backend's streams: they complete
  // before any of those is destroyed (the device finishes them; nothing can
  // cut a stream short). A client event that never completes would keep
  // the server here for ever: after the grace, what they hold is leaked
  // instead (LeakStuckWork) so that the process can exit.
  bool stuck = false;
  if (async_ != nullptr && !async_->WaitAll(std::max(deadline - absl::Now(), kIdleStreamGrace))) {
    stuck = true;
    TS_LOG(ERROR) << "shutdown: " << async_->inflight() + async_->stuck()
                  << " asynchronous Execute(s) stuck (their streams wait on client events that "
                     "have not completed); leaking the backend, buffers and budget they hold so "
                     "that the process can exit";
  }
  {
    tokensel::MutexLock lock(&mu_);
    stop_reaper_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  if (sessions_ != nullptr) sessions_->CloseAll();
  exposer_.reset();
  if (stuck) {
    // The completion threads stop waiting too (their tickets complete, what
    // the stuck streams use is leaked): nothing keeps polling the device
    // while the process exits. Then the owners are leaked.
    if (backend_ != nullptr) backend_->AbandonPendingWork();
    LeakStuckWork();
  } else if (backend_ != nullptr) {
    // The budget is destroyed before the backend: its pools' charge first.
    backend_->AttachMemoryBudget(nullptr);
  }
}

void Server::LeakStuckWork() {
  // The stuck work is in the backend's completion queue, whose thread (or,
  // for a test backend, whoever completes it) will still touch: the backend
  // (its device, pools and the queue itself: destroying it would wait for
  // ever), the holds (buffer leases: the buffers, their regions and
  // mappers; the budget reservation; the route, the backend again), and the
  // completion (the AsyncRequests ticket, which counts in the metrics).
  // None of them is destroyed: each is released from its owner and left
  // to the process's exit. Also what refers to them and might use them when
  // destroyed (the executor, sessions, health watch).
  // Kept reachable from a static list: intentionally leaked, not lost (a
  // leak checker does not report them).
  static auto* const leaked = new std::vector<const void*>();
  auto leak = [](auto& owner) {
    try {
      leaked->push_back(owner.get());
    } catch (...) {  // out of memory: leaked all the same, only unlisted
    }
    (void)owner.release();
  };
  leak(backend_);
  leak(host_memory_);
  leak(cuda_ipc_);
  leak(cuda_vmm_);
  leak(metrics_);
  leak(registry_);
  leak(budget_);
  leak(async_);
  leak(executor_);
  leak(sessions_);
  leak(health_watch_);
}

}  // namespace tokensel::server
