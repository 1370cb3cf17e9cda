// Listen addresses: parsing, TCP listening sockets, resolved names, the
// descriptor limit. Helpers for Server; no gRPC types. Unix sockets:
// unix_socket.h.
#ifndef TOKENSEL_SERVER_GRPC_LISTENERS_H_
#define TOKENSEL_SERVER_GRPC_LISTENERS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"

namespace tokensel::server {

struct ListenAddress {
  std::string address;                   // as given
  std::optional<std::string> unix_path;  // the socket file, for unix listeners
  std::string host;                      // TCP: "0.0.0.0", "::1", "localhost", "" (any)
  int port = 0;                          // TCP
};

// "unix:///abs/path" and "unix:path" are unix sockets; "host:port" (with
// "[v6]:port") is TCP. INVALID_ARGUMENT for an empty address, an empty unix
// path, a path whose fd channel (path + ".fd") is longer than sockaddr_un
// allows, or a TCP address without a numeric port.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view address);

// The gid of `group`, a group name or a numeric gid (--unix_socket_group).
// INVALID_ARGUMENT for an empty value or a name the group database does not
// know; a numeric gid is taken as is.
absl::StatusOr<gid_t> ResolveGroup(absl::string_view group);

// The listening sockets of one TCP address: every address `host` resolves
// to, on one port (port 0: the kernel picks it for the first and the rest
// reuse it). An IPv6 socket is dual-stack unless the host also resolved to
// an IPv4 address. Non-blocking, close-on-exec, SO_REUSEADDR; not
// SO_REUSEPORT, so a second server cannot bind the same port.
// FAILED_PRECONDITION when the host does not resolve or nothing can be
// bound (addresses of a family this host lacks are skipped if another one
// binds).
struct TcpListener {
  std::vector<UniqueFd> fds;
  int port = 0;
};
absl::StatusOr<TcpListener> ListenTcp(const ListenAddress& address);

// RLIMIT_NOFILE, raised at startup: the soft limit is set to the hard one.
struct FdLimit {
  uint64_t soft_before = 0;
  uint64_t soft = 0;  // after raising (soft_before if raising failed)
  uint64_t hard = 0;
};
// Raises the soft limit to the hard limit (an infinite hard limit: to
// /proc/sys/fs/nr_open) and logs both. Never fails: on error the limit stays.
FdLimit RaiseFdLimit();

// The most connections a server whose descriptor limit is `soft` should
// hold: `requested`, lowered so that soft - cap descriptors (max(64,
// soft / 8)) remain for everything else (mappings, passed descriptors,
// metrics, gRPC's own), so that gRPC never runs out of descriptors because
// of connections. At least 1.
uint32_t ConnectionCapForFdLimit(uint32_t requested, uint64_t soft);

// `address` with its port replaced by `port` ("0.0.0.0:0" -> "0.0.0.0:40123").
std::string WithPort(absl::string_view address, int port);

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_LISTENERS_H_
