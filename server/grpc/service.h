// TokenSelectService: the tokensel.v1.TokenSelect callback service.
//
// Every method is: read the "tokensel-session" metadata -> renew the session
// -> admit (RESOURCE_EXHAUSTED when max_inflight requests are in flight,
// UNAVAILABLE while draining) -> convert -> core -> convert -> Finish.
// GetServerInfo, Ping and OpenSession need no session. Op RPCs, Execute and
// RegisterBuffer run on the server's WorkQueue and finish from there; the
// other methods are short and bounded and finish on the gRPC thread. Every
// RPC records tokensel_rpc_duration_seconds / tokensel_requests_total once.
//
// Stream: see stream_reactor.h.
#ifndef TOKENSEL_SERVER_GRPC_SERVICE_H_
#define TOKENSEL_SERVER_GRPC_SERVICE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "server/grpc/handlers.h"
#include "tokensel/v1/tokensel.grpc.pb.h"

namespace tokensel::server {

class TokenSelectService final : public v1::TokenSelect::CallbackService {
 public:
  explicit TokenSelectService(ServiceDeps deps) : handlers_(std::move(deps)) {}

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const v1::PingRequest* request,
                                 v1::PingResponse* response) override;
  grpc::ServerUnaryReactor* OpenSession(grpc::CallbackServerContext* ctx,
                                        const v1::OpenSessionRequest* request,
                                        v1::OpenSessionResponse* response) override;
  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* ctx,
                                      const v1::KeepAliveRequest* request,
                                      v1::KeepAliveResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* ctx,
                                         const v1::CloseSessionRequest* request,
                                         v1::CloseSessionResponse* response) override;
  grpc::ServerUnaryReactor* RegisterBuffer(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterBufferRequest* request,
                                           v1::RegisterBufferResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterBuffer(grpc::CallbackServerContext* ctx,
                                             const v1::UnregisterBufferRequest* request,
                                             v1::UnregisterBufferResponse* response) override;
  grpc::ServerUnaryReactor* ListBuffers(grpc::CallbackServerContext* ctx,
                                        const v1::ListBuffersRequest* request,
                                        v1::ListBuffersResponse* response) override;

  grpc::ServerUnaryReactor* SortTokens(grpc::CallbackServerContext* ctx,
                                       const v1::SortTokensRequest* request,
                                       v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* GatherTokens(grpc::CallbackServerContext* ctx,
                                         const v1::GatherTokensRequest* request,
                                         v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* ScatterTokens(grpc::CallbackServerContext* ctx,
                                          const v1::ScatterTokensRequest* request,
                                          v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* GatherBertMask(grpc::CallbackServerContext* ctx,
                                           const v1::GatherBertMaskRequest* request,
                                           v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* SliceGptMask(grpc::CallbackServerContext* ctx,
                                         const v1::SliceGptMaskRequest* request,
                                         v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* SegmentSeqlens(grpc::CallbackServerContext* ctx,
                                           const v1::SegmentSeqlensRequest* request,
                                           v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* SampleTokens(grpc::CallbackServerContext* ctx,
                                         const v1::SampleTokensRequest* request,
                                         v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* TopKTokens(grpc::CallbackServerContext* ctx,
                                       const v1::TopKTokensRequest* request,
                                       v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* MergeTokens(grpc::CallbackServerContext* ctx,
                                        const v1::MergeTokensRequest* request,
                                        v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* SplitTokens(grpc::CallbackServerContext* ctx,
                                        const v1::SplitTokensRequest* request,
                                        v1::OpResponse* response) override;
  grpc::ServerUnaryReactor* SamplePackedTokens(grpc::CallbackServerContext* ctx,
                                               const v1::SamplePackedTokensRequest* request,
                                               v1::OpResponse* response) override;

  grpc::ServerUnaryReactor* Execute(grpc::CallbackServerContext* ctx,
                                    const v1::ExecuteRequest* request,
                                    v1::ExecuteResponse* response) override;
  grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse>* Stream(
      grpc::CallbackServerContext* ctx) override;

 private:
  // Where a session RPC's work runs.
  enum class RunOn { kCallbackThread, kWorker };
  // Session -> admit -> `work(session_id)` on `where` -> Finish.
  template <typename Work>
  grpc::ServerUnaryReactor* SessionCall(grpc::CallbackServerContext* ctx, absl::string_view method,
                                        RunOn where, Work work);
  // An op RPC: converts `request` and runs it on a worker.
  template <typename Request>
  grpc::ServerUnaryReactor* OpCall(grpc::CallbackServerContext* ctx, absl::string_view method,
                                   const Request* request, v1::OpResponse* response);

  Handlers handlers_;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_SERVICE_H_
