// Unix listening sockets that no other local user can take over: where the
// socket file lives, who may replace it, and its mode while it is created.
//
// ListenUnix(path) applies, in order (the gRPC socket and its fd channel
// alike):
//  1. The socket's directory is created if missing (mode 0750, owned by the
//     server's euid and by `group` when set, so its members can reach the
//     socket); its parent must exist. Non-root servers that cannot create it
//     get a FAILED_PRECONDITION that says to pass
//     --listen=unix://$XDG_RUNTIME_DIR/tokensel.sock.
//  2. A directory owned by a uid other than the server's euid and root is
//     refused (its owner may remove any entry in it); so is one with the
//     group or other write bit unless it is sticky (/tmp), where rule 3 then
//     makes sure the entry is the server's own. Only the socket's own
//     directory is checked, not its ancestors.
//  3. An existing entry at `path` is removed only if it is a socket owned by
//     the server's euid that nobody accepts on (a crashed server's
//     leftover); anything else (not a socket, another uid's entry: e.g. a
//     name squatted in a sticky directory, a live server) is refused.
//  4. bind() runs under umask 0177, so the socket is never more open than
//     0600 (checked with lstat: still our socket, no bit beyond 0600); then
//     listen(), chown to `group` (if set) and chmod to `mode`.
// Every refusal is FAILED_PRECONDITION naming the path and the reason.
//
// umask is process-wide: another thread creating a file during the bind gets
// the tighter 0177 (never a looser mode). Not for concurrent use with other
// code that depends on the umask.
#ifndef TOKENSEL_SERVER_GRPC_UNIX_SOCKET_H_
#define TOKENSEL_SERVER_GRPC_UNIX_SOCKET_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tokensel::server {

struct UnixListenOptions {
  int type = SOCK_STREAM;      // SOCK_SEQPACKET for the fd channel
  std::optional<gid_t> group;  // chown target; nullopt = the server's gid
  mode_t mode = 0660;          // final mode of the socket file
};

// The fd channel's socket beside a gRPC unix socket: `path` + ".fd".
std::string FdChannelPath(const std::string& socket_path);

// Rules 1-4 above; returns the listening socket (non-blocking,
// close-on-exec). On error nothing is left at `path` that was not there
// before.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, const UnixListenOptions& options);

// Rules 1 and 2 for the directory holding `socket_path`.
absl::Status PrepareSocketDirectory(const std::string& socket_path, std::optional<gid_t> group);

// Rule 3: makes `path` free for a new listener of socket type `type`:
// nothing there is fine; a socket of the server's euid that nobody accepts
// on is removed; FAILED_PRECONDITION for a live server, a non-socket, or an
// entry owned by another uid.
absl::Status RemoveStaleSocket(const std::string& path, int type = SOCK_STREAM);

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_UNIX_SOCKET_H_
