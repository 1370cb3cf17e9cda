// The fd channel's wire protocol, one connection at a time (the accept loop,
// accept_loop.h, owns the sockets and calls these).
//
// The fd channel is a SOCK_SEQPACKET unix socket at <unix listener> + ".fd".
// Per registration a client sends one packet: a serialized
// tokensel.v1.FdChannelRequest (at most 4096 bytes) with exactly one file
// descriptor in an SCM_RIGHTS control message, and reads one packet: a
// serialized FdChannelReply. The caller is the SO_PEERCRED of its fd-channel
// connection, taken at accept.
//
// Errors are replies (code = google.rpc.Code, message naming what is wrong),
// never a dropped connection: INVALID_ARGUMENT for a packet over 4096 bytes
// (MSG_TRUNC), a truncated control message (more descriptors than fit, or
// the server at its descriptor limit), no descriptor, more than one, bytes
// that are not an FdChannelRequest, an empty session_id or an unknown kind;
// otherwise whatever core::FdReceiver::Receive returns. Every descriptor not
// passed to the receiver is closed.
#ifndef TOKENSEL_SERVER_GRPC_FD_CHANNEL_PROTOCOL_H_
#define TOKENSEL_SERVER_GRPC_FD_CHANNEL_PROTOCOL_H_

#include <cstddef>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "server/core/fd_channel.h"
#include "server/core/peer.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::server {

inline constexpr size_t kFdChannelMaxPacket = 4096;
// Room in the control buffer; more descriptors than this arrive as
// MSG_CTRUNC (the kernel closes the excess).
inline constexpr int kFdChannelMaxFds = 16;

struct FdChannelPacket {
  std::string bytes;
  std::vector<UniqueFd> fds;       // close-on-exec (MSG_CMSG_CLOEXEC)
  bool truncated = false;          // MSG_TRUNC: the packet was longer than 4096
  bool control_truncated = false;  // MSG_CTRUNC
};

enum class FdChannelRead { kPacket, kWouldBlock, kClosed };

// Reads one packet from the non-blocking connection `fd` (MSG_DONTWAIT).
// kClosed at end of stream (a read of 0 bytes without control data, which
// includes an empty packet without a descriptor) or on a socket error.
FdChannelRead ReadFdChannelPacket(int fd, FdChannelPacket* packet);

// Validates `packet` and, when it is well formed, calls
// receiver.Receive(peer, session_id, kind, fd). Never fails: errors are the
// reply's code and message (at most 1024 bytes of it).
v1::FdChannelReply HandleFdChannelPacket(FdChannelPacket packet, const core::Peer& peer,
                                         core::FdReceiver& receiver);

// Sends `reply` as one packet without blocking (MSG_DONTWAIT|MSG_NOSIGNAL);
// false when it cannot be sent at once: the caller drops the connection.
bool SendFdChannelReply(int fd, const v1::FdChannelReply& reply);

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_FD_CHANNEL_PROTOCOL_H_
