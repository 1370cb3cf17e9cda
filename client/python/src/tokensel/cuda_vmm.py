"""CUDA memory the legacy IPC path cannot export: VMM allocations (cuMemCreate,
PyTorch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).

Stream-ordered pool memory (cudaMallocAsync, cuMemAllocFromPoolAsync) is
refused (CudaUnavailableError naming the reason): cuMemRetainAllocationHandle
is documented only for memory the caller mapped with cuMemMap; on pool memory
it may give the pool's chunk while cuMemGetAddressRange gives the
sub-allocation, so the offset would be measured from the wrong base and the
server would map another tensor. Pool memory would need pool IPC
(cuMemPoolExportToShareableHandle + cuMemPoolExportPointer), not implemented.

`Client.register_cuda` asks the driver whether the memory is legacy-IPC capable
(cuPointerGetAttribute CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE); when
it is not, it registers the memory by descriptor instead, walking the memory
allocation by allocation (PyTorch's expandable_segments maps a segment as
consecutive chunks, each its own cuMemCreate allocation, so a large tensor
spans several):

  for each allocation, from the one holding `address` to the one holding
  the last byte:
    cuMemRetainAllocationHandle(cursor)     -> the physical allocation
    cuMemGetAddressRange(cursor)            -> where it is mapped: [base, +extent)
      (the first starts at or before `address`, each next one exactly where
      the previous ended; the handle backing its first and last byte is the
      one backing `cursor`, so the range is this one allocation)
    cuMemExportToShareableHandle(POSIX fd)  -> a descriptor for it
    cuMemRelease(handle)                    (the retained reference)
  fd channel, FD_KIND_CUDA_VMM, per descriptor -> ticket
  RegisterBuffer(fd {offset of the memory in the first allocation, size,
                     device_uuid, and
                     one allocation: ticket, allocation_size (the form every
                       server takes),
                     several: segments [{ticket, allocation_size}, ...]})

allocation_size is each allocation's size: the server maps every allocation
whole (some drivers refuse a partial map of an imported allocation), back to
back in one reserved range. At most MAX_SEGMENTS allocations (the server's
limit): a larger tensor raises CudaUnavailableError before the
(MAX_SEGMENTS + 1)-th is exported.

The descriptors stay open while the buffer is registered (a re-opened session
registers them again) and are closed by CudaBuffer.close(). Every error path
closes every descriptor exported so far and releases every retained handle.

cuMemGetAddressRange, cuIpcGetMemHandle (and the handle calls) need a
current context: from a thread where torch has not touched CUDA they fail
with CUDA_ERROR_INVALID_CONTEXT (201). The calls after the pointer's device
is known therefore run inside `drv.context(ordinal)`, which retains that
device's primary context (the one the runtime and torch use), pushes it,
and pops and releases it on every path.

The driver is reached with ctypes on libcuda.so.1 (LibcudaDriver), behind the
few methods `plan`/`export` use, so the decision and the export's cleanup are
tested with a fake driver and no GPU.
"""
import collections
import contextlib
import ctypes
import os

from tokensel.errors import CudaUnavailableError

LEGACY_IPC = "cuda_ipc"
VMM = "cuda_vmm"

# fds / allocation_sizes: one per allocation, in address order; offset is
# counted from the start of the first.
VmmSpec = collections.namedtuple(
    "VmmSpec", ["fds", "device_uuid", "offset", "size", "address", "device", "allocation_sizes"])

# The most allocations one buffer may span (the server's kMaxVmmSegments,
# also its per-session fd ticket limit): 128 chunks of 20 MiB are 2.5 GiB.
MAX_SEGMENTS = 128

# cuda.h values (stable ABI).
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14
_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1


def format_uuid(raw):
    """"GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from 16 raw bytes."""
    h = bytes(raw).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:32])


class DriverError(CudaUnavailableError):
    """A driver call failed; `.result` is its CUresult."""

    def __init__(self, what, result):
        super().__init__("%s failed: CUresult %d" % (what, result))
        self.result = result


class LibcudaDriver:
    """The driver calls this module needs, through ctypes on libcuda.so.1."""

    def __init__(self, path="libcuda.so.1"):
        try:
            self._cuda = ctypes.CDLL(path)
        except OSError as err:
            raise CudaUnavailableError("CUDA memory registration needs the CUDA driver (%s): %s"
                                       % (path, err)) from None
        self._call("cuInit", ctypes.c_uint(0))

    def _fn(self, *names):
        for name in names:
            fn = getattr(self._cuda, name, None)
            if fn is not None:
                return fn
        raise CudaUnavailableError("the CUDA driver lacks %s" % names[0])

    def _call(self, name, *args, fallback=()):
        fn = self._fn(name, *fallback)
        fn.restype = ctypes.c_int
        result = fn(*args)
        if result != 0:
            raise DriverError(name, result)

    def _attribute(self, attribute, address):
        # Every answer is read into a zeroed 64-bit word: the widest attribute
        # used (a pool handle) is pointer-sized, and a narrower one (a bool,
        # an int ordinal, a bitmask) fills the low bytes and leaves the rest 0
        # (little-endian). A 4-byte buffer would be overrun by a pointer answer.
        value = ctypes.c_uint64(0)
        self._call("cuPointerGetAttribute", ctypes.byref(value), ctypes.c_int(attribute),
                   ctypes.c_uint64(address))
        return value.value

    def legacy_ipc_capable(self, address):
        return bool(self._attribute(_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, address))

    def allows_posix_fd(self, address):
        return bool(self._attribute(_CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, address)
                    & _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)

    def device_ordinal(self, address):
        return ctypes.c_int32(self._attribute(_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address)).value

    def mempool(self, address):
        """The CUmemoryPool the memory was allocated from; 0 when none."""
        return self._attribute(_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, address)

    @contextlib.contextmanager
    def context(self, ordinal):
        """Makes device `ordinal`'s primary context current for the block:
        cuDevicePrimaryCtxRetain + cuCtxPushCurrent, then cuCtxPopCurrent +
        cuDevicePrimaryCtxRelease on every path (the release also when the
        push fails)."""
        device = ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal))
        ctx = ctypes.c_void_p(0)
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), device)
        try:
            self._call("cuCtxPushCurrent_v2", ctx)
            try:
                yield
            finally:
                popped = ctypes.c_void_p(0)
                self._call("cuCtxPopCurrent_v2", ctypes.byref(popped))
        finally:
            self._call("cuDevicePrimaryCtxRelease_v2", device)

    def device_uuid(self, ordinal):
        device = ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal))
        raw = (ctypes.c_char * 16)()
        self._call("cuDeviceGetUuid_v2", raw, device, fallback=("cuDeviceGetUuid",))
        return format_uuid(raw.raw)

    def retain_allocation_handle(self, address):
        handle = ctypes.c_uint64(0)
        self._call("cuMemRetainAllocationHandle", ctypes.byref(handle),
                   ctypes.c_void_p(address))
        return handle.value

    def address_range(self, address):
        # _v2 only: the unsuffixed symbol is the 32-bit interface
        # (CUdeviceptr_v1, unsigned int), which would write 4-byte answers
        # and truncate the 64-bit address; no fallback to it.
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        self._call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size),
                   ctypes.c_uint64(address))
        return base.value, size.value

    def export_fd(self, handle):
        fd = ctypes.c_int(-1)
        self._call("cuMemExportToShareableHandle", ctypes.byref(fd), ctypes.c_uint64(handle),
                   ctypes.c_int(_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), ctypes.c_uint64(0))
        return fd.value

    def release(self, handle):
        self._call("cuMemRelease", ctypes.c_uint64(handle))

    def ipc_mem_handle(self, address):
        raw = (ctypes.c_char * 64)()
        self._call("cuIpcGetMemHandle", raw, ctypes.c_uint64(address))
        return raw.raw


_driver = None


def driver():
    """The process's LibcudaDriver (loaded once)."""
    global _driver
    if _driver is None:
        _driver = LibcudaDriver()
    return _driver


def plan(drv, address):
    """LEGACY_IPC when cudaIpcGetMemHandle can export the memory at `address`,
    else VMM."""
    return LEGACY_IPC if drv.legacy_ipc_capable(address) else VMM


def export_legacy(drv, address, size, device=None):
    """A cuda_ipc.CudaSpec for legacy-IPC-capable memory at a raw pointer:
    the IPC handle of its allocation's base and the offset from it."""
    from tokensel.cuda_ipc import CudaSpec
    ordinal = drv.device_ordinal(address)
    with drv.context(ordinal):
        base, _ = drv.address_range(address)
        handle = drv.ipc_mem_handle(base)
    return CudaSpec(handle=handle, device_uuid=drv.device_uuid(ordinal),
                    offset=address - base, size=size, address=address,
                    device=device if device is not None else "cuda:%d" % ordinal)


def export(drv, address, size, device=None):
    """A VmmSpec for [address, address + size) of VMM memory: one exported
    descriptor per allocation holding it (owned by the caller: close them),
    the offset inside the first allocation and the device's UUID. Every
    retained handle is released on every path, every descriptor closed on
    every error."""
    if size <= 0:
        raise ValueError("size must be > 0, got %d" % size)
    if drv.mempool(address):
        # First: cuMemRetainAllocationHandle is documented for cuMemMap'ed
        # ranges only; on pool memory handle and address range may disagree
        # (pool chunk vs sub-allocation) and the offset would be wrong.
        raise CudaUnavailableError(
            "the CUDA memory at 0x%x comes from a stream-ordered memory pool (cudaMallocAsync / "
            "cuMemAllocFromPoolAsync); pool memory cannot be registered by descriptor (that needs "
            "pool IPC, cuMemPoolExportPointer, which is not implemented): pass it inline, or "
            "allocate it with cudaMalloc or cuMemCreate (PyTorch: the native allocator, with or "
            "without expandable_segments)" % address)
    if not drv.allows_posix_fd(address):
        raise CudaUnavailableError(
            "the CUDA allocation at 0x%x is neither legacy-IPC capable nor exportable as a POSIX "
            "file descriptor (it was allocated without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); "
            "pass it inline or allocate it with that handle type" % address)
    ordinal = drv.device_ordinal(address)
    uuid = drv.device_uuid(ordinal)
    pieces = []  # (fd, allocation size), filled as exported
    try:
        with drv.context(ordinal):  # the calls below need a current context
            offset = _export_in_context(drv, address, size, pieces)
    except BaseException:
        _close_all(fd for fd, _ in pieces)
        raise
    return VmmSpec(fds=tuple(fd for fd, _ in pieces), device_uuid=uuid, offset=offset, size=size,
                   address=address, device=device if device is not None else "cuda:%d" % ordinal,
                   allocation_sizes=tuple(extent for _, extent in pieces))


def _close_all(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _export_in_context(drv, address, size, pieces):
    """export()'s steps that need the device's context: appends (descriptor,
    allocation size) to `pieces` for each allocation from the one holding
    `address` to the one holding its last byte; returns the offset in the
    first. The caller closes what `pieces` holds when this raises."""
    end = address + size
    cursor = address
    offset = None
    while cursor < end:
        if len(pieces) == MAX_SEGMENTS:
            raise CudaUnavailableError(
                "the memory [0x%x, +%d) spans more than %d CUDA allocations (the server's limit "
                "per buffer; %d bytes are in the first %d): register a smaller tensor, or allocate "
                "it without expandable_segments" % (address, size, MAX_SEGMENTS,
                                                    cursor - address, MAX_SEGMENTS))
        base, extent = _export_one(drv, cursor, address, size, pieces)
        if offset is None:
            offset = address - base
        cursor = base + extent
    return offset


def _export_one(drv, cursor, address, size, pieces):
    """Exports the allocation holding `cursor` into `pieces`; returns its
    address range. The retained handle is released on every path."""
    handle = drv.retain_allocation_handle(cursor)
    fd = -1
    try:
        base, extent = drv.address_range(cursor)
        if not base <= cursor < base + extent or (pieces and base != cursor):
            # The first allocation holds `address`; each next one must start
            # exactly where the previous one ended (the walk asks at that end).
            raise CudaUnavailableError(
                "the driver reports [0x%x, +%d) as the allocation holding 0x%x of the memory "
                "[0x%x, +%d); this memory cannot be registered by descriptor"
                % (base, extent, cursor, address, size))
        # The range must be this one allocation, whatever cuMemGetAddressRange
        # reports for VMM mappings: the handle backing its first and last byte
        # is the one backing `cursor` (the driver returns the very handle the
        # memory was mapped with).
        for probe in (base, base + extent - 1):
            other = drv.retain_allocation_handle(probe)
            drv.release(other)
            if other != handle:
                raise CudaUnavailableError(
                    "the address range [0x%x, +%d) the driver reports for 0x%x is not one CUDA "
                    "allocation; this memory cannot be registered by descriptor"
                    % (base, extent, cursor))
        fd = drv.export_fd(handle)
        pieces.append((fd, extent))  # from now on the caller closes it
    except BaseException:
        if fd >= 0 and (not pieces or pieces[-1][0] != fd):
            os.close(fd)
        drv.release(handle)
        raise
    drv.release(handle)  # the descriptor keeps the allocation reachable
    return base, extent
