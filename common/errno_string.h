// ErrnoString: the text of an errno value, thread-safe.
//
// std::strerror may return a buffer shared by every thread (and clang-tidy's
// concurrency-mt-unsafe says so); the server formats errors on many threads
// at once. Use this instead:
//
//   return absl::InternalError(absl::StrCat("epoll_ctl: ", ErrnoString(errno)));
#ifndef TOKENSEL_COMMON_ERRNO_STRING_H_
#define TOKENSEL_COMMON_ERRNO_STRING_H_

#include <string.h>

#include <string>

namespace tokensel {

inline std::string ErrnoString(int err) {
  char buf[128];
  // glibc's GNU strerror_r (C++ compiles with _GNU_SOURCE): returns either a
  // static string or `buf`, never fails.
  return std::string(strerror_r(err, buf, sizeof(buf)));
}

}  // namespace tokensel

#endif  // TOKENSEL_COMMON_ERRNO_STRING_H_
