// Peer: who is on the other end of a connection, as the kernel told the
// server (never as the client claims). The front end fills it in per
// connection at accept time; the core uses it for per-peer quotas (sessions,
// connections) and to bind a session to the principal that opened it.
//
//  - kUnix: SO_PEERCRED of the accepted unix socket (uid, gid, pid of the
//    connecting process at connect time). The principal is the uid.
//  - kTcp:  the remote address (TLS + bearer token authenticate the caller;
//    the token is one shared secret, so the address is what tells callers
//    apart). The principal is the address without the port.
//  - kUnknown: the front end could not identify the connection (in-process
//    channels in tests). It is its own principal, "unknown".
#ifndef TOKENSEL_SERVER_CORE_PEER_H_
#define TOKENSEL_SERVER_CORE_PEER_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace tokensel::core {

struct Peer {
  enum class Kind : uint8_t { kUnknown, kUnix, kTcp };
  Kind kind = Kind::kUnknown;
  uid_t uid = 0;        // kUnix
  gid_t gid = 0;        // kUnix
  pid_t pid = 0;        // kUnix (at connect time; informational)
  std::string address;  // kTcp: "10.0.0.7" / "::1" (no port)

  static Peer Unix(uid_t uid, gid_t gid, pid_t pid) {
    Peer p;
    p.kind = Kind::kUnix;
    p.uid = uid;
    p.gid = gid;
    p.pid = pid;
    return p;
  }
  static Peer Tcp(std::string address) {
    Peer p;
    p.kind = Kind::kTcp;
    p.address = std::move(address);
    return p;
  }

  // The quota bucket and session owner: "uid:1000", "tcp:10.0.0.7",
  // "unknown". Two peers with equal principals are the same caller.
  std::string Principal() const {
    switch (kind) {
      case Kind::kUnix:
        return absl::StrCat("uid:", uid);
      case Kind::kTcp:
        return absl::StrCat("tcp:", address);
      case Kind::kUnknown:
        break;
    }
    return "unknown";
  }
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_PEER_H_
