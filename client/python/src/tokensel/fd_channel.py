"""The fd channel: how a process on the server's host hands the server a file
descriptor (its shared memory) to register.

The server maps exactly what the descriptor gives access to, so a client can
only register memory it could open itself. `Client.shared_buffer()` uses this
for you. Wire format (tokensel.proto, "fd channel"): a SOCK_SEQPACKET unix
socket at the gRPC socket's path + ".fd"; one serialized FdChannelRequest with
the descriptor in SCM_RIGHTS, one FdChannelReply back.
"""
import array
import socket

import grpc

from tokensel import errors
from tokensel.v1 import tokensel_pb2 as pb

_MAX_REPLY = 64 * 1024


def channel_path(target):
    """"<path>.fd" for a "unix:///abs/path" or "unix:rel/path" target; None for
    any other target (TCP targets have no fd channel)."""
    if not target.startswith("unix:"):
        return None
    path = target[len("unix:"):]
    if path.startswith("//"):
        path = path[2:]
    return path + ".fd" if path else None


def send_fd(path, session_id, fd, kind=pb.FD_KIND_HOST_MEMORY, timeout=10.0):
    """Sends `fd` (not closed here) for `session_id`; returns the server's
    FdChannelReply. Raises the TokenselError subclass of the server's answer,
    UnavailableError when nothing listens at `path`, or FailedPreconditionError
    when there is no fd channel (`path` None: a TCP target)."""
    if path is None:
        raise errors.FailedPreconditionError(
            "fd channel: the target is not a unix socket; memory can be registered by "
            "descriptor only on the server's host")
    request = pb.FdChannelRequest(session_id=session_id, kind=kind).SerializeToString()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                      array.array("i", [fd]))])
            data = sock.recv(_MAX_REPLY)
    except socket.timeout:
        raise errors.DeadlineExceededError("fd channel %s: timed out" % path) from None
    except (FileNotFoundError, ConnectionRefusedError) as err:
        raise errors.UnavailableError(
            "fd channel %s: %s (is a tokensel server with an fd channel listening there?)"
            % (path, err.strerror)) from None
    except PermissionError as err:
        raise errors.PermissionDeniedError("fd channel %s: %s" % (path, err.strerror)) from None
    except OSError as err:
        raise errors.UnavailableError("fd channel %s: %s" % (path, err)) from None
    if not data:
        raise errors.UnavailableError(
            "fd channel %s: the server closed the connection without a reply" % path)
    reply = pb.FdChannelReply.FromString(data)
    if reply.code != 0:
        raise errors.from_code(_status_code(reply.code), "fd channel: " + reply.message)
    return reply


def _status_code(number):
    """The grpc.StatusCode whose number is `number` (UNKNOWN if none)."""
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN
