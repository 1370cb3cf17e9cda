"""POSIX shared memory for tokensel buffers.

`ShmRegion` owns one shm object (shm_open + ftruncate + mmap, created with
O_EXCL and mode 0600 so only this uid can open it) and hands out numpy /
torch views of it. `SharedBuffer` is a region registered with a session;
`Client.shared_buffer()` creates one. Closing a SharedBuffer unregisters it
and unlinks the object; the mapping goes away with the last view of it.
"""
import ctypes
import ctypes.util
import itertools
import mmap
import os
import secrets

import numpy as np

from tokensel import dtypes

_counter = itertools.count()


def _libc_function(name):
    for lib in (None, ctypes.util.find_library("rt")):  # glibc >= 2.34 has them in libc
        try:
            fn = getattr(ctypes.CDLL(lib, use_errno=True), name)
        except (OSError, AttributeError):
            continue
        return fn
    raise OSError("%s is not available in this C library" % name)


def _shm_call(name, *args):
    fn = _libc_function(name)
    fn.restype = ctypes.c_int
    result = fn(*args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s(%s): %s" % (name, args[0].decode(), os.strerror(err)))
    return result


def unique_shm_name(prefix):
    """`prefix` + "py-<pid>-<n>-<random>", a fresh shm object name."""
    if not prefix.startswith("/"):
        raise ValueError("shm prefix %r must start with '/'" % prefix)
    return "%spy-%d-%d-%s" % (prefix, os.getpid(), next(_counter), secrets.token_hex(4))


class ShmRegion:
    """A newly created POSIX shm object of `size` bytes (> 0), mapped
    read-write. Not thread-safe; close() is idempotent."""

    def __init__(self, shm_name, size):
        if size <= 0:
            raise ValueError("shared buffer size must be > 0, got %d" % size)
        self.shm_name = shm_name
        self.size = size
        encoded = shm_name.encode()
        fd = _shm_call("shm_open", encoded,
                       os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                       ctypes.c_uint(0o600))
        try:
            os.ftruncate(fd, size)
            self._mmap = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            _shm_call("shm_unlink", encoded)
            raise
        os.close(fd)  # the mapping stays valid
        anchor = ctypes.c_char.from_buffer(self._mmap)
        self.address = ctypes.addressof(anchor)
        del anchor
        self._linked = True

    @property
    def closed(self):
        return self._mmap is None

    def _check_view(self, nbytes_extent, offset):
        if self._mmap is None:
            raise ValueError("shared buffer %s is closed" % self.shm_name)
        if offset < 0 or offset + nbytes_extent > self.size:
            raise ValueError("view [%d, %d) is outside the %d-byte buffer %s"
                             % (offset, offset + nbytes_extent, self.size, self.shm_name))

    def numpy(self, dtype, shape, offset=0, strides=None):
        """A numpy view of `shape` at byte `offset`; `strides` in elements
        (default row-major). Writes go straight to shared memory."""
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if strides is None:
            byte_strides = None
            extent = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        else:
            byte_strides = tuple(int(s) * dtype.itemsize for s in strides)
            extent = 0 if 0 in shape else (
                sum((d - 1) * s for d, s in zip(shape, byte_strides)) + dtype.itemsize)
        self._check_view(extent, offset)
        return np.ndarray(shape, dtype=dtype, buffer=self._mmap, offset=offset,
                          strides=byte_strides)

    def torch(self, dtype, shape, offset=0, strides=None):
        """A CPU torch view (any torch dtype, bfloat16 included)."""
        import torch
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        torch_dtype = dtypes.to_torch(dtypes.parse(dtype))
        elem = torch.empty((), dtype=torch_dtype).element_size()
        if strides is None:
            strides = [1] * len(shape)
            for i in range(len(shape) - 2, -1, -1):
                strides[i] = strides[i + 1] * max(shape[i + 1], 1)
        count = 0 if 0 in shape else sum((d - 1) * s for d, s in zip(shape, strides)) + 1
        self._check_view(count * elem, offset)
        if count == 0:
            return torch.empty(shape, dtype=torch_dtype)
        flat = torch.frombuffer(self._mmap, dtype=torch_dtype, count=count, offset=offset)
        return flat.as_strided(shape, tuple(strides))

    def unlink(self):
        if self._linked:
            self._linked = False
            _shm_call("shm_unlink", self.shm_name.encode())

    def close(self):
        """Unlinks the name and drops this object's reference to the mapping.
        The mapping is never closed explicitly: numpy views hold a reference
        to the mmap but not a buffer export, so an explicit munmap under a
        live view would crash. It is unmapped when the last view is gone."""
        self.unlink()
        self._mmap = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: best effort
            pass


class SharedBuffer:
    """A shared-memory buffer registered with a client's session.

        with client.shared_buffer(1 << 20) as buf:
            acts = buf.numpy(np.float32, (B, S, C))
            ids = buf.torch(torch.int32, (B, R), offset=acts.nbytes)
            client.gather_tokens(acts, ids, out=...)   # by reference, zero-copy

    Arrays and tensors viewing the buffer are passed to ops by reference
    (buffer name + byte offset + strides), so outputs are written in place.
    """

    def __init__(self, client, region, name):
        self._client = client
        self.region = region
        self.name = name

    shm_name = property(lambda self: self.region.shm_name)
    nbytes = property(lambda self: self.region.size)
    address = property(lambda self: self.region.address)
    closed = property(lambda self: self.region.closed)

    def numpy(self, dtype, shape, offset=0, strides=None):
        return self.region.numpy(dtype, shape, offset, strides)

    def torch(self, dtype, shape, offset=0, strides=None):
        return self.region.torch(dtype, shape, offset, strides)

    def close(self):
        """Unregisters (if the session is still open) and unlinks.
        Idempotent. Raises the unregister error after cleaning up locally."""
        if self.region.closed:
            return
        try:
            self._client._unregister(self)
        finally:
            self.region.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "SharedBuffer(name=%r, shm_name=%r, nbytes=%d%s)" % (
            self.name, self.shm_name, self.nbytes, ", closed" if self.closed else "")
