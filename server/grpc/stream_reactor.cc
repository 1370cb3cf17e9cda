#include "server/grpc/stream_reactor.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "common/status_macros.h"
#include "server/grpc/status_util.h"

namespace tokensel::server {

StreamReactor* StreamReactor::Start(const Handlers* handlers, grpc::CallbackServerContext* ctx) {
  auto* reactor = new StreamReactor(handlers, ctx);
  reactor->Begin();
  return reactor;
}

StreamReactor::StreamReactor(const Handlers* handlers, grpc::CallbackServerContext* ctx)
    : handlers_(handlers),
      ctx_(ctx),
      timer_(handlers->deps().metrics, "Stream"),
      stop_(ctx),
      max_queued_bytes_(static_cast<size_t>(
          std::max<uint64_t>(handlers->deps().description.max_message_bytes, 1 << 20))) {}

void StreamReactor::Begin() {
  core::SessionManager& sessions = *handlers_->deps().sessions;
  peer_ = handlers_->PeerOf(*ctx_);
  absl::Status status;
  if (std::optional<std::string> id = Handlers::SessionMetadata(*ctx_); id.has_value()) {
    status = sessions.Touch(*id, peer_).status();
    session_ = std::move(*id);
  } else {
    absl::StatusOr<core::SessionInfo> opened = sessions.Open("stream", absl::ZeroDuration(), peer_);
    status = opened.status();
    if (opened.ok()) {
      session_ = std::move(opened->id);
      owns_session_ = true;
    }
  }
  // The stream keeps its session alive, however quiet it is.
  if (status.ok()) status = sessions.Pin(session_);
  pinned_ = status.ok();
  if (!status.ok()) {
    {
      tokensel::MutexLock lock(&mu_);
      finished_ = true;
    }
    FinishNow(status);
    return;
  }
  if (owns_session_) {
    // The client learns its stream's session, so that it can hand the
    // server descriptors for it (the fd channel names sessions).
    ctx_->AddInitialMetadata(std::string(kSessionMetadataKey), session_);
    StartSendInitialMetadata();
  }
  bool read = false;
  {
    tokensel::MutexLock lock(&mu_);
    read = ClaimReadLocked();
  }
  if (read) StartRead(&read_);
}

bool StreamReactor::ClaimReadLocked() {
  if (reading_ || half_closed_ || cancelled_ || finished_) return false;
  if (pending_.size() + writes_.size() >= kMaxQueued || queued_bytes_ >= max_queued_bytes_) {
    return false;  // back-pressure: reading resumes as the queues drain
  }
  reading_ = true;
  return true;
}

void StreamReactor::OnReadDone(bool ok) {
  std::optional<absl::Status> finish;
  bool read_again = false;
  bool post = false;
  std::optional<Pending> pending;
  if (ok) {
    const size_t bytes = read_.ByteSizeLong();
    pending.emplace(Pending{std::move(read_), handlers_->deps().admission->Admit(), bytes});
    read_.Clear();
  }
  {
    tokensel::MutexLock lock(&mu_);
    reading_ = false;
    if (!ok) half_closed_ = true;
    if (pending.has_value() && !cancelled_) {
      queued_bytes_ += pending->bytes;
      pending_.push_back(*std::move(pending));
      if (!processing_) post = processing_ = true;
    }
    read_again = ClaimReadLocked();
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
    tokensel::MutexLock lock(&mu_);
    if (cancelled_ || pending_.empty()) {
      pending_.clear();
      processing_ = false;
      finish = ShouldFinishLocked();
    } else {
      next.emplace(std::move(pending_.front()));
      pending_.pop_front();
      queued_bytes_ -= std::min(queued_bytes_, next->bytes);
    }
  }
  if (!next.has_value()) {
    if (finish.has_value()) FinishNow(*finish);
    return;
  }
  Write(Answer(*std::move(next)));
  // One request per task, so that busy streams take turns on the workers.
  handlers_->deps().workers->Post([this] { ProcessNext(); });
}

StreamReactor::Outgoing StreamReactor::Answer(Pending pending) const {
  Outgoing out;
  out.response.set_request_id(pending.request.request_id());
  core::MemoryBudget* budget = handlers_->deps().executor->budget();
  if (budget != nullptr) out.memory = budget->Open();
  absl::Status status = pending.ticket.status();
  if (status.ok()) {
    core::RunOptions options{&stop_, &out.memory};
    options.peer = peer_.Principal();  // the evented Executes' per-peer caps
    status = NoThrow([&] { return Dispatch(pending.request, &out.response, options); });
  }
  if (!status.ok()) {
    out.response.clear_response();
    out.response.set_code(static_cast<int>(status.code()));
    out.response.set_message(std::string(status.message()));
    out.memory = core::MemoryBudget::Reservation();
  }
  out.bytes = out.response.ByteSizeLong();
  return out;  // `pending` (and its admission ticket) ends here
}

absl::Status StreamReactor::Dispatch(const v1::StreamRequest& request, v1::StreamResponse* response,
                                     const core::RunOptions& options) const {
  RETURN_IF_ERROR(handlers_->deps().sessions->Touch(session_, peer_).status());
  switch (request.request_case()) {
    case v1::StreamRequest::kOp:
      return handlers_->RunOp(session_, request.op(), response->mutable_op(), options, "op.");
    case v1::StreamRequest::kExecute:
      return handlers_->Execute(session_, request.execute(), response->mutable_execute(), options);
    case v1::StreamRequest::kRegisterBuffer:
      return handlers_->Register(session_, request.register_buffer(),
                                 response->mutable_register_buffer(), options.peer);
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

void StreamReactor::Write(Outgoing out) {
  const v1::StreamResponse* start = nullptr;
  bool read = false;
  {
    tokensel::MutexLock lock(&mu_);
    if (cancelled_) return;  // `out` and its reservation are dropped
    queued_bytes_ += out.bytes;
    writes_.push_back(std::move(out));
    if (!writing_) {
      writing_ = true;
      start = &writes_.front().response;  // deque: stays valid while entries are appended
    }
    read = ClaimReadLocked();
  }
  if (start != nullptr) StartWrite(start);
  if (read) StartRead(&read_);
}

void StreamReactor::OnWriteDone(bool ok) {
  const v1::StreamResponse* next = nullptr;
  std::optional<absl::Status> finish;
  bool read = false;
  {
    tokensel::MutexLock lock(&mu_);
    queued_bytes_ -= std::min(queued_bytes_, writes_.front().bytes);
    writes_.pop_front();  // its reservation is released: the bytes are gRPC's now
    if (!ok) {
      cancelled_ = true;
      for (const Outgoing& w : writes_) queued_bytes_ -= std::min(queued_bytes_, w.bytes);
      writes_.clear();
    }
    if (writes_.empty()) {
      writing_ = false;
    } else {
      next = &writes_.front().response;
    }
    read = ClaimReadLocked();
    if (next == nullptr && !read) finish = ShouldFinishLocked();
  }
  if (next != nullptr) StartWrite(next);
  if (read) StartRead(&read_);
  if (finish.has_value()) FinishNow(*finish);
}

void StreamReactor::OnSendInitialMetadataDone(bool) {}

void StreamReactor::OnCancel() {
  std::optional<absl::Status> finish;
  {
    tokensel::MutexLock lock(&mu_);
    cancelled_ = true;
    finish = ShouldFinishLocked();
  }
  if (finish.has_value()) FinishNow(*finish);
}

std::optional<absl::Status> StreamReactor::ShouldFinishLocked() {
  if (finished_ || reading_ || processing_ || writing_) return std::nullopt;
  // A stream that stopped reading for back-pressure is not over: its queues
  // are empty now, and the caller starts the next read.
  if (!half_closed_ && !cancelled_) return std::nullopt;
  finished_ = true;
  if (cancelled_) return absl::CancelledError("stream cancelled");
  return absl::OkStatus();
}

void StreamReactor::FinishNow(const absl::Status& status) {
  timer_.Record(status.code());
  Finish(ToGrpcStatus(status));
}

void StreamReactor::OnDone() {
  core::SessionManager& sessions = *handlers_->deps().sessions;
  if (owns_session_) {
    absl::Status closed = sessions.Close(session_);
    if (!closed.ok()) {
      TS_LOG(DEBUG) << "stream session already ended: " << closed;
    }
  } else if (pinned_) {
    sessions.Unpin(session_);
  }
  delete this;
}

}  // namespace tokensel::server
