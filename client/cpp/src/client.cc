#include "tokensel/client/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "tokensel/client/fd_channel.h"
#include "tokensel/client/status.h"

namespace tokensel::client {
namespace {

absl::Status CheckOptions(const ClientOptions& options) {
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline must be > 0, got ", absl::FormatDuration(options.deadline)));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must be > 0, got ", options.max_message_bytes));
  }
  if (options.initial_reconnect_backoff <= absl::ZeroDuration() ||
      options.max_reconnect_backoff < options.initial_reconnect_backoff) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconnect backoff must satisfy 0 < initial <= max, got initial ",
                     absl::FormatDuration(options.initial_reconnect_backoff), " max ",
                     absl::FormatDuration(options.max_reconnect_backoff)));
  }
  return absl::OkStatus();
}

int ClampMs(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return ms > (1 << 30) ? (1 << 30) : static_cast<int>(ms);
}

// A CUDA VMM buffer of several allocations (fd.segments): every "fd:<n>"
// ticket becomes a server ticket for descriptor n (FD_KIND_CUDA_VMM), in
// order; other tickets are sent as they are.
absl::StatusOr<v1::RegisterBufferRequest> ResolveSegments(const v1::RegisterBufferRequest& request,
                                                          const std::string& fd_channel_path,
                                                          const std::string& session,
                                                          absl::Duration timeout) {
  v1::RegisterBufferRequest resolved = request;
  for (v1::VmmSegment& segment : *resolved.mutable_fd()->mutable_segments()) {
    const int fd = ParseLocalFdTicket(segment.ticket());
    if (fd < 0) continue;
    absl::StatusOr<v1::FdChannelReply> reply =
        SendFd(fd_channel_path, session, v1::FD_KIND_CUDA_VMM, fd, timeout);
    if (!reply.ok()) return reply.status();
    segment.set_ticket(reply->ticket());
  }
  return resolved;
}

// `request` with its host memory turned into an fd channel ticket of
// `session`: a host_shm name is opened here (with this process's rights),
// an "fd:<n>" ticket names descriptor n; anything else is returned as is.
absl::StatusOr<v1::RegisterBufferRequest> ResolveRegistration(
    const v1::RegisterBufferRequest& request, const std::string& fd_channel_path,
    const std::string& session, absl::Duration timeout) {
  int fd = -1;
  int opened = -1;
  uint64_t offset = 0;
  uint64_t size = 0;
  // A device_uuid makes the descriptor a CUDA VMM one (it names the GPU of
  // the allocation; host memory has none).
  v1::FdKind kind = v1::FD_KIND_HOST_MEMORY;
  std::string device_uuid;
  if (request.has_host_shm()) {
    const v1::HostShm& shm = request.host_shm();
    opened = shm_open(shm.shm_name().c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (opened < 0) {
      const int err = errno;
      const std::string message =
          absl::StrCat("host_shm.shm_name \"", shm.shm_name(), "\": ", std::strerror(err));
      if (err == ENOENT) return absl::NotFoundError(message);
      if (err == EACCES || err == EPERM || err == ELOOP)
        return absl::PermissionDeniedError(message);
      return absl::InvalidArgumentError(message);
    }
    fd = opened;
    offset = shm.offset();
    size = shm.size();
  } else if (request.has_fd() && request.fd().segments_size() > 0) {
    return ResolveSegments(request, fd_channel_path, session, timeout);
  } else if (request.has_fd() && ParseLocalFdTicket(request.fd().ticket()) >= 0) {
    fd = ParseLocalFdTicket(request.fd().ticket());
    offset = request.fd().offset();
    size = request.fd().size();
    device_uuid = request.fd().device_uuid();
    if (!device_uuid.empty()) kind = v1::FD_KIND_CUDA_VMM;
  } else {
    return request;
  }
  absl::StatusOr<v1::FdChannelReply> reply = SendFd(fd_channel_path, session, kind, fd, timeout);
  if (opened >= 0) ::close(opened);
  if (!reply.ok()) return reply.status();
  v1::RegisterBufferRequest resolved;
  resolved.set_name(request.name());
  v1::PassedFd* passed = resolved.mutable_fd();
  passed->set_ticket(reply->ticket());
  passed->set_offset(offset);
  passed->set_size(size);
  passed->set_device_uuid(device_uuid);
  if (request.has_fd()) passed->set_allocation_size(request.fd().allocation_size());
  return resolved;
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

absl::StatusOr<Client> Client::Connect(absl::string_view target, ClientOptions options) {
  if (target.empty()) return absl::InvalidArgumentError("target is empty");
  absl::Status status = CheckOptions(options);
  if (!status.ok()) return status;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ClampMs(options.initial_reconnect_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ClampMs(options.max_reconnect_backoff));
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(std::string(target), credentials, args);
  return Client(std::move(channel), std::move(options), std::string(target));
}

Client Client::FromChannel(std::shared_ptr<grpc::Channel> channel, ClientOptions options) {
  return Client(std::move(channel), std::move(options), "");
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options, std::string target)
    : channel_(std::move(channel)),
      stub_(v1::TokenSelect::NewStub(channel_)),
      options_(std::move(options)),
      fd_channel_path_(!options_.fd_channel.empty() ? options_.fd_channel : FdChannelPath(target)) {
}

Client Client::WithSession(std::string session_id) const {
  Client copy = *this;
  copy.session_id_ = std::move(session_id);
  return copy;
}

Client Client::WithDeadline(absl::Duration deadline) const {
  Client copy = *this;
  copy.options_.deadline = deadline;
  return copy;
}

Client Client::WithWaitForReady(bool wait_for_ready) const {
  Client copy = *this;
  copy.options_.wait_for_ready = wait_for_ready;
  return copy;
}

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  SetDeadline(context.get(), options_.deadline);
  context->set_wait_for_ready(options_.wait_for_ready);
  if (!session_id_.empty()) context->AddMetadata(kSessionMetadataKey, session_id_);
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.auth_token));
  }
  return context;
}

template <typename Req, typename Resp>
absl::StatusOr<Resp> Client::Unary(
    grpc::Status (v1::TokenSelect::Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
    const Req& request) const {
  std::unique_ptr<grpc::ClientContext> context = NewContext();
  Resp response;
  absl::Status status = FromGrpcStatus((stub_.get()->*method)(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() const {
  return Unary(&v1::TokenSelect::Stub::GetServerInfo, v1::GetServerInfoRequest());
}

absl::Status Client::Ping() const {
  return Unary(&v1::TokenSelect::Stub::Ping, v1::PingRequest()).status();
}

absl::StatusOr<v1::OpenSessionResponse> Client::OpenSession(
    const v1::OpenSessionRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::OpenSession, request);
}

absl::StatusOr<v1::KeepAliveResponse> Client::KeepAlive() const {
  return Unary(&v1::TokenSelect::Stub::KeepAlive, v1::KeepAliveRequest());
}

absl::Status Client::CloseSession() const {
  return Unary(&v1::TokenSelect::Stub::CloseSession, v1::CloseSessionRequest()).status();
}

absl::StatusOr<v1::BufferInfo> Client::RegisterBuffer(
    const v1::RegisterBufferRequest& request) const {
  absl::StatusOr<v1::RegisterBufferRequest> resolved =
      ResolveRegistration(request, fd_channel_path_, session_id_, options_.deadline);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<v1::RegisterBufferResponse> response =
      Unary(&v1::TokenSelect::Stub::RegisterBuffer, *resolved);
  if (!response.ok()) return response.status();
  return response->buffer();
}

absl::StatusOr<v1::BufferInfo> Client::RegisterFd(std::string name, int fd, uint64_t offset,
                                                  uint64_t size) const {
  return RegisterLocalFd(std::move(name), fd, offset, size, std::string(), 0);
}

absl::StatusOr<v1::BufferInfo> Client::RegisterLocalFd(std::string name, int fd, uint64_t offset,
                                                       uint64_t size, std::string device_uuid,
                                                       uint64_t allocation_size) const {
  v1::RegisterBufferRequest request;
  request.set_name(std::move(name));
  v1::PassedFd* passed = request.mutable_fd();
  passed->set_ticket(LocalFdTicket(fd));
  passed->set_offset(offset);
  passed->set_size(size);
  passed->set_device_uuid(std::move(device_uuid));  // non-empty: FD_KIND_CUDA_VMM
  passed->set_allocation_size(allocation_size);
  return RegisterBuffer(request);
}

absl::StatusOr<v1::BufferInfo> Client::RegisterCudaVmmFd(std::string name, int fd, uint64_t offset,
                                                         uint64_t size, std::string device_uuid,
                                                         uint64_t allocation_size) const {
  if (device_uuid.empty()) {
    return absl::InvalidArgumentError("device_uuid: a CUDA VMM registration names its GPU");
  }
  return RegisterLocalFd(std::move(name), fd, offset, size, std::move(device_uuid),
                         allocation_size);
}

absl::StatusOr<v1::BufferInfo> Client::RegisterCudaVmmFds(
    std::string name, const std::vector<CudaVmmSegment>& segments, uint64_t offset, uint64_t size,
    std::string device_uuid) const {
  if (device_uuid.empty()) {
    return absl::InvalidArgumentError("device_uuid: a CUDA VMM registration names its GPU");
  }
  if (segments.empty()) {
    return absl::InvalidArgumentError("segments: a CUDA VMM buffer spans at least one allocation");
  }
  v1::RegisterBufferRequest request;
  request.set_name(std::move(name));
  v1::PassedFd* passed = request.mutable_fd();
  passed->set_offset(offset);
  passed->set_size(size);
  passed->set_device_uuid(std::move(device_uuid));
  for (const CudaVmmSegment& segment : segments) {
    v1::VmmSegment* added = passed->add_segments();
    added->set_ticket(LocalFdTicket(segment.fd));
    added->set_allocation_size(segment.allocation_size);
  }
  return RegisterBuffer(request);
}

absl::Status Client::UnregisterBuffer(absl::string_view name) const {
  v1::UnregisterBufferRequest request;
  request.set_name(std::string(name));
  return Unary(&v1::TokenSelect::Stub::UnregisterBuffer, request).status();
}

absl::StatusOr<v1::ListBuffersResponse> Client::ListBuffers() const {
  return Unary(&v1::TokenSelect::Stub::ListBuffers, v1::ListBuffersRequest());
}

absl::StatusOr<v1::OpResponse> Client::SortTokens(const v1::SortTokensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::SortTokens, request);
}
absl::StatusOr<v1::OpResponse> Client::GatherTokens(const v1::GatherTokensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::GatherTokens, request);
}
absl::StatusOr<v1::OpResponse> Client::ScatterTokens(
    const v1::ScatterTokensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::ScatterTokens, request);
}
absl::StatusOr<v1::OpResponse> Client::GatherBertMask(
    const v1::GatherBertMaskRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::GatherBertMask, request);
}
absl::StatusOr<v1::OpResponse> Client::SliceGptMask(const v1::SliceGptMaskRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::SliceGptMask, request);
}
absl::StatusOr<v1::OpResponse> Client::SegmentSeqlens(
    const v1::SegmentSeqlensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::SegmentSeqlens, request);
}
absl::StatusOr<v1::OpResponse> Client::SampleTokens(const v1::SampleTokensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::SampleTokens, request);
}
absl::StatusOr<v1::OpResponse> Client::TopKTokens(const v1::TopKTokensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::TopKTokens, request);
}

absl::StatusOr<v1::OpResponse> Client::MergeTokens(const v1::MergeTokensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::MergeTokens, request);
}

absl::StatusOr<v1::OpResponse> Client::SplitTokens(const v1::SplitTokensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::SplitTokens, request);
}

absl::StatusOr<v1::OpResponse> Client::SamplePackedTokens(
    const v1::SamplePackedTokensRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::SamplePackedTokens, request);
}

absl::StatusOr<v1::OpResponse> Client::RunOp(const v1::Op& op) const {
  switch (op.op_case()) {
    case v1::Op::kSortTokens:
      return SortTokens(op.sort_tokens());
    case v1::Op::kGatherTokens:
      return GatherTokens(op.gather_tokens());
    case v1::Op::kScatterTokens:
      return ScatterTokens(op.scatter_tokens());
    case v1::Op::kGatherBertMask:
      return GatherBertMask(op.gather_bert_mask());
    case v1::Op::kSliceGptMask:
      return SliceGptMask(op.slice_gpt_mask());
    case v1::Op::kSegmentSeqlens:
      return SegmentSeqlens(op.segment_seqlens());
    case v1::Op::kSampleTokens:
      return SampleTokens(op.sample_tokens());
    case v1::Op::kTopKTokens:
      return TopKTokens(op.top_k_tokens());
    case v1::Op::kMergeTokens:
      return MergeTokens(op.merge_tokens());
    case v1::Op::kSplitTokens:
      return SplitTokens(op.split_tokens());
    case v1::Op::kSamplePackedTokens:
      return SamplePackedTokens(op.sample_packed_tokens());
    case v1::Op::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("op: no operator set");
}

absl::StatusOr<v1::ExecuteResponse> Client::Execute(const v1::ExecuteRequest& request) const {
  return Unary(&v1::TokenSelect::Stub::Execute, request);
}

// ------------------------------------------------------------------ stream --

absl::StatusOr<std::unique_ptr<OpStream>> Client::OpenStream() const {
  std::unique_ptr<OpStream> stream(new OpStream());
  stream->context_ = std::make_unique<grpc::ClientContext>();
  SetDeadline(stream->context_.get(), options_.stream_deadline);
  stream->context_->set_wait_for_ready(options_.wait_for_ready);
  if (!session_id_.empty()) stream->context_->AddMetadata(kSessionMetadataKey, session_id_);
  if (!options_.auth_token.empty()) {
    stream->context_->AddMetadata("authorization", absl::StrCat("Bearer ", options_.auth_token));
  }
  stream->stream_ = stub_->Stream(stream->context_.get());
  if (stream->stream_ == nullptr) return absl::InternalError("Stream: the stub returned no stream");
  stream->fd_channel_path_ = fd_channel_path_;
  stream->deadline_ = options_.deadline;
  stream->session_id_ = session_id_;
  return stream;
}

OpStream::~OpStream() {
  if (!finished_ && context_ != nullptr) {
    context_->TryCancel();
    FinishInternal().IgnoreError();
  }
}

const std::string& OpStream::session_id() {
  if (session_id_.empty() && !finished_) {
    if (!read_any_) stream_->WaitForInitialMetadata();
    const auto& metadata = context_->GetServerInitialMetadata();
    auto it = metadata.find(kSessionMetadataKey);
    if (it != metadata.end()) session_id_.assign(it->second.data(), it->second.size());
  }
  return session_id_;
}

absl::StatusOr<v1::StreamResponse> OpStream::Call(const v1::StreamRequest& request) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("stream already finished: ", final_status_.ToString()));
  }
  const v1::StreamRequest* to_send = &request;
  v1::StreamRequest resolved;
  if (request.has_register_buffer()) {
    const std::string& session = session_id();
    absl::StatusOr<v1::RegisterBufferRequest> registration =
        ResolveRegistration(request.register_buffer(), fd_channel_path_, session, deadline_);
    if (!registration.ok()) return registration.status();
    resolved = request;
    *resolved.mutable_register_buffer() = *std::move(registration);
    to_send = &resolved;
  }
  v1::StreamResponse response;
  read_any_ = true;
  if (!stream_->Write(*to_send) || !stream_->Read(&response)) {
    absl::Status status = FinishInternal();
    return status.ok() ? absl::UnavailableError("stream closed by the server") : status;
  }
  return response;
}

absl::Status OpStream::Finish() {
  if (finished_) return final_status_;
  stream_->WritesDone();
  return FinishInternal();
}

absl::Status OpStream::FinishInternal() {
  finished_ = true;
  final_status_ = FromGrpcStatus(stream_->Finish());
  return final_status_;
}

}  // namespace tokensel::client
