// The fd channel, client side: how a process on the server's host hands the
// server a file descriptor (its shared memory) to register. The server maps
// exactly what the descriptor gives access to, so a client can only ever
// register memory it could open itself. Client::RegisterBuffer uses this for
// you; call it directly only for raw RPCs.
//
//   ASSIGN_OR_RETURN(v1::FdChannelReply reply,
//                    SendFd(FdChannelPath("unix:///run/tokensel/tokensel.sock"),
//                           session_id, v1::FD_KIND_HOST_MEMORY, memfd));
//   request.mutable_fd()->set_ticket(reply.ticket());   // then RegisterBuffer
//
// Wire (proto/tokensel/v1/tokensel.proto, "fd channel"): a SOCK_SEQPACKET
// unix socket at the gRPC socket's path + ".fd"; one serialized
// FdChannelRequest with the descriptor in SCM_RIGHTS, one FdChannelReply
// back. The server checks that the session belongs to this process's uid.
#ifndef TOKENSEL_CLIENT_FD_CHANNEL_H_
#define TOKENSEL_CLIENT_FD_CHANNEL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::client {

namespace v1 = ::tokensel::v1;

// "<path>.fd" for a "unix:///abs/path" or "unix:rel/path" target; empty for
// any other target (TCP targets have no fd channel).
std::string FdChannelPath(absl::string_view target);

// Sends `fd` (not closed; the server receives its own copy) for `session_id`
// and returns the server's reply when its code is OK, else the reply's
// status (NOT_FOUND unknown session, PERMISSION_DENIED another uid's
// session or a read-only descriptor, INVALID_ARGUMENT not shared memory,
// RESOURCE_EXHAUSTED too many tickets). UNAVAILABLE when the channel cannot
// be reached; DEADLINE_EXCEEDED after `timeout`.
absl::StatusOr<v1::FdChannelReply> SendFd(const std::string& fd_channel_path,
                                          absl::string_view session_id, v1::FdKind kind, int fd,
                                          absl::Duration timeout = absl::Seconds(10));

// A RegisterBufferRequest.fd ticket of the form "fd:<n>" names descriptor n
// of the calling process: Client::RegisterBuffer sends that descriptor on the
// fd channel and puts the server's ticket in its place. SharedRegion's
// RegisterRequest() uses it, so a request can be stored and replayed (Session
// re-opens) as long as the descriptor stays open.
std::string LocalFdTicket(int fd);
// The n of an "fd:<n>" ticket, or -1.
int ParseLocalFdTicket(absl::string_view ticket);

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_FD_CHANNEL_H_
