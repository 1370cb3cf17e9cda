// Listen addresses: parsing, stale unix socket cleanup, resolved names.
// Pure helpers for Server; no gRPC types.
#ifndef TOKENSEL_SERVER_GRPC_LISTENERS_H_
#define TOKENSEL_SERVER_GRPC_LISTENERS_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokensel::server {

struct ListenAddress {
  std::string address;                   // as given to grpc::ServerBuilder
  std::optional<std::string> unix_path;  // the socket file, for unix listeners
};

// "unix:///abs/path" and "unix:path" are unix sockets; "host:port" (with
// "[v6]:port") is TCP. INVALID_ARGUMENT for an empty address, an empty unix
// path, a path longer than sockaddr_un allows, or a TCP address without a
// numeric port.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view address);

// Makes `path` free for a new listener: nothing there is fine; a socket
// nobody accepts on (a crashed server's leftover) is removed;
// FAILED_PRECONDITION if a live server accepts on it or the path is not a
// socket.
absl::Status RemoveStaleSocket(const std::string& path);

// The gid of `group`, a group name or a numeric gid (--unix_socket_group).
// INVALID_ARGUMENT for an empty value or a name the group database does not
// know; a numeric gid is taken as is.
absl::StatusOr<gid_t> ResolveGroup(absl::string_view group);

// `address` with its port replaced by `port` ("0.0.0.0:0" -> "0.0.0.0:40123").
std::string WithPort(absl::string_view address, int port);

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_LISTENERS_H_
