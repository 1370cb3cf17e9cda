"""Tensor encoding: numpy arrays / torch tensors <-> tokensel.v1.Tensor.

An array whose memory lies inside a buffer registered with the session (a
SharedBuffer view, or a CUDA tensor registered with Client.register_cuda) is
sent by reference: buffer name, byte offset and element strides. Anything
else is sent inline (row-major bytes). CUDA tensors are by reference only.

Outputs: `None` asks for the result inline (it is returned); an array inside a
registered buffer is written in place by the server; any other array gets the
inline result copied into it (so `out=` works for plain arrays too).

Every inline byte is counted in the client's TransferStats (`client.stats`):
what a caller staged because a tensor was not in registered memory.
"""
import threading

import numpy as np

from tokensel import dtypes
from tokensel.errors import FailedPreconditionError
from tokensel.v1 import tokensel_pb2 as pb


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


class _Layout:
    """dtype, shape, element strides, address and device of an array."""

    def __init__(self, x):
        if _is_torch(x):
            self.dtype = dtypes.from_torch(x.dtype)
            self.shape = tuple(x.shape)
            self.strides = tuple(x.stride())
            self.address = x.data_ptr()
            self.device = x.device.type if x.device.index is None else str(x.device)
            self.itemsize = x.element_size()
        else:
            self.dtype = dtypes.from_numpy(x.dtype)
            self.shape = x.shape
            self.itemsize = x.dtype.itemsize
            byte_strides = x.strides
            self.strides = (tuple(s // self.itemsize for s in byte_strides)
                            if all(s % self.itemsize == 0 for s in byte_strides) else None)
            self.address = x.__array_interface__["data"][0]
            self.device = "cpu"
        self.numel = int(np.prod(self.shape, dtype=np.int64))

    def extent(self):
        """Bytes from the first element to one past the last, or None when
        the layout cannot be expressed (negative or fractional strides)."""
        if self.strides is None or any(s < 0 for s in self.strides):
            return None
        if self.numel == 0:
            return 0
        return sum((d - 1) * s for d, s in zip(self.shape, self.strides)) * self.itemsize \
            + self.itemsize


def layout_of(x):
    """dtype/shape/strides/address/device of a numpy array or torch tensor."""
    return _Layout(x)


def as_array(x):
    """numpy arrays and torch tensors pass through; anything else goes
    through np.asarray (lists, scalars)."""
    if isinstance(x, np.ndarray) or _is_torch(x):
        return x
    return np.asarray(x)


def _inline_bytes(x):
    if _is_torch(x):
        t = x.detach().contiguous()
        if dtypes.to_numpy(dtypes.from_torch(t.dtype)) is None:  # bfloat16, float8
            import torch
            t = t.reshape(-1).view(torch.int16 if t.element_size() == 2 else torch.uint8)
        return t.numpy().tobytes()
    return np.ascontiguousarray(x).tobytes()


class TransferStats:
    """Client-side counts of how tensors travelled, since creation or the
    last reset(): `inline_bytes_sent` / `inline_tensors_sent` (inputs staged
    inline because they were not in registered memory), `inline_bytes_received`
    / `inline_tensors_received` (results returned inline), `by_reference`
    (inputs and outputs passed as buffer references). Thread-safe."""

    FIELDS = ("inline_bytes_sent", "inline_tensors_sent", "inline_bytes_received",
              "inline_tensors_received", "by_reference")

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self):
        with self._lock:
            for f in self.FIELDS:
                setattr(self, f, 0)

    def snapshot(self):
        """The counts as a dict."""
        with self._lock:
            return {f: getattr(self, f) for f in self.FIELDS}

    def _add(self, **counts):
        with self._lock:
            for f, n in counts.items():
                setattr(self, f, getattr(self, f) + n)

    def __repr__(self):
        return "TransferStats(%s)" % ", ".join("%s=%d" % kv for kv in self.snapshot().items())


class Codec:
    """Encodes one request's tensors; `find_region(address, extent, device)`
    returns (buffer_name, region_address) or None. Counts into `stats` (a
    TransferStats) when given."""

    def __init__(self, find_region, stats=None):
        self._find_region = find_region
        self.stats = stats if stats is not None else TransferStats()

    def _ref(self, layout, field):
        extent = layout.extent()
        if extent is None or extent == 0:
            return None
        found = self._find_region(layout.address, extent, layout.device)
        if found is None:
            if layout.device != "cpu":
                raise FailedPreconditionError(
                    "%s: a %s tensor must lie in a buffer registered with "
                    "Client.register_cuda (inline data is host memory)" % (field, layout.device))
            return None
        name, base = found
        t = pb.Tensor(dtype=layout.dtype, shape=layout.shape, strides=layout.strides)
        t.buffer.buffer = name
        t.buffer.byte_offset = layout.address - base
        self.stats._add(by_reference=1)
        return t

    def input(self, x, field):
        """A pb.Tensor for an input array (by reference when registered)."""
        x = as_array(x)
        layout = _Layout(x)
        ref = self._ref(layout, field)
        if ref is not None:
            return ref
        if layout.device != "cpu":  # zero-size device tensors land here
            raise FailedPreconditionError("%s: %s tensors are sent by reference only"
                                          % (field, layout.device))
        data = _inline_bytes(x)
        self.stats._add(inline_bytes_sent=len(data), inline_tensors_sent=1)
        return pb.Tensor(dtype=layout.dtype, shape=layout.shape, inline_data=data)

    def output(self, x, field):
        """(pb.Tensor, sink) for an output: `x` None asks for it inline; a
        registered array is written by reference (sink = x, nothing to copy);
        another array gets the inline result copied into it (sink = x)."""
        if x is None:
            return pb.Tensor(), None
        if not (isinstance(x, np.ndarray) or _is_torch(x)):
            raise TypeError("%s: an output must be a numpy array or a torch tensor, got %s"
                            % (field, type(x).__name__))
        layout = _Layout(x)
        ref = self._ref(layout, field)
        if ref is not None:
            return ref, _Sink(x, copy=False)
        return pb.Tensor(dtype=layout.dtype, shape=layout.shape), _Sink(x, copy=True)


class _Sink:
    def __init__(self, target, copy):
        self.target = target
        self.copy = copy

    def deliver(self, value):
        """Returns the user's array, holding `value` when it was inline."""
        if value is not None and self.copy:
            if _is_torch(self.target):
                import torch
                src = value if _is_torch(value) else torch.from_numpy(value)
                self.target.copy_(src.reshape(self.target.shape))
            else:
                np.copyto(self.target, np.asarray(value).reshape(self.target.shape))
        return self.target


def InPlace(target):  # noqa: N802 (reads as a type)
    """A sink that copies an inline result back into `target`."""
    return _Sink(target, copy=True)


def decode(tensor):
    """An inline pb.Tensor as a numpy array (a CPU torch tensor for the
    dtypes numpy lacks: bfloat16, float8)."""
    shape = tuple(tensor.shape)
    np_dtype = dtypes.to_numpy(tensor.dtype)
    if np_dtype is not None:
        return np.frombuffer(tensor.inline_data, dtype=np_dtype).reshape(shape).copy()
    import torch
    torch_dtype = dtypes.to_torch(tensor.dtype)
    raw = bytearray(tensor.inline_data)
    if not raw:
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(raw, dtype=torch_dtype).reshape(shape)
