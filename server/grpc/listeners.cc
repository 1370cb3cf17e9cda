#include "server/grpc/listeners.h"

#include <errno.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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
    if (path.size() >= sizeof(sockaddr_un::sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("listen ", address, ": socket path longer than ",
                                                     sizeof(sockaddr_un::sun_path) - 1,
                                                     " bytes"));
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
  return out;
}

absl::Status RemoveStaleSocket(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("listen: cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: ", path, " exists and is not a socket; refusing to replace it"));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: socket(): ", std::strerror(errno)));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());  // length checked by ParseListenAddress
  const bool live = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  if (live) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: another server is accepting on ", path));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: cannot remove stale socket ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
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
        absl::StrCat("unix_socket_group: looking up group '", name, "': ", std::strerror(rc)));
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix_socket_group: no group named '", name, "'"));
  }
  return found->gr_gid;
}

std::string WithPort(absl::string_view address, int port) {
  const size_t colon = address.rfind(':');
  return absl::StrCat(address.substr(0, colon), ":", port);
}

}  // namespace tokensel::server
