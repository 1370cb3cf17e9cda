"""tokensel: Python client of the tokensel token-selection sidecar.

    import tokensel
    with tokensel.Client("unix:///run/tokensel/tokensel.sock") as client:
        ids = client.sample_tokens(layers=1, batch=8, original_tokens=512,
                                   retained_tokens=256, seed=1, step=0).ids
        part = client.gather_tokens(hidden, ids[0])          # numpy in, numpy out

API contract: proto/tokensel/v1/tokensel.proto; operators: docs/ops.md.
PyTorch autograd functions and Random-LTD layers: tokensel.torch (needs torch).
"""
from tokensel.client import SESSION_KEY, Client
from tokensel.cuda_ipc import CudaBuffer
from tokensel.errors import (AlreadyExistsError, CudaUnavailableError, DeadlineExceededError,
                             FailedPreconditionError, InternalError, InvalidArgumentError,
                             NotFoundError, OutOfRangeError, PermissionDeniedError,
                             ResourceExhaustedError, TlsHandshakeError, TokenselError,
                             UnauthenticatedError, UnavailableError)
from tokensel.ops import (PackedSampleResult, PreparedOp, SampleResult, SortResult,
                          SplitResult, packed_kept_tokens)
from tokensel.shm import SharedBuffer
from tokensel.stream import Stream
from tokensel.tensors import TransferStats

__version__ = "0.1.0"

__all__ = [
    "SESSION_KEY", "Client", "CudaBuffer", "SharedBuffer", "Stream", "PreparedOp", "SampleResult",
    "SortResult", "SplitResult", "PackedSampleResult", "packed_kept_tokens", "TransferStats", "TokenselError", "InvalidArgumentError", "OutOfRangeError", "NotFoundError",
    "AlreadyExistsError", "PermissionDeniedError", "FailedPreconditionError",
    "CudaUnavailableError", "ResourceExhaustedError", "UnavailableError", "TlsHandshakeError",
    "UnauthenticatedError",
    "DeadlineExceededError", "InternalError",
]
