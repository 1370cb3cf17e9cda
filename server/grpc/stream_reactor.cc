#include "server/grpc/stream_reactor.h"

#include <utility>

#include "common/log.h"
#include "common/status_macros.h"
#include "server/grpc/status_util.h"

namespace tokensel::server {

StreamReactor* StreamReactor::Start(const Handlers* handlers, grpc::CallbackServerContext* ctx) {
  auto* reactor = new StreamReactor(handlers, ctx);
  reactor->Begin(ctx);
  return reactor;
}

StreamReactor::StreamReactor(const Handlers* handlers, grpc::CallbackServerContext*)
    : handlers_(handlers), timer_(handlers->deps().metrics, "Stream") {}

void StreamReactor::Begin(grpc::CallbackServerContext* ctx) {
  core::SessionManager& sessions = *handlers_->deps().sessions;
  absl::Status status;
  if (std::optional<std::string> id = Handlers::SessionMetadata(*ctx); id.has_value()) {
    status = sessions.Touch(*id).status();
    session_ = std::move(*id);
  } else {
    absl::StatusOr<core::SessionInfo> opened = sessions.Open("stream", absl::ZeroDuration());
    status = opened.status();
    if (opened.ok()) {
      session_ = std::move(opened->id);
      owns_session_ = true;
    }
  }
  if (!status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    FinishNow(status);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    reading_ = true;
  }
  StartRead(&read_);
}

void StreamReactor::OnReadDone(bool ok) {
  std::optional<absl::Status> finish;
  bool read_again = false;
  bool post = false;
  if (ok) {
    Pending pending{std::move(read_), handlers_->deps().admission->Admit()};
    read_.Clear();
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      pending_.push_back(std::move(pending));
      read_again = true;
      if (!processing_) post = processing_ = true;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    reading_ = read_again;
    if (!read_again) finish = ShouldFinishLocked();
  }
  if (read_again) StartRead(&read_);
  if (post) handlers_->deps().workers->Post([this] { ProcessNext(); });
  if (finish.has_value()) FinishNow(*finish);
}

void StreamReactor::ProcessNext() {
  std::optional<Pending> next;
  std::optional<absl::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || pending_.empty()) {
      pending_.clear();
      processing_ = false;
      finish = ShouldFinishLocked();
    } else {
      next.emplace(std::move(pending_.front()));
      pending_.pop_front();
    }
  }
  if (!next.has_value()) {
    if (finish.has_value()) FinishNow(*finish);
    return;
  }
  Write(Answer(std::move(*next)));
  // One request per task, so that busy streams take turns on the workers.
  handlers_->deps().workers->Post([this] { ProcessNext(); });
}

v1::StreamResponse StreamReactor::Answer(Pending pending) const {
  v1::StreamResponse response;
  response.set_request_id(pending.request.request_id());
  absl::Status status = pending.ticket.status();
  if (status.ok()) status = Dispatch(pending.request, &response);
  if (!status.ok()) {
    response.clear_response();
    response.set_code(static_cast<int>(status.code()));
    response.set_message(std::string(status.message()));
  }
  return response;  // `pending` (and its admission ticket) ends here
}

absl::Status StreamReactor::Dispatch(const v1::StreamRequest& request,
                                     v1::StreamResponse* response) const {
  RETURN_IF_ERROR(handlers_->deps().sessions->Touch(session_).status());
  switch (request.request_case()) {
    case v1::StreamRequest::kOp:
      return handlers_->RunOp(session_, request.op(), response->mutable_op(), "op.");
    case v1::StreamRequest::kExecute:
      return handlers_->Execute(session_, request.execute(), response->mutable_execute());
    case v1::StreamRequest::kRegisterBuffer:
      return handlers_->Register(session_, request.register_buffer(),
                                 response->mutable_register_buffer());
    case v1::StreamRequest::kUnregisterBuffer:
      RETURN_IF_ERROR(handlers_->Unregister(session_, request.unregister_buffer()));
      response->mutable_unregister_buffer();
      return absl::OkStatus();
    case v1::StreamRequest::REQUEST_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "request: set one of op, execute, register_buffer, unregister_buffer");
}

void StreamReactor::Write(v1::StreamResponse response) {
  const v1::StreamResponse* start = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    writes_.push_back(std::move(response));
    if (writing_) return;
    writing_ = true;
    start = &writes_.front();  // deque: stays valid while later entries are appended
  }
  StartWrite(start);
}

void StreamReactor::OnWriteDone(bool ok) {
  const v1::StreamResponse* next = nullptr;
  std::optional<absl::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    writes_.pop_front();
    if (!ok) {
      cancelled_ = true;
      writes_.clear();
    }
    if (writes_.empty()) {
      writing_ = false;
      finish = ShouldFinishLocked();
    } else {
      next = &writes_.front();
    }
  }
  if (next != nullptr) StartWrite(next);
  if (finish.has_value()) FinishNow(*finish);
}

void StreamReactor::OnCancel() {
  std::optional<absl::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    finish = ShouldFinishLocked();
  }
  if (finish.has_value()) FinishNow(*finish);
}

std::optional<absl::Status> StreamReactor::ShouldFinishLocked() {
  if (finished_ || reading_ || processing_ || writing_) return std::nullopt;
  finished_ = true;
  if (cancelled_) return absl::CancelledError("stream cancelled");
  return absl::OkStatus();
}

void StreamReactor::FinishNow(const absl::Status& status) {
  timer_.Record(status.code());
  Finish(ToGrpcStatus(status));
}

void StreamReactor::OnDone() {
  if (owns_session_) {
    absl::Status closed = handlers_->deps().sessions->Close(session_);
    if (!closed.ok()) {
      TS_LOG(DEBUG) << "stream session already ended: " << closed;
    }
  }
  delete this;
}

}  // namespace tokensel::server
