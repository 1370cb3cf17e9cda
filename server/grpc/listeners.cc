#include "server/grpc/listeners.h"

#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/errno_string.h"
#include "common/log.h"

namespace tokensel::server {

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view address) {
  if (address.empty()) return absl::InvalidArgumentError("listen: empty address");
  ListenAddress out;
  out.address = std::string(address);
  if (absl::StartsWith(address, "unix:")) {
    absl::string_view path = address.substr(5);
    if (absl::StartsWith(path, "//")) path.remove_prefix(2);  // unix:///abs -> /abs
    if (path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("listen ", address, ": empty socket path"));
    }
    // The fd channel's socket is path + ".fd"; both must fit.
    constexpr size_t kMax = sizeof(sockaddr_un::sun_path) - 1 - 3;
    if (path.size() > kMax) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen ", address, ": socket path longer than ", kMax,
                       " bytes (its fd channel, the path + \".fd\", must fit in ",
                       sizeof(sockaddr_un::sun_path) - 1, ")"));
    }
    out.unix_path = std::string(path);
    return out;
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen ", address, ": expected unix:///path or host:port"));
  }
  absl::string_view host = address.substr(0, colon);
  if (absl::StartsWith(host, "[")) {
    if (!absl::EndsWith(host, "]")) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen ", address, ": unbalanced [ in the IPv6 host"));
    }
    host = host.substr(1, host.size() - 2);
  }
  out.host = std::string(host);
  out.port = port;
  return out;
}

absl::StatusOr<gid_t> ResolveGroup(absl::string_view group) {
  if (group.empty()) return absl::InvalidArgumentError("unix_socket_group: empty group");
  uint32_t gid = 0;
  if (absl::SimpleAtoi(group, &gid)) return static_cast<gid_t>(gid);
  const std::string name(group);
  std::vector<char> buf(16384);
  struct group entry;
  struct group* found = nullptr;
  int rc;
  while ((rc = ::getgrnam_r(name.c_str(), &entry, buf.data(), buf.size(), &found)) == ERANGE &&
         buf.size() < (size_t{1} << 20)) {
    buf.resize(buf.size() * 2);
  }
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix_socket_group: looking up group '", name, "': ", ErrnoString(rc)));
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix_socket_group: no group named '", name, "'"));
  }
  return found->gr_gid;
}

absl::StatusOr<TcpListener> ListenTcp(const ListenAddress& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  const int rc = ::getaddrinfo(address.host.empty() ? nullptr : address.host.c_str(), port.c_str(),
                               &hints, &found);
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listen ", address.address, ": cannot resolve '", address.host, "': ", ::gai_strerror(rc)));
  }
  std::vector<sockaddr_storage> addrs;
  std::vector<socklen_t> lens;
  bool has_v4 = false;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    sockaddr_storage ss{};
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    bool duplicate = false;
    for (size_t i = 0; i < addrs.size(); ++i) {
      duplicate |= lens[i] == ai->ai_addrlen && std::memcmp(&addrs[i], &ss, lens[i]) == 0;
    }
    if (duplicate) continue;
    has_v4 |= ai->ai_family == AF_INET;
    addrs.push_back(ss);
    lens.push_back(static_cast<socklen_t>(ai->ai_addrlen));
  }
  ::freeaddrinfo(found);

  TcpListener out;
  out.port = address.port;
  std::string skipped;
  for (size_t i = 0; i < addrs.size(); ++i) {
    sockaddr_storage& ss = addrs[i];
    const int family = ss.ss_family;
    if (out.port != 0) {  // the port the first socket got
      if (family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(static_cast<uint16_t>(out.port));
      } else {
        reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(static_cast<uint16_t>(out.port));
      }
    }
    UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      absl::StrAppend(&skipped, " socket(): ", ErrnoString(errno), ";");
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (family == AF_INET6) {
      const int v6only = has_v4 ? 1 : 0;
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    }
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ss), lens[i]) != 0) {
      const int err = errno;
      if (err == EADDRNOTAVAIL || err == EAFNOSUPPORT) {
        absl::StrAppend(&skipped, " bind: ", ErrnoString(err), ";");
        continue;
      }
      return absl::FailedPreconditionError(
          absl::StrCat("listen ", address.address, ": bind: ", ErrnoString(err)));
    }
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("listen ", address.address, ": listen(): ", ErrnoString(errno)));
    }
    if (out.port == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("listen ", address.address, ": getsockname: ", ErrnoString(errno)));
      }
      out.port = ntohs(bound.ss_family == AF_INET
                           ? reinterpret_cast<const sockaddr_in*>(&bound)->sin_port
                           : reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
    }
    out.fds.push_back(std::move(fd));
  }
  if (out.fds.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen ", address.address, ": could not bind any address of '", address.host,
                     "'", skipped.empty() ? "" : ":", skipped));
  }
  return out;
}

FdLimit RaiseFdLimit() {
  FdLimit out;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    TS_LOG(WARNING) << "getrlimit(RLIMIT_NOFILE): " << ErrnoString(errno);
    return out;
  }
  out.soft_before = out.soft = limit.rlim_cur;
  out.hard = limit.rlim_max;
  rlim_t target = limit.rlim_max;
  if (target == RLIM_INFINITY) {
    std::ifstream nr_open("/proc/sys/fs/nr_open");
    uint64_t n = 0;
    target = (nr_open >> n) ? static_cast<rlim_t>(n) : limit.rlim_cur;
  }
  if (target > limit.rlim_cur) {
    rlimit raised = limit;
    raised.rlim_cur = target;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      out.soft = target;
    } else {
      TS_LOG(WARNING) << "setrlimit(RLIMIT_NOFILE, " << target << "): " << ErrnoString(errno);
    }
  }
  TS_LOG(INFO) << "RLIMIT_NOFILE: soft " << out.soft_before << " -> " << out.soft << ", hard "
               << (out.hard == RLIM_INFINITY ? std::string("unlimited") : std::to_string(out.hard));
  return out;
}

uint32_t ConnectionCapForFdLimit(uint32_t requested, uint64_t soft) {
  const uint64_t reserve = std::max<uint64_t>(64, soft / 8);
  const uint64_t room = soft > reserve ? soft - reserve : 1;
  return static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(requested, room)));
}

std::string WithPort(absl::string_view address, int port) {
  const size_t colon = address.rfind(':');
  return absl::StrCat(address.substr(0, colon), ":", port);
}

}  // namespace tokensel::server
