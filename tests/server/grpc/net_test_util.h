// Helpers for the tests of the server's own listeners: a fake FdReceiver,
// fd-channel packets with any number of descriptors, and open-descriptor
// counting (to prove that every received descriptor is closed).
#ifndef TOKENSEL_TESTS_SERVER_GRPC_NET_TEST_UTIL_H_
#define TOKENSEL_TESTS_SERVER_GRPC_NET_TEST_UTIL_H_

#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "server/core/fd_channel.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::server::testing {

// Records every call; the ticket says who called with what:
// "<principal> pid=<pid> session=<id> kind=<k> ino=<inode> size=<bytes>".
// Session "missing" -> NOT_FOUND, "other" -> PERMISSION_DENIED.
class FakeFdReceiver : public core::FdReceiver {
 public:
  absl::StatusOr<core::FdReceipt> Receive(const core::Peer& peer, const std::string& session_id,
                                          core::FdKind kind, UniqueFd fd) override {
    MutexLock lock(&mu_);
    ++calls_;
    if (session_id == "missing") return absl::NotFoundError("session missing: not found");
    if (session_id == "other") return absl::PermissionDeniedError("belongs to another uid");
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return absl::InvalidArgumentError("fstat failed");
    core::FdReceipt receipt;
    receipt.ticket =
        absl::StrCat(peer.Principal(), " pid=", peer.pid, " session=", session_id,
                     " kind=", static_cast<int>(kind), " ino=", st.st_ino, " size=", st.st_size);
    receipt.object_size = static_cast<uint64_t>(st.st_size);
    return receipt;
  }
  int calls() const {
    MutexLock lock(&mu_);
    return calls_;
  }

 private:
  mutable Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// A memfd of `size` bytes.
inline int MakeMemfd(size_t size = 4096) {
  const int fd = ::memfd_create("tokensel-net-test", MFD_CLOEXEC);
  if (fd >= 0) (void)!::ftruncate(fd, static_cast<off_t>(size));
  return fd;
}

inline ino_t Inode(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// Sends `bytes` with `fds` in one SCM_RIGHTS message; the sendmsg result.
inline ssize_t SendPacket(int sock, const std::string& bytes, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL);
}

inline std::string Request(const std::string& session, v1::FdKind kind = v1::FD_KIND_HOST_MEMORY) {
  v1::FdChannelRequest request;
  request.set_session_id(session);
  request.set_kind(kind);
  return request.SerializeAsString();
}

// Reads one reply packet (blocking, with a 5 s timeout).
inline absl::StatusOr<v1::FdChannelReply> ReadReply(int sock) {
  timeval tv{5, 0};
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[8192];
  const ssize_t n = ::recv(sock, buf, sizeof(buf), 0);
  if (n <= 0) return absl::UnavailableError(absl::StrCat("recv: ", n, " ", std::strerror(errno)));
  v1::FdChannelReply reply;
  if (!reply.ParseFromArray(buf, static_cast<int>(n))) {
    return absl::InternalError("not an FdChannelReply");
  }
  return reply;
}

// How many descriptors this process has open.
inline int OpenFdCount() {
  int n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (::readdir(dir) != nullptr) ++n;
  ::closedir(dir);
  return n - 3;  // ".", "..", the directory itself
}

}  // namespace tokensel::server::testing

#endif  // TOKENSEL_TESTS_SERVER_GRPC_NET_TEST_UTIL_H_
