"""Arena: shared-memory torch tensors, reused across training steps.

A tensor that lives in memory registered with the session travels to the
server by reference (buffer, offset, strides); any other tensor is staged
inline (serialized into the request, counted in `client.stats`). The arena
hands out CPU tensors carved from SharedBuffers it registers, so the
autograd functions of tokensel.torch can put every output and gradient they
make there, and copy in (locally, counted in `arena.stats`) the inputs torch
allocated elsewhere instead of staging them over the socket.

Reuse without bookkeeping by the caller: each slot is exported to torch
through its own numpy array, and torch.frombuffer keeps that array referenced
for as long as any tensor or view on the slot's storage is alive. A slot is
free again exactly when the array's reference count is back to the arena's
own, so a tensor kept across steps (a logged activation, a saved-for-backward
tensor, a view of either) is never handed out twice.
"""
import sys
import threading

import numpy as np
import torch

ALIGN = 64  # bytes; every slot starts on a cache line


def _round_up(n, align=ALIGN):
    return (n + align - 1) // align * align


class _Slot:
    __slots__ = ("exporter", "nbytes")

    def __init__(self, exporter, nbytes):
        self.exporter = exporter  # np.uint8 view of the slot; torch storages reference it
        self.nbytes = nbytes


class ArenaStats:
    """`chunks` / `reserved_bytes`: SharedBuffers registered and their size;
    `allocations` (new slots carved) and `reuses` (free slots handed out
    again); `copied_in_bytes` / `copied_in_tensors`: inputs that were not in
    registered memory, copied into the arena so they go by reference."""

    FIELDS = ("chunks", "reserved_bytes", "allocations", "reuses", "copied_in_bytes",
              "copied_in_tensors")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, 0)

    def snapshot(self):
        return {f: getattr(self, f) for f in self.FIELDS}

    def __repr__(self):
        return "ArenaStats(%s)" % ", ".join("%s=%d" % kv for kv in self.snapshot().items())


class Arena:
    """Shared-memory tensors of `client`'s session. `chunk_bytes`: size of
    each SharedBuffer registered (a larger request gets a chunk of its own).
    Thread-safe. close() (or the client's close) unregisters the chunks;
    tensors handed out stay readable (the mapping lives while they do) but no
    longer go by reference."""

    def __init__(self, client, chunk_bytes=32 << 20):
        self.client = client
        self.chunk_bytes = int(chunk_bytes)
        self.stats = ArenaStats()
        self._lock = threading.Lock()
        self._chunks = []
        self._slots = []
        self._bump = None  # (chunk, next offset)
        self._zeros = {}

    # ------------------------------------------------------------ slots --

    def _free_slot(self, nbytes):
        """Best-fit free slot of nbytes..2*nbytes, or None (lock held)."""
        best = None
        for slot in self._slots:
            # 2 = the slot's own reference + getrefcount's argument: no storage uses it.
            if nbytes <= slot.nbytes <= 2 * nbytes and sys.getrefcount(slot.exporter) == 2:
                if best is None or slot.nbytes < best.nbytes:
                    best = slot
        return best

    def _new_slot(self, nbytes):
        size = _round_up(nbytes)
        if self._bump is None or self._bump[1] + size > self._bump[0].nbytes:
            chunk = self.client.shared_buffer(max(self.chunk_bytes, size))
            self._chunks.append(chunk)
            self.stats.chunks += 1
            self.stats.reserved_bytes += chunk.nbytes
            self._bump = (chunk, 0)
        chunk, offset = self._bump
        self._bump = (chunk, offset + size)
        slot = _Slot(chunk.numpy(np.uint8, (size,), offset=offset), size)
        self._slots.append(slot)
        self.stats.allocations += 1
        return slot

    def empty(self, shape, dtype=torch.float32):
        """An uninitialized contiguous CPU tensor in registered memory (a
        plain torch.empty when it has no elements)."""
        shape = torch.Size(shape)
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = shape.numel() * elem
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            slot = self._free_slot(nbytes)
            if slot is None:
                slot = self._new_slot(nbytes)
            else:
                self.stats.reuses += 1
            return torch.frombuffer(slot.exporter, dtype=dtype, count=shape.numel()).view(shape)

    def zeros(self, shape, dtype=torch.float32):
        """A cached all-zero tensor of this shape and dtype in registered
        memory, shared by every caller: read it, never write it."""
        key = (tuple(shape), dtype)
        with self._lock:
            z = self._zeros.get(key)
        if z is None:
            z = self.empty(shape, dtype).zero_()
            with self._lock:
                z = self._zeros.setdefault(key, z)
        return z

    def contains(self, t):
        """Whether ops would pass `t` by reference (any registered buffer of
        the session counts, not only the arena's)."""
        return self.client.registered_buffer(t) is not None

    def copy_of(self, t):
        """A contiguous arena copy of CPU tensor `t` (not tracked by autograd);
        counted in stats.copied_in_*."""
        out = self.empty(t.shape, t.dtype)
        with torch.no_grad():
            out.copy_(t)
        with self._lock:
            self.stats.copied_in_bytes += out.numel() * out.element_size()
            self.stats.copied_in_tensors += 1
        return out

    def place(self, t):
        """`t` itself when it is in registered memory (or empty), else copy_of(t)."""
        if t.numel() == 0 or self.contains(t):
            return t
        return self.copy_of(t)

    def close(self):
        """Unregisters every chunk. Idempotent."""
        with self._lock:
            chunks, self._chunks, self._slots, self._bump = self._chunks, [], [], None
            self._zeros.clear()
        for chunk in chunks:
            chunk.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
