// One message with one descriptor over a unix socket (SCM_RIGHTS), for test
// processes that hand each other descriptors (the CUDA VMM exporter and its
// test). Header-only, no dependencies, so a plain helper program can use it.
#ifndef TOKENSEL_TESTS_TESTING_SCM_RIGHTS_H_
#define TOKENSEL_TESTS_TESTING_SCM_RIGHTS_H_

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstring>
#include <string>

namespace tokensel::testing {

// Sends `bytes` with `fd` attached; true when all of `bytes` went out.
inline bool SendWithFd(int sock, const std::string& bytes, int fd) {
  std::string copy = bytes;
  iovec iov{copy.data(), copy.size()};
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
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(copy.size());
}

// Receives one message of at most `max` bytes and the descriptor attached to
// it (O_CLOEXEC); false without a descriptor.
inline bool RecvWithFd(int sock, std::string* bytes, int* fd, size_t max = 4096) {
  bytes->assign(max, '\0');
  iovec iov{bytes->data(), bytes->size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return false;
  bytes->resize(static_cast<size_t>(n));
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (cmsg == nullptr || cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) {
    return false;
  }
  std::memcpy(fd, CMSG_DATA(cmsg), sizeof(int));
  return true;
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_SCM_RIGHTS_H_
