// Handlers: the convert -> core -> convert step of every session RPC, shared
// by the unary methods and the Stream reactor. No transport code beyond
// reading the session metadata.
//
// Thread-safe (the core objects are); methods may block on the backend, so
// the service calls the op methods from its WorkQueue, never from a gRPC
// callback thread.
#ifndef TOKENSEL_SERVER_GRPC_HANDLERS_H_
#define TOKENSEL_SERVER_GRPC_HANDLERS_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "kernels/stop.h"
#include "server/core/admission.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/core/fd_tickets.h"
#include "server/core/peer.h"
#include "server/core/service_metrics.h"
#include "server/core/session_manager.h"
#include "server/grpc/connection_table.h"
#include "server/grpc/convert.h"
#include "server/grpc/work_queue.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::server {

// The metadata key that carries the session id.
inline constexpr absl::string_view kSessionMetadataKey = "tokensel-session";

// What the service works with; owned by the Server, all non-null except
// `metrics`, `tickets` (no fd registration) and `connections` (callers on
// unix sockets are then Peer{}).
struct ServiceDeps {
  core::SessionManager* sessions = nullptr;
  core::BufferRegistry* registry = nullptr;
  core::Admission* admission = nullptr;
  core::Executor* executor = nullptr;
  core::AsyncRequests* async = nullptr;  // null: evented Executes are synchronous
  core::ServiceMetrics* metrics = nullptr;
  core::FdTickets* tickets = nullptr;
  WorkQueue* workers = nullptr;
  // Peers of the connections (PeerOf(connections, ctx)); null in tests
  // without an accept loop.
  const ConnectionTable* connections = nullptr;
  core::ServerDescription description;
};

// A call's stop token: the call was cancelled (CANCELLED) or its deadline
// passed (DEADLINE_EXCEEDED). Valid while the call is.
class CallStopToken final : public kernels::StopToken {
 public:
  explicit CallStopToken(grpc::CallbackServerContext* ctx)
      : ctx_(ctx), deadline_(ctx->deadline()) {}
  absl::Status Check() const override;

 private:
  grpc::CallbackServerContext* const ctx_;
  const std::chrono::system_clock::time_point deadline_;
};

// Runs `work`, turning what would escape it into a status: std::bad_alloc
// is RESOURCE_EXHAUSTED for this request (never a crash of the server),
// any other exception INTERNAL.
absl::Status NoThrow(const std::function<absl::Status()>& work);

class Handlers {
 public:
  explicit Handlers(ServiceDeps deps) : deps_(std::move(deps)) {}

  const ServiceDeps& deps() const { return deps_; }

  // The session id in the call's metadata, or nullopt when there is none.
  static std::optional<std::string> SessionMetadata(const grpc::CallbackServerContext& ctx);

  // The caller of `ctx` as the accept loop identified its connection
  // (PeerOf in connection_table.h; Peer{} when it cannot tell).
  core::Peer PeerOf(const grpc::CallbackServerContext& ctx) const;

  // The call's session, renewed: INVALID_ARGUMENT "missing tokensel-session
  // metadata" when absent, NOT_FOUND when unknown or expired,
  // PERMISSION_DENIED when the caller is not the session's owner.
  absl::StatusOr<core::SessionInfo> TouchSession(const grpc::CallbackServerContext& ctx) const;

  // The op methods run under `options` (stop token, memory reservation: the
  // inline results stay reserved in options.memory).
  absl::Status RunOp(const std::string& session, const core::OpRequest& op,
                     v1::OpResponse* response, const core::RunOptions& options) const;
  // Converts `op` (errors prefixed with `prefix`) and runs it.
  absl::Status RunOp(const std::string& session, const v1::Op& op, v1::OpResponse* response,
                     const core::RunOptions& options, absl::string_view prefix = "") const;
  // RunAll; FAILED_PRECONDITION when wait_event/record_event are set (no
  // backend of this build supports CUDA IPC events).
  absl::Status Execute(const std::string& session, const v1::ExecuteRequest& request,
                       v1::ExecuteResponse* response, const core::RunOptions& options) const;
  // `fd`: redeems the ticket (FdTickets) and maps the descriptor, or, with
  // fd.segments, all the segments' tickets (all or none) and maps them as
  // one CUDA VMM buffer; cuda_ipc: as converted; host_shm by name:
  // PERMISSION_DENIED.
  // `owner`: the caller's Peer::Principal() (RunOptions::peer): a VMM
  // registration counts in that peer's share of its device's FreeGate.
  absl::Status Register(const std::string& session, const v1::RegisterBufferRequest& request,
                        v1::RegisterBufferResponse* response, absl::string_view owner = {}) const;
  absl::Status Unregister(const std::string& session,
                          const v1::UnregisterBufferRequest& request) const;

 private:
  absl::StatusOr<core::FdRegionSpec> VmmSegmentsFromProto(const std::string& session,
                                                          const v1::PassedFd& fd) const;

  const ServiceDeps deps_;
};

// Times one RPC and records tokensel_rpc_duration_seconds and
// tokensel_requests_total{method,code} once, when Record is called.
class RpcTimer {
 public:
  RpcTimer(core::ServiceMetrics* metrics, absl::string_view method)
      : metrics_(metrics), method_(method), start_(std::chrono::steady_clock::now()) {}
  void Record(absl::StatusCode code) const;

 private:
  core::ServiceMetrics* metrics_;
  absl::string_view method_;  // a string literal
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_HANDLERS_H_
