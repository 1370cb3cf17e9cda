// StreamReactor: one tokensel.v1.TokenSelect.Stream call.
//
// Session: the "tokensel-session" metadata if present (renewed, never closed
// by the stream; unknown -> the stream finishes with NOT_FOUND; another
// peer's -> PERMISSION_DENIED); otherwise the stream opens its own session
// (counted against the peer's quota), which ends when the stream does, and
// sends its id in the initial metadata ("tokensel-session"), so that the
// client can hand descriptors to it on the fd channel.
// Either way the stream pins the session (SessionManager::Pin): it does not
// expire while the stream is open, however long the client is quiet. Every
// request renews it.
//
// Requests are read pipelined, each admitted on arrival (a refusal is
// answered in order with its code), and processed strictly in arrival order
// by at most one WorkQueue task at a time, so a request sees the effects of
// the ones before it. Responses are written in the same order, one write
// outstanding, the rest queued. Back-pressure, not errors: the stream stops
// reading while kMaxQueued requests and responses wait (read but not yet
// answered, or answered but not yet written) or while they hold more than
// max_message_bytes, and reads again as they drain; a client that does not
// read its responses therefore stalls its own sends, and the server holds at
// most that much for it. Each request runs under the stream's stop token
// (a cancelled stream stops its work) and its own memory reservation, held
// until its response is written. Each StreamResponse carries the request_id
// and code/message; the response oneof is set only on success. The stream
// finishes with OK after the client half-closes and every response has been
// written, or CANCELLED after a cancellation.
// tokensel_rpc_duration_seconds{method="Stream"} covers the whole stream.
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
#include "common/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/core/admission.h"
#include "server/core/memory_budget.h"
#include "server/core/peer.h"
#include "server/grpc/handlers.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::server {

class StreamReactor final : public grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse> {
 public:
  // Requests + responses a stream holds before it stops reading.
  static constexpr size_t kMaxQueued = 8;

  // Creates the reactor (it deletes itself in OnDone) and starts it.
  static StreamReactor* Start(const Handlers* handlers, grpc::CallbackServerContext* ctx);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnSendInitialMetadataDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Pending {
    v1::StreamRequest request;
    absl::StatusOr<core::Admission::Ticket> ticket;
    size_t bytes = 0;
  };
  struct Outgoing {
    v1::StreamResponse response;
    core::MemoryBudget::Reservation memory;  // the inline results it carries
    size_t bytes = 0;
  };

  StreamReactor(const Handlers* handlers, grpc::CallbackServerContext* ctx);
  void Begin();
  // Worker task: answers the oldest pending request, re-posts itself while
  // more are pending.
  void ProcessNext();
  Outgoing Answer(Pending pending) const;
  absl::Status Dispatch(const v1::StreamRequest& request, v1::StreamResponse* response,
                        const core::RunOptions& options) const;
  // Queues `out` for writing; starts the write if none is outstanding.
  void Write(Outgoing out);
  // Whether another read may start now (not half-closed, not cancelled, no
  // read outstanding, below the queue bounds). Marks the read started.
  bool ClaimReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the stream is over: no read, worker task or write outstanding.
  // Returns the status to finish with (the caller calls FinishNow outside
  // the lock) exactly once, else nullopt.
  std::optional<absl::Status> ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishNow(const absl::Status& status);

  const Handlers* const handlers_;
  grpc::CallbackServerContext* const ctx_;
  const RpcTimer timer_;
  const CallStopToken stop_;
  const size_t max_queued_bytes_;
  core::Peer peer_;
  std::string session_;
  bool owns_session_ = false;
  bool pinned_ = false;

  v1::StreamRequest read_;  // target of the outstanding read

  tokensel::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool processing_ ABSL_GUARDED_BY(mu_) = false;      // a worker task owns pending_
  std::deque<Outgoing> writes_ ABSL_GUARDED_BY(mu_);  // front = in flight
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;      // of pending_ and writes_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;      // a read is outstanding
  bool half_closed_ ABSL_GUARDED_BY(mu_) = false;  // the client sends no more
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;    // cancelled or a write failed
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_STREAM_REACTOR_H_
