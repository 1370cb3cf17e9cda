#include "server/grpc/service.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "server/grpc/convert.h"
#include "server/grpc/status_util.h"
#include "server/grpc/stream_reactor.h"

namespace tokensel::server {
namespace {

// Records the RPC's metrics and finishes it with `status`.
grpc::ServerUnaryReactor* Finish(grpc::ServerUnaryReactor* reactor, const RpcTimer& timer,
                                 const absl::Status& status) {
  timer.Record(status.code());
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

uint64_t ToMillis(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(absl::ToInt64Milliseconds(d), 0));
}

// Ops whose tensors hold at most this many elements in total run on the
// gRPC callback thread (about 64 KiB of fp32: tens of microseconds).
constexpr uint64_t kInlineOpMaxElements = uint64_t{1} << 14;

// Longer than any useful lease (and well inside absl::Duration's range).
constexpr uint64_t kMaxRequestedTtlMs = uint64_t{1} << 40;

}  // namespace

template <typename Work>
grpc::ServerUnaryReactor* TokenSelectService::SessionCall(grpc::CallbackServerContext* ctx,
                                                          absl::string_view method, RunOn where,
                                                          Work work) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const ServiceDeps& deps = handlers_.deps();
  RpcTimer timer(deps.metrics, method);
  absl::StatusOr<core::SessionInfo> session = handlers_.TouchSession(*ctx);
  if (!session.ok()) return Finish(reactor, timer, session.status());
  absl::StatusOr<core::Admission::Ticket> ticket = deps.admission->Admit();
  if (!ticket.ok()) return Finish(reactor, timer, ticket.status());
  // The stop token and the memory reservation live until the reply is
  // finished: the results the work leaves in `response` stay counted.
  // The caller's principal (the session's owner) goes with the options:
  // the evented Executes are capped per peer too (AsyncRequests).
  auto run = [ctx, budget = deps.executor->budget(), work = std::move(work),
              peer = std::move(session->owner)](const std::string& id) mutable {
    CallStopToken stop(ctx);
    core::MemoryBudget::Reservation memory =
        budget != nullptr ? budget->Open() : core::MemoryBudget::Reservation();
    core::RunOptions options{&stop, &memory};
    options.peer = peer;
    return NoThrow([&] { return work(id, options); });
  };
  if (where == RunOn::kCallbackThread) {
    return Finish(reactor, timer, run(session->id));
  }
  deps.workers->Post([reactor, timer, id = std::move(session->id), ticket = std::move(*ticket),
                      run = std::move(run)]() mutable {
    absl::Status status = run(id);
    ticket = core::Admission::Ticket();  // free the slot before the client sees the reply
    Finish(reactor, timer, status);
  });
  return reactor;
}

template <typename Request>
grpc::ServerUnaryReactor* TokenSelectService::OpCall(grpc::CallbackServerContext* ctx,
                                                     absl::string_view method,
                                                     const Request* request,
                                                     v1::OpResponse* response) {
  // Converted here (it is cheap) to size the work; a conversion error is
  // reported by the work itself, after the session checks.
  absl::StatusOr<core::OpRequest> op = OpFromProto(*request);
  // Small ops finish in microseconds: running them here saves the hop to the
  // worker pool (which dominated small-op latency); large ones go to the pool
  // so a callback thread is never held for long.
  const RunOn where = !op.ok() || core::EstimateOpWork(*op) <= kInlineOpMaxElements
                          ? RunOn::kCallbackThread
                          : RunOn::kWorker;
  return SessionCall(ctx, method, where,
                     [this, op = std::move(op), response](const std::string& session,
                                                          const core::RunOptions& options) {
                       RETURN_IF_ERROR(op.status());
                       return handlers_.RunOp(session, *op, response, options);
                     });
}

grpc::ServerUnaryReactor* TokenSelectService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                            const v1::GetServerInfoRequest*,
                                                            v1::ServerInfo* response) {
  RpcTimer timer(handlers_.deps().metrics, "GetServerInfo");
  ServerInfoToProto(handlers_.deps().description, response);
  return Finish(ctx->DefaultReactor(), timer, absl::OkStatus());
}

grpc::ServerUnaryReactor* TokenSelectService::Ping(grpc::CallbackServerContext* ctx,
                                                   const v1::PingRequest*, v1::PingResponse*) {
  RpcTimer timer(handlers_.deps().metrics, "Ping");
  return Finish(ctx->DefaultReactor(), timer, absl::OkStatus());
}

grpc::ServerUnaryReactor* TokenSelectService::OpenSession(grpc::CallbackServerContext* ctx,
                                                          const v1::OpenSessionRequest* request,
                                                          v1::OpenSessionResponse* response) {
  const ServiceDeps& deps = handlers_.deps();
  RpcTimer timer(deps.metrics, "OpenSession");
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<core::Admission::Ticket> ticket = deps.admission->Admit();
  if (!ticket.ok()) return Finish(reactor, timer, ticket.status());
  const uint64_t ttl_ms = std::min(request->lease_ttl_ms(), kMaxRequestedTtlMs);
  absl::StatusOr<core::SessionInfo> session = deps.sessions->Open(
      request->client_name(), absl::Milliseconds(ttl_ms), handlers_.PeerOf(*ctx));
  if (session.ok()) {
    response->set_session_id(session->id);
    response->set_lease_ttl_ms(ToMillis(session->ttl));
  }
  return Finish(reactor, timer, session.status());
}

grpc::ServerUnaryReactor* TokenSelectService::KeepAlive(grpc::CallbackServerContext* ctx,
                                                        const v1::KeepAliveRequest*,
                                                        v1::KeepAliveResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  RpcTimer timer(handlers_.deps().metrics, "KeepAlive");
  absl::StatusOr<core::SessionInfo> session = handlers_.TouchSession(*ctx);
  if (session.ok()) response->set_lease_ttl_ms(ToMillis(session->ttl));
  return Finish(reactor, timer, session.status());
}

grpc::ServerUnaryReactor* TokenSelectService::CloseSession(grpc::CallbackServerContext* ctx,
                                                           const v1::CloseSessionRequest*,
                                                           v1::CloseSessionResponse*) {
  return SessionCall(ctx, "CloseSession", RunOn::kCallbackThread,
                     [this](const std::string& session, const core::RunOptions&) {
                       return handlers_.deps().sessions->Close(session);
                     });
}

grpc::ServerUnaryReactor* TokenSelectService::RegisterBuffer(
    grpc::CallbackServerContext* ctx, const v1::RegisterBufferRequest* request,
    v1::RegisterBufferResponse* response) {
  // Mapping may take a while (cudaIpcOpenMemHandle): a worker does it.
  return SessionCall(
      ctx, "RegisterBuffer", RunOn::kWorker,
      [this, request, response](const std::string& session, const core::RunOptions& options) {
        return handlers_.Register(session, *request, response, options.peer);
      });
}

grpc::ServerUnaryReactor* TokenSelectService::UnregisterBuffer(
    grpc::CallbackServerContext* ctx, const v1::UnregisterBufferRequest* request,
    v1::UnregisterBufferResponse*) {
  return SessionCall(ctx, "UnregisterBuffer", RunOn::kCallbackThread,
                     [this, request](const std::string& session, const core::RunOptions&) {
                       return handlers_.Unregister(session, *request);
                     });
}

grpc::ServerUnaryReactor* TokenSelectService::ListBuffers(grpc::CallbackServerContext* ctx,
                                                          const v1::ListBuffersRequest*,
                                                          v1::ListBuffersResponse* response) {
  return SessionCall(
      ctx, "ListBuffers", RunOn::kCallbackThread,
      [this, response](const std::string& session, const core::RunOptions&) {
        for (const core::BufferInfo& info : handlers_.deps().registry->List(session)) {
          BufferInfoToProto(info, response->add_buffers());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* TokenSelectService::SortTokens(grpc::CallbackServerContext* ctx,
                                                         const v1::SortTokensRequest* request,
                                                         v1::OpResponse* response) {
  return OpCall(ctx, "SortTokens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::GatherTokens(grpc::CallbackServerContext* ctx,
                                                           const v1::GatherTokensRequest* request,
                                                           v1::OpResponse* response) {
  return OpCall(ctx, "GatherTokens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::ScatterTokens(grpc::CallbackServerContext* ctx,
                                                            const v1::ScatterTokensRequest* request,
                                                            v1::OpResponse* response) {
  return OpCall(ctx, "ScatterTokens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::GatherBertMask(
    grpc::CallbackServerContext* ctx, const v1::GatherBertMaskRequest* request,
    v1::OpResponse* response) {
  return OpCall(ctx, "GatherBertMask", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::SliceGptMask(grpc::CallbackServerContext* ctx,
                                                           const v1::SliceGptMaskRequest* request,
                                                           v1::OpResponse* response) {
  return OpCall(ctx, "SliceGptMask", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::SegmentSeqlens(
    grpc::CallbackServerContext* ctx, const v1::SegmentSeqlensRequest* request,
    v1::OpResponse* response) {
  return OpCall(ctx, "SegmentSeqlens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::SampleTokens(grpc::CallbackServerContext* ctx,
                                                           const v1::SampleTokensRequest* request,
                                                           v1::OpResponse* response) {
  return OpCall(ctx, "SampleTokens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::TopKTokens(grpc::CallbackServerContext* ctx,
                                                         const v1::TopKTokensRequest* request,
                                                         v1::OpResponse* response) {
  return OpCall(ctx, "TopKTokens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::MergeTokens(grpc::CallbackServerContext* ctx,
                                                          const v1::MergeTokensRequest* request,
                                                          v1::OpResponse* response) {
  return OpCall(ctx, "MergeTokens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::SplitTokens(grpc::CallbackServerContext* ctx,
                                                          const v1::SplitTokensRequest* request,
                                                          v1::OpResponse* response) {
  return OpCall(ctx, "SplitTokens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::SamplePackedTokens(
    grpc::CallbackServerContext* ctx, const v1::SamplePackedTokensRequest* request,
    v1::OpResponse* response) {
  return OpCall(ctx, "SamplePackedTokens", request, response);
}

grpc::ServerUnaryReactor* TokenSelectService::Execute(grpc::CallbackServerContext* ctx,
                                                      const v1::ExecuteRequest* request,
                                                      v1::ExecuteResponse* response) {
  return SessionCall(
      ctx, "Execute", RunOn::kWorker,
      [this, request, response](const std::string& session, const core::RunOptions& options) {
        return handlers_.Execute(session, *request, response, options);
      });
}

grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse>* TokenSelectService::Stream(
    grpc::CallbackServerContext* ctx) {
  return StreamReactor::Start(&handlers_, ctx);
}

}  // namespace tokensel::server
