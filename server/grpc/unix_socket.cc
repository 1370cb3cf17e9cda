#include "server/grpc/unix_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/errno_string.h"

namespace tokensel::server {
namespace {

std::string Errno() { return ErrnoString(errno); }

std::string Octal(mode_t mode) { return absl::StrFormat("%04o", mode & 07777); }

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status CannotCreateDirectory(const std::string& dir, int err) {
  std::string hint;
  if (::geteuid() != 0) {
    const char* runtime = std::getenv("XDG_RUNTIME_DIR");
    hint = absl::StrCat("; as a non-root user pass --listen=unix://",
                        runtime != nullptr && runtime[0] == '/' ? runtime : "$XDG_RUNTIME_DIR",
                        "/tokensel.sock (or create ", dir, " owned by this user, mode 0750)");
  }
  return absl::FailedPreconditionError(absl::StrCat("listen: cannot create the socket directory ",
                                                    dir, ": ", ErrnoString(err), hint));
}

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Callers checked the length (ParseListenAddress, ListenUnix).
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

}  // namespace

std::string FdChannelPath(const std::string& socket_path) { return socket_path + ".fd"; }

absl::Status PrepareSocketDirectory(const std::string& socket_path, std::optional<gid_t> group) {
  const std::string dir = DirectoryOf(socket_path);
  const uid_t euid = ::geteuid();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::FailedPreconditionError(
          absl::StrCat("listen: cannot stat the socket directory ", dir, ": ", Errno()));
    }
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return CannotCreateDirectory(dir, errno);
    }
    // Created 0700 (whatever the umask), then opened up to the group.
    if (group.has_value() && ::chown(dir.c_str(), static_cast<uid_t>(-1), *group) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("listen: chown of the socket directory ",
                                                        dir, " to gid ", *group, ": ", Errno()));
    }
    if (::chmod(dir.c_str(), 0750) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("listen: chmod 0750 of the socket directory ", dir, ": ", Errno()));
    }
    if (::stat(dir.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("listen: cannot stat the socket directory ", dir, ": ", Errno()));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: ", dir, " (the socket's directory) is not a directory"));
  }
  // The owner of a directory may remove any entry in it, sticky or not.
  if (st.st_uid != euid && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listen: the socket directory ", dir, " belongs to uid ", st.st_uid,
        ", who could replace the socket; use a directory owned by the server's user (uid ", euid,
        ") or root, e.g. /run/tokensel"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listen: the socket directory ", dir, " (mode ", Octal(st.st_mode),
        ") can be written by other users and is not sticky, so any of them could replace "
        "the socket; use a directory only the server's user can write, e.g. /run/tokensel"));
  }
  return absl::OkStatus();
}

absl::Status RemoveStaleSocket(const std::string& path, int type) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("listen: cannot stat ", path, ": ", Errno()));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: ", path, " exists and is not a socket; refusing to replace it"));
  }
  const uid_t euid = ::geteuid();
  if (st.st_uid != euid) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: ", path, " exists and belongs to uid ", st.st_uid,
                     ", not to this server (uid ", euid, "); refusing to remove it"));
  }
  UniqueFd probe(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!probe.valid()) {
    return absl::FailedPreconditionError(absl::StrCat("listen: socket(): ", Errno()));
  }
  const sockaddr_un addr = Address(path);
  const bool live = ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr),
                              sizeof(addr)) == 0 ||
                    errno == EPROTOTYPE;  // someone listens with another socket type
  if (live) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: another server is accepting on ", path));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: cannot remove stale socket ", path, ": ", Errno()));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, const UnixListenOptions& options) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("listen: socket path '", path,
                                                   "' is empty or longer than ",
                                                   sizeof(sockaddr_un::sun_path) - 1, " bytes"));
  }
  if (absl::Status s = PrepareSocketDirectory(path, options.group); !s.ok()) return s;
  if (absl::Status s = RemoveStaleSocket(path, options.type); !s.ok()) return s;

  UniqueFd fd(::socket(AF_UNIX, options.type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid())
    return absl::FailedPreconditionError(absl::StrCat("listen: socket(): ", Errno()));
  const sockaddr_un addr = Address(path);
  const mode_t old_umask = ::umask(0177);
  const int bound = ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (bound != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen: bind ", path, ": ", ErrnoString(bind_errno),
                     bind_errno == EADDRINUSE ? " (created by someone else meanwhile)" : ""));
  }
  // From here on the entry is ours: remove it on every error.
  auto fail = [&path](std::string message) {
    ::unlink(path.c_str());
    return absl::FailedPreconditionError(std::move(message));
  };
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("listen: cannot stat ", path, ": ", Errno()));
  }
  if (!S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid()) {
    // Replaced between bind and lstat: not ours to remove.
    return absl::FailedPreconditionError(
        absl::StrCat("listen: ", path, " was replaced right after bind"));
  }
  if ((st.st_mode & 0177) != 0) {
    return fail(absl::StrCat("listen: ", path, " was created with mode ", Octal(st.st_mode),
                             " despite umask 0177"));
  }
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    return fail(absl::StrCat("listen: listen() on ", path, ": ", Errno()));
  }
  if (options.group.has_value() && ::fchownat(AT_FDCWD, path.c_str(), static_cast<uid_t>(-1),
                                              *options.group, AT_SYMLINK_NOFOLLOW) != 0) {
    return fail(absl::StrCat("listen: chown ", path, " to gid ", *options.group, " failed: ",
                             Errno(), " (the server's user must be root or in that group)"));
  }
  if (::chmod(path.c_str(), options.mode) != 0) {
    return fail(
        absl::StrCat("listen: chmod ", Octal(options.mode), " ", path, " failed: ", Errno()));
  }
  return fd;
}

}  // namespace tokensel::server
