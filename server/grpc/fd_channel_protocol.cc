#include "server/grpc/fd_channel_protocol.h"

#include <errno.h>
#include <sys/socket.h>

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tokensel::server {
namespace {

constexpr size_t kMaxReplyMessage = 1024;

v1::FdChannelReply Error(absl::StatusCode code, absl::string_view message) {
  v1::FdChannelReply reply;
  reply.set_code(static_cast<int32_t>(code));
  reply.set_message(std::string(message.substr(0, kMaxReplyMessage)));
  return reply;
}

}  // namespace

FdChannelRead ReadFdChannelPacket(int fd, FdChannelPacket* packet) {
  *packet = FdChannelPacket();
  packet->bytes.resize(kFdChannelMaxPacket);
  iovec iov{packet->bytes.data(), packet->bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdChannelMaxFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return errno == EAGAIN || errno == EWOULDBLOCK ? FdChannelRead::kWouldBlock
                                                   : FdChannelRead::kClosed;
  }
  // Take every descriptor first, so that each one is closed whatever happens.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      packet->fds.emplace_back(received);
    }
  }
  packet->truncated = (msg.msg_flags & MSG_TRUNC) != 0;
  packet->control_truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  if (n == 0 && packet->fds.empty() && !packet->control_truncated) return FdChannelRead::kClosed;
  packet->bytes.resize(static_cast<size_t>(n));
  return FdChannelRead::kPacket;
}

v1::FdChannelReply HandleFdChannelPacket(FdChannelPacket packet, const core::Peer& peer,
                                         core::FdReceiver& receiver) {
  using Code = absl::StatusCode;
  if (packet.truncated) {
    return Error(Code::kInvalidArgument,
                 absl::StrCat("fd channel: request larger than ", kFdChannelMaxPacket, " bytes"));
  }
  if (packet.control_truncated) {
    return Error(Code::kInvalidArgument,
                 absl::StrCat("fd channel: control message truncated (more than ", kFdChannelMaxFds,
                              " descriptors, or the server is at its descriptor limit); send "
                              "exactly one descriptor"));
  }
  if (packet.fds.empty()) {
    return Error(Code::kInvalidArgument,
                 "fd channel: no file descriptor attached; send exactly one in an SCM_RIGHTS "
                 "control message");
  }
  if (packet.fds.size() > 1) {
    return Error(Code::kInvalidArgument,
                 absl::StrCat("fd channel: ", packet.fds.size(),
                              " file descriptors attached; send exactly one"));
  }
  v1::FdChannelRequest request;
  if (!request.ParseFromString(packet.bytes)) {
    return Error(Code::kInvalidArgument,
                 "fd channel: the packet is not a serialized tokensel.v1.FdChannelRequest");
  }
  if (request.session_id().empty()) {
    return Error(Code::kInvalidArgument, "fd channel: session_id is empty");
  }
  core::FdKind kind;
  switch (request.kind()) {
    case v1::FD_KIND_HOST_MEMORY:
      kind = core::FdKind::kHostMemory;
      break;
    case v1::FD_KIND_CUDA_VMM:
      kind = core::FdKind::kCudaVmm;
      break;
    default:
      return Error(Code::kInvalidArgument,
                   absl::StrCat("fd channel: kind ", static_cast<int>(request.kind()),
                                " is not FD_KIND_HOST_MEMORY or FD_KIND_CUDA_VMM"));
  }
  absl::StatusOr<core::FdReceipt> receipt =
      receiver.Receive(peer, request.session_id(), kind, std::move(packet.fds[0]));
  if (!receipt.ok()) return Error(receipt.status().code(), receipt.status().message());
  v1::FdChannelReply reply;
  reply.set_ticket(receipt->ticket);
  reply.set_object_size(receipt->object_size);
  reply.set_sealed(receipt->sealed);
  return reply;
}

bool SendFdChannelReply(int fd, const v1::FdChannelReply& reply) {
  const std::string bytes = reply.SerializeAsString();
  ssize_t n;
  do {
    n = ::send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(bytes.size());
}

}  // namespace tokensel::server
