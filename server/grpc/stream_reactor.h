// StreamReactor: one tokensel.v1.TokenSelect.Stream call.
//
// Session: the "tokensel-session" metadata if present (renewed, never closed
// by the stream; unknown -> the stream finishes with NOT_FOUND); otherwise
// the stream opens its own session, which ends when the stream does. Every
// request renews the session.
//
// Requests are read continuously (pipelined: the next read starts as soon as
// one arrives), each admitted on arrival (a refusal is answered in order with
// its code), and processed strictly in arrival order by at most one WorkQueue
// task at a time, so a request sees the effects of the ones before it.
// Responses are written in the same order, one write outstanding, the rest
// queued. Each StreamResponse carries the request_id and code/message; the
// response oneof is set only on success. The stream finishes with OK after
// the client half-closes and every response has been written, or CANCELLED
// after a cancellation. tokensel_rpc_duration_seconds{method="Stream"} covers
// the whole stream.
//
// Threading: reactions and the worker task share state under one mutex; no
// gRPC operation is started while it is held.
#ifndef TOKENSEL_SERVER_GRPC_STREAM_REACTOR_H_
#define TOKENSEL_SERVER_GRPC_STREAM_REACTOR_H_

#include <deque>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/core/admission.h"
#include "server/grpc/handlers.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::server {

class StreamReactor final
    : public grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse> {
 public:
  // Creates the reactor (it deletes itself in OnDone) and starts it.
  static StreamReactor* Start(const Handlers* handlers, grpc::CallbackServerContext* ctx);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Pending {
    v1::StreamRequest request;
    absl::StatusOr<core::Admission::Ticket> ticket;
  };

  StreamReactor(const Handlers* handlers, grpc::CallbackServerContext* ctx);
  void Begin(grpc::CallbackServerContext* ctx);
  // Worker task: answers the oldest pending request, re-posts itself while
  // more are pending.
  void ProcessNext();
  v1::StreamResponse Answer(Pending pending) const;
  absl::Status Dispatch(const v1::StreamRequest& request, v1::StreamResponse* response) const;
  // Queues `response` for writing; starts the write if none is outstanding.
  void Write(v1::StreamResponse response);
  // Whether the stream is over: no read, worker task or write outstanding.
  // Returns the status to finish with (the caller calls FinishNow outside
  // the lock) exactly once, else nullopt.
  std::optional<absl::Status> ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishNow(const absl::Status& status);

  const Handlers* const handlers_;
  const RpcTimer timer_;
  std::string session_;
  bool owns_session_ = false;

  v1::StreamRequest read_;  // target of the outstanding read

  absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool processing_ ABSL_GUARDED_BY(mu_) = false;  // a worker task owns pending_
  std::deque<v1::StreamResponse> writes_ ABSL_GUARDED_BY(mu_);  // front = in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a read is outstanding
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // cancelled or a write failed
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_STREAM_REACTOR_H_
