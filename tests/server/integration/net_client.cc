// tokensel_net_client: a client process for the connection tests, so that a
// test can connect as another uid (the CI runs as root) without forking a
// process that already runs gRPC threads.
//
//   tokensel_net_client [--as=UID:GID] <command> ...
//     ping <target>                gRPC Ping          -> "PING OK" | "PING <code> <message>"
//     info <target>                GetServerInfo      -> "INFO <version>"
//     hold <unix path|host:port> <n>
//                                  opens n raw connections (no HTTP/2), prints
//                                  "HOLD open=<connected>", waits for EOF on
//                                  stdin, prints "HOLD alive=<not closed by
//                                  the server>" and exits
//     fd <fd channel path> <session> <kind>
//                                  sends one FdChannelRequest with a 4096-byte
//                                  memfd -> "FD code=<c> ino=<inode of the memfd>
//                                  ticket=<t> message=<m>"
//
// --as drops to that uid and gid (setgroups({}), setresgid, setresuid)
// before anything else; it needs root. Exit 0 after printing; 2 for bad usage,
// 3 when --as fails. Dies with its parent (PR_SET_PDEATHSIG).
#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "tokensel/v1/tokensel.grpc.pb.h"

namespace {

namespace v1 = ::tokensel::v1;

int Usage() {
  std::fprintf(stderr, "usage: tokensel_net_client [--as=UID:GID] ping|info|hold|fd ...\n");
  return 2;
}

std::unique_ptr<v1::TokenSelect::Stub> Stub(const std::string& target) {
  return v1::TokenSelect::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

int Ping(const std::string& target) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::PingRequest request;
  v1::PingResponse response;
  const grpc::Status s = Stub(target)->Ping(&ctx, request, &response);
  if (s.ok()) {
    std::printf("PING OK\n");
  } else {
    std::printf("PING %d %s\n", s.error_code(), s.error_message().c_str());
  }
  return 0;
}

int Info(const std::string& target) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetServerInfoRequest request;
  v1::ServerInfo info;
  const grpc::Status s = Stub(target)->GetServerInfo(&ctx, request, &info);
  if (s.ok()) {
    std::printf("INFO %s\n", info.version().c_str());
  } else {
    std::printf("INFO error %d %s\n", s.error_code(), s.error_message().c_str());
  }
  return 0;
}

int Connect(const std::string& where) {
  if (absl::StartsWith(where, "/")) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, where.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  const size_t colon = where.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(where.substr(colon + 1), &port)) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, where.substr(0, colon).c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server has closed `fd` (EOF or an error is pending).
bool ClosedByServer(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  // Readable: data (gRPC's SETTINGS on a unix connection) or EOF.
  for (;;) {
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

int Hold(const std::string& where, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = Connect(where);
    if (fd >= 0) fds.push_back(fd);
  }
  std::printf("HOLD open=%zu\n", fds.size());
  std::fflush(stdout);
  char c;
  while (::read(STDIN_FILENO, &c, 1) > 0) {
  }
  int alive = 0;
  for (int fd : fds) alive += ClosedByServer(fd) ? 0 : 1;
  std::printf("HOLD alive=%d\n", alive);
  for (int fd : fds) ::close(fd);
  return 0;
}

int SendFd(const std::string& path, const std::string& session, int kind) {
  const int sock = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::printf("FD connect-error %s\n", std::strerror(errno));
    return 0;
  }
  const int memfd = ::memfd_create("tokensel-net-client", MFD_CLOEXEC);
  if (memfd < 0 || ::ftruncate(memfd, 4096) != 0) {
    std::printf("FD memfd-error %s\n", std::strerror(errno));
    return 0;
  }
  struct stat st;
  ::fstat(memfd, &st);
  v1::FdChannelRequest request;
  request.set_session_id(session);
  request.set_kind(static_cast<v1::FdKind>(kind));
  std::string bytes = request.SerializeAsString();
  iovec iov{bytes.data(), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &memfd, sizeof(int));
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) {
    std::printf("FD send-error %s\n", std::strerror(errno));
    return 0;
  }
  char buf[8192];
  const ssize_t n = ::recv(sock, buf, sizeof(buf), 0);
  v1::FdChannelReply reply;
  if (n <= 0 || !reply.ParseFromArray(buf, static_cast<int>(n))) {
    std::printf("FD recv-error %zd\n", n);
    return 0;
  }
  std::printf("FD code=%d ino=%llu ticket=%s message=%s\n", reply.code(),
              static_cast<unsigned long long>(st.st_ino), reply.ticket().c_str(),
              reply.message().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && absl::StartsWith(args[0], "--as=")) {
    std::vector<std::string> ids = absl::StrSplit(args[0].substr(5), ':');
    uint32_t uid = 0, gid = 0;
    if (ids.size() != 2 || !absl::SimpleAtoi(ids[0], &uid) || !absl::SimpleAtoi(ids[1], &gid)) {
      return Usage();
    }
    if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      std::perror("tokensel_net_client: --as");
      return 3;
    }
    args.erase(args.begin());
  }
  if (args.empty()) return Usage();
  int n = 0;
  if (args[0] == "ping" && args.size() == 2) return Ping(args[1]);
  if (args[0] == "info" && args.size() == 2) return Info(args[1]);
  if (args[0] == "hold" && args.size() == 3 && absl::SimpleAtoi(args[2], &n)) {
    return Hold(args[1], n);
  }
  if (args[0] == "fd" && args.size() == 4 && absl::SimpleAtoi(args[3], &n)) {
    return SendFd(args[1], args[2], n);
  }
  return Usage();
}
