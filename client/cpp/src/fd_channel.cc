#include "tokensel/client/fd_channel.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tokensel::client {
namespace {

// Replies are small; anything longer is not from a tokensel server.
constexpr size_t kMaxReplyBytes = 64 * 1024;

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int get() const { return fd_; }

 private:
  const int fd_;
};

absl::Status SocketError(int err, absl::string_view what, const std::string& path) {
  const std::string message =
      absl::StrCat("fd channel ", path, ": ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ECONNREFUSED:
      return absl::UnavailableError(
          absl::StrCat(message, " (is a tokensel server with an fd channel listening there?)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EAGAIN:
    case ETIMEDOUT:
      return absl::DeadlineExceededError(message);
    default:
      return absl::UnavailableError(message);
  }
}

}  // namespace

std::string FdChannelPath(absl::string_view target) {
  if (!absl::ConsumePrefix(&target, "unix:")) return "";
  if (absl::StartsWith(target, "//")) target.remove_prefix(2);  // unix:///abs -> /abs
  if (target.empty()) return "";
  return absl::StrCat(target, ".fd");
}

std::string LocalFdTicket(int fd) { return absl::StrCat("fd:", fd); }

int ParseLocalFdTicket(absl::string_view ticket) {
  int fd = -1;
  if (!absl::ConsumePrefix(&ticket, "fd:") || !absl::SimpleAtoi(ticket, &fd) || fd < 0) return -1;
  return fd;
}

absl::StatusOr<v1::FdChannelReply> SendFd(const std::string& path, absl::string_view session_id,
                                          v1::FdKind kind, int fd, absl::Duration timeout) {
  if (path.empty()) {
    return absl::FailedPreconditionError(
        "fd channel: this client's target is not a unix socket; memory can be registered by "
        "descriptor only on the server's host");
  }
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd channel path too long: ", path));
  }
  Socket sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) return SocketError(errno, "socket", path);
  timeval tv{};
  const int64_t us = absl::ToInt64Microseconds(timeout);
  tv.tv_sec = static_cast<time_t>(us / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
  ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return SocketError(errno, "connect", path);
  }

  v1::FdChannelRequest request;
  request.set_session_id(std::string(session_id));
  request.set_kind(kind);
  std::string payload = request.SerializeAsString();
  iovec iov{payload.data(), payload.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  ssize_t sent;
  do {
    sent = ::sendmsg(sock.get(), &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return SocketError(errno, "sendmsg", path);

  std::vector<char> buffer(kMaxReplyBytes);
  ssize_t got;
  do {
    got = ::recv(sock.get(), buffer.data(), buffer.size(), 0);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return SocketError(errno, "recv", path);
  if (got == 0) {
    return absl::UnavailableError(
        absl::StrCat("fd channel ", path, ": the server closed the connection without a reply"));
  }
  v1::FdChannelReply reply;
  if (!reply.ParseFromArray(buffer.data(), static_cast<int>(got))) {
    return absl::InternalError(absl::StrCat("fd channel ", path, ": malformed reply"));
  }
  if (reply.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply.code()),
                        absl::StrCat("fd channel: ", reply.message()));
  }
  return reply;
}

}  // namespace tokensel::client
