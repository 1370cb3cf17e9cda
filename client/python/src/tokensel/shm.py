"""Shared memory for tokensel buffers.

`ShmRegion` owns one anonymous memfd (memfd_create, sized with ftruncate and
fallocate, then sealed against shrinking and growing, so the server's mapping
can never lose pages and nobody else can open it) and hands out numpy / torch
views of it. It keeps the descriptor: registration hands it to the server over
the fd channel (fd_channel.py), also again after a session re-open.
`SharedBuffer` is a region registered with a session; `Client.shared_buffer()`
creates one. Closing a SharedBuffer unregisters it and closes the descriptor;
the mapping goes away with the last view of it.
"""
import ctypes
import fcntl
import itertools
import mmap
import os

import numpy as np

from tokensel import dtypes

_counter = itertools.count()


def unique_label(tag="py"):
    """"<tag>-<pid>-<n>": a label for /proc/<pid>/fd listings."""
    return "%s-%d-%d" % (tag, os.getpid(), next(_counter))


class ShmRegion:
    """A new sealed memfd of `size` bytes (> 0), mapped read-write. Not
    thread-safe; close() is idempotent."""

    def __init__(self, label, size):
        if size <= 0:
            raise ValueError("shared buffer size must be > 0, got %d" % size)
        self.shm_name = "memfd:tokensel-" + label
        self.size = size
        fd = os.memfd_create("tokensel-" + label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            try:  # the pages are charged to this process, not to the server
                os.posix_fallocate(fd, 0, size)
            except OSError as err:
                if err.errno not in (95,):  # EOPNOTSUPP: left to first touch
                    raise
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._mmap = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        anchor = ctypes.c_char.from_buffer(self._mmap)
        self.address = ctypes.addressof(anchor)
        del anchor

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

    def close(self):
        """Closes the descriptor and drops this object's reference to the
        mapping. The mapping is never closed explicitly: numpy views hold a
        reference to the mmap but not a buffer export, so an explicit munmap
        under a live view would crash. It is unmapped when the last view is
        gone."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
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
        """Unregisters (if the session is still open) and releases the memory.
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
