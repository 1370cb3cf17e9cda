// Server: everything tokensel-server runs, in one object.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(options));
//   ... wait for SIGTERM ...
//   server->Shutdown();
//
// This is the composition root: the one place that knows every part.
// Start builds, in order: the backend (MakeBackend), the region mappers
// (host memory by descriptor, CUDA IPC, CUDA VMM by descriptor),
// ServiceMetrics, the BufferRegistry, the SessionManager (a session's end
// unregisters its buffers and drops its fd tickets), the FdTickets, the
// MemoryBudget, Admission, the Executor and the core::ServerDescription
// clients read with GetServerInfo; then the gRPC front end on every
// listener, the Prometheus exposer and a reaper thread that expires idle
// sessions and unredeemed fd tickets. Health reports SERVING for "" and
// "tokensel.v1.TokenSelect" once all of that is up, and
// NOT_SERVING for good once the backend reports unhealthy() (a device lost
// to a sticky CUDA error), checked by the reaper every reap_interval
// (core::HealthWatch).
//
// The transport (listeners, connection table, TCP security, the TokenSelect
// service, health, reflection, the op workers) is the GrpcFrontEnd
// (server/grpc/front_end.h), which this object starts last and stops first;
// see that header for the listener rules.
//
// Shutdown: health NOT_SERVING, Admission::Drain (in-flight requests finish,
// // new ones get UNAVAILABLE), the front end stops (the accept loop, gRPC
// with the rest of the grace period as deadline, then cancelling; the workers
// finish their queue; sockets removed), the reaper stops, every session is
// closed (its buffers unmapped), the exposer stops. Async Executes (CUDA
// IPC events) still in flight are waited for until the grace (at least
// 500 ms) ends; if some are stuck then (a client event that never
// completes), an ERROR says how many and the backend, registry, mappers,
// budget, async tracker, executor and metrics are leaked, not destroyed
// (their work may still use them), so that the process can exit.
// Idempotent; the destructor calls it.
//
// Thread-safe: Shutdown may race with requests and with itself.
#ifndef TOKENSEL_SERVER_APP_SERVER_H_
#define TOKENSEL_SERVER_APP_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "server/core/admission.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/core/fd_channel.h"
#include "server/core/fd_tickets.h"
#include "server/core/health_watch.h"
#include "server/core/memory_budget.h"
#include "server/core/region.h"
#include "server/core/service_metrics.h"
#include "server/core/session_manager.h"
#include "server/grpc/connection_table.h"
#include "server/grpc/front_end.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace tokensel::server {

struct ServerOptions {
  std::vector<std::string> listen = {"unix:///run/tokensel/tokensel.sock"};
  std::string metrics_address = "0.0.0.0:9464";  // empty = no exposer
  std::string backend = "auto";                  // auto | cpu | cuda
  int threads = 0;                               // 0 = hardware concurrency
  uint64_t max_message_bytes = uint64_t{64} << 20;
  absl::Duration session_ttl = absl::Seconds(60);
  absl::Duration max_session_ttl = absl::Hours(1);  // raised to session_ttl if lower
  // Reported to clients as a naming hint for the shm objects they create;
  // not a security boundary (memory is registered by descriptor).
  std::string shm_prefix = "/tokensel";
  std::string unix_socket_group;  // name or gid; empty = the server's gid
  std::string tls_cert_file;      // PEM; TLS on TCP listeners with tls_key_file
  std::string tls_key_file;
  std::string auth_token_file;     // bearer token required on TCP listeners
  bool insecure_tcp = false;       // allow TCP without TLS and/or token
  uint32_t max_buffers = 1024;     // per session
  uint32_t max_buffers_total = 0;  // all sessions; 0 = min(16384, vm.max_map_count / 4)
  uint32_t max_inflight = 256;
  uint32_t max_sessions = 1024;
  uint32_t max_sessions_per_peer = 256;
  // Executes with a wait_event outstanding (waiting on it, or stuck: left
  // waiting after their request gave up), per session / per peer / in the
  // server (core::AsyncLimits' wait caps, server/core/async_requests.h);
  // 0 < per session <= per peer <= total, else Start is INVALID_ARGUMENT.
  uint32_t max_waits_per_session = 8;
  uint32_t max_waits_per_peer = 64;
  uint32_t max_waits = 256;
  // MemoryBudget: 0 = a quarter of physical memory / min(that, 1 GiB).
  uint64_t memory_budget_bytes = 0;
  uint64_t max_request_memory_bytes = 0;
  // Per-op work bound (core::EstimateOpWork, elements); 0 = none.
  uint64_t max_op_elements = uint64_t{1} << 27;
  absl::Duration reap_interval = absl::Seconds(1);
  // Connections (gRPC on every transport + fd channel) in all / per peer
  // principal (a uid, a TCP address); beyond them a new connection is
  // closed at once.
  uint32_t max_connections = 4096;
  uint32_t max_connections_per_peer = 256;
  // TLS handshake and HTTP/2 preface of a TCP connection
  // (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS).
  absl::Duration handshake_timeout = absl::Seconds(10);
  // Receives the descriptors of the fd channel; not owned, must outlive the
  // Server. Null: no fd channel.
  core::FdReceiver* fd_receiver = nullptr;
  absl::Duration fd_channel_idle_timeout = absl::Seconds(30);
  // Tests: builds the backend instead of MakeBackend(backend, threads) (a
  // fake one, e.g. to lose a device). Null: MakeBackend.
  std::function<absl::StatusOr<std::unique_ptr<core::Backend>>()> make_backend;
};

class Server {
 public:
  // INVALID_ARGUMENT for bad options (shm prefix, listen address, backend
  // name, socket group, the TCP security files and policy, the wait caps),
  // FAILED_PRECONDITION when a listener or the exposer cannot bind, a live
  // server owns the socket or the socket cannot be given its group/mode, and
  // the backend's errors.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // One per --listen, with the port resolved ("unix:///tmp/t.sock",
  // "127.0.0.1:40123").
  const std::vector<std::string>& listen_addresses() const {
    return front_end_->listen_addresses();
  }
  // "host:port" of the exposer, empty when disabled.
  const std::string& metrics_address() const { return metrics_address_; }
  absl::string_view backend_name() const { return backend_->name(); }

  void Shutdown(absl::Duration grace = absl::Seconds(10));

  core::SessionManager& sessions() { return *sessions_; }
  core::BufferRegistry& registry() { return *registry_; }
  core::Admission& admission() { return *admission_; }
  core::ServiceMetrics& metrics() { return *metrics_; }
  // The fd channel's receiver (the front end serves the socket).
  core::FdTickets& tickets() { return *tickets_; }
  // Who is on each connection; PeerOf(&connections(), ctx) for a call.
  const ConnectionTable& connections() const { return front_end_->connections(); }

 private:
  explicit Server(ServerOptions options);
  absl::Status Init();
  absl::Status StartExposer();
  void ReaperLoop();
  // Shutdown, when async Executes are still stuck after the grace: leaks
  // (releases without destroying) every object their work may still use.
  void LeakStuckWork();

  const ServerOptions options_;
  // Destroyed last, after the backend and the mappers (and whatever their
  // teardowns queued): stops and joins the FreeGates' drainers, so that
  // none is inside a close while cudart tears down (server.cc).
  struct StopFreeGates {
    StopFreeGates() = default;
    ~StopFreeGates();
    StopFreeGates(const StopFreeGates&) = delete;
    StopFreeGates& operator=(const StopFreeGates&) = delete;
  } stop_free_gates_;
  std::unique_ptr<core::Backend> backend_;
  std::unique_ptr<core::RegionMapper> host_memory_;
  std::unique_ptr<core::RegionMapper> cuda_ipc_;
  std::unique_ptr<core::RegionMapper> cuda_vmm_;
  std::unique_ptr<core::ServiceMetrics> metrics_;
  std::unique_ptr<core::BufferRegistry> registry_;
  std::unique_ptr<core::SessionManager> sessions_;
  std::unique_ptr<core::FdTickets> tickets_;
  std::unique_ptr<core::MemoryBudget> budget_;
  std::unique_ptr<core::Admission> admission_;
  std::unique_ptr<core::Executor> executor_;
  // After the registry, budget and executor: destroyed before them, once
  // every async Execute (which holds their objects) completed.
  std::unique_ptr<core::AsyncRequests> async_;
  std::unique_ptr<GrpcFrontEnd> front_end_;
  std::unique_ptr<core::HealthWatch> health_watch_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string metrics_address_;

  tokensel::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  tokensel::Mutex mu_;
  bool stop_reaper_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_APP_SERVER_H_
