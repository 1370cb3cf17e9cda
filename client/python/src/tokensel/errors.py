"""Exceptions: every failed call raises a TokenselError subclass.

`TokenselError.code` is the grpc.StatusCode and `.message` the server's
message (which names the offending field, e.g. "indices[1,3] = 7 is out of
range [0, 5)"). Status codes and when the server uses them: docs/server.md.
"""
import grpc


class TokenselError(Exception):
    """A failed tokensel call. `code` is a grpc.StatusCode."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self):
        return "%s: %s" % (self.code.name, self.message)


class InvalidArgumentError(TokenselError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class OutOfRangeError(TokenselError):
    code = grpc.StatusCode.OUT_OF_RANGE


class NotFoundError(TokenselError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(TokenselError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(TokenselError):
    """Also a TCP call whose bearer token the server refused (wrong token)."""
    code = grpc.StatusCode.PERMISSION_DENIED


class UnauthenticatedError(TokenselError):
    """A TCP call without a (well-formed) bearer token, to a server that
    wants one."""
    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPreconditionError(TokenselError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class CudaUnavailableError(FailedPreconditionError):
    """CUDA IPC cannot be used here: no cuda-bindings, no device, or a server
    without the cuda_ipc memory kind. Raised by the client, before any RPC."""


class ResourceExhaustedError(TokenselError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(TokenselError):
    code = grpc.StatusCode.UNAVAILABLE


class TlsHandshakeError(UnavailableError):
    """The TLS handshake failed: the server's certificate is not signed by a
    trusted CA (tls_ca), does not carry the expected name (server_name), or
    the port does not speak TLS. Raised by the client, which recognises the
    handshake in gRPC's UNAVAILABLE."""


class DeadlineExceededError(TokenselError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class InternalError(TokenselError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgumentError, OutOfRangeError, NotFoundError, AlreadyExistsError,
    PermissionDeniedError, UnauthenticatedError, FailedPreconditionError, ResourceExhaustedError,
    UnavailableError, DeadlineExceededError, InternalError)}


def from_code(code, message):
    """The exception for a grpc.StatusCode (TokenselError for unmapped codes)."""
    cls = _BY_CODE.get(code, TokenselError)
    return cls(message, code=code)


def from_rpc_error(err):
    """Converts a grpc.RpcError raised by a stub call."""
    return from_code(err.code(), err.details() or "")
