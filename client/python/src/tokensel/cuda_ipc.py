"""CUDA IPC registration of CUDA torch tensors (needs `cuda-bindings`).

The server opens the 64-byte cudaIpcMemHandle of the *allocation* that holds
the tensor's storage (cuMemGetAddressRange finds its base: PyTorch's caching
allocator sub-allocates blocks) and uses `offset` to find the storage inside
it. cuda-bindings is imported lazily, so the package works without it; every
reason CUDA IPC cannot be used raises CudaUnavailableError (a
FailedPreconditionError) before any RPC.
"""
import collections
import os

from tokensel.errors import CudaUnavailableError

CudaSpec = collections.namedtuple(
    "CudaSpec", ["handle", "device_uuid", "offset", "size", "address", "device"])


def driver():
    """The cuda-bindings driver module (new and old module layouts)."""
    try:
        from cuda.bindings import driver as drv  # cuda-bindings >= 12.6
        return drv
    except ImportError:
        pass
    try:
        from cuda import cuda as drv  # cuda-python < 12.6
        return drv
    except ImportError:
        raise CudaUnavailableError(
            "CUDA IPC needs the cuda-bindings package (pip install 'tokensel[cuda]')") from None


def _check(result, what):
    err, *values = result
    if int(err) != 0:
        raise CudaUnavailableError("%s failed: CUresult %d" % (what, int(err)))
    return values[0] if len(values) == 1 else values


IPC_EVENT_HANDLE_BYTES = 64  # sizeof(cudaIpcEventHandle_t)


def event_handle(event, field):
    """The 64 bytes of a CUDA IPC event handle for Execute's `field`
    ("wait_event" / "record_event"): b"" for None; a torch.cuda.Event made
    with interprocess=True (its ipc_handle()); or the raw bytes of a
    cudaIpcEventHandle_t. ValueError for another length, TypeError for
    anything else. Touches no device."""
    if event is None:
        return b""
    if hasattr(event, "ipc_handle"):
        try:
            event = event.ipc_handle()
        except RuntimeError as e:  # torch: an event made without interprocess=True
            raise ValueError("%s: the event has no IPC handle (create it with "
                             "torch.cuda.Event(interprocess=True)): %s" % (field, e)) from None
    if isinstance(event, (bytes, bytearray, memoryview)):
        raw = bytes(event)
        if len(raw) != IPC_EVENT_HANDLE_BYTES:
            raise ValueError("%s: a CUDA IPC event handle is %d bytes, got %d"
                             % (field, IPC_EVENT_HANDLE_BYTES, len(raw)))
        return raw
    raise TypeError("%s takes a torch.cuda.Event(interprocess=True) or the %d bytes of a "
                    "cudaIpcEventHandle_t, got %r" % (field, IPC_EVENT_HANDLE_BYTES, type(event)))


def format_uuid(raw):
    """"GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from 16 raw bytes."""
    h = bytes(raw).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:32])


def check_tensor(tensor):
    """The cuda-bindings driver module, once `tensor` is a CUDA torch tensor
    on a usable device. Raises CudaUnavailableError (no cuda-bindings / no
    device) or TypeError."""
    drv = driver()
    import torch
    if not torch.cuda.is_available():
        raise CudaUnavailableError("CUDA IPC needs a CUDA device; torch %s sees none"
                                   % torch.__version__)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise TypeError("register_cuda takes a CUDA torch tensor, got %r" % type(tensor))
    return drv


def export(tensor, server_info):
    """A CudaSpec for `tensor`'s whole storage. Raises CudaUnavailableError
    (no cuda-bindings / no device / server without cuda_ipc) or TypeError."""
    drv = check_tensor(tensor)
    import torch
    if "cuda_ipc" not in server_info.memory_kinds:
        raise CudaUnavailableError("the server (backend %s) does not accept cuda_ipc buffers"
                                   % server_info.backend)
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    address = storage.data_ptr()
    size = storage.nbytes()
    with torch.cuda.device(tensor.device):
        base, _ = _check(drv.cuMemGetAddressRange(address), "cuMemGetAddressRange")
        base = int(base)
        handle = _check(drv.cuIpcGetMemHandle(base), "cuIpcGetMemHandle")
        device = _check(drv.cuDeviceGet(tensor.device.index), "cuDeviceGet")
        uuid = _check(drv.cuDeviceGetUuid(device), "cuDeviceGetUuid")
    return CudaSpec(handle=bytes(handle.reserved), device_uuid=format_uuid(uuid.bytes),
                    offset=address - base, size=size, address=address, device=str(tensor.device))


class CudaBuffer:
    """A registered CUDA allocation; CUDA tensors inside it are passed to ops
    by reference. `spec.kind` says how it was registered: "cuda_ipc" (legacy
    IPC handle) or "cuda_vmm" (VMM descriptors, one per allocation,
    tokensel.cuda_vmm, which this buffer keeps open for re-registration and
    closes). close() unregisters
    (idempotent)."""

    def __init__(self, client, name, spec, fd=None):
        self._client = client
        self.name = name
        self.spec = spec
        self.kind = "cuda_vmm" if fd is not None else "cuda_ipc"
        self._fd = fd
        self.closed = False

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self._client._unregister(self)
            finally:
                if self._fd is not None:
                    # One descriptor, or one per allocation (cuda_vmm).
                    fds = self._fd if isinstance(self._fd, (tuple, list)) else (self._fd,)
                    self._fd = None
                    for fd in fds:
                        os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
