"""dtype mapping between numpy / torch and tokensel.v1.DType.

numpy has no bfloat16 and no float8: those travel only as torch tensors
(float8 only with a torch that has the float8 dtypes). An inline result of
such a dtype is returned as a torch tensor.
"""
import numpy as np

from tokensel.v1 import tokensel_pb2 as pb

_NUMPY = {
    np.dtype(np.bool_): pb.DTYPE_BOOL,
    np.dtype(np.int8): pb.DTYPE_INT8,
    np.dtype(np.uint8): pb.DTYPE_UINT8,
    np.dtype(np.float16): pb.DTYPE_FLOAT16,
    np.dtype(np.int16): pb.DTYPE_INT16,
    np.dtype(np.float32): pb.DTYPE_FLOAT32,
    np.dtype(np.int32): pb.DTYPE_INT32,
    np.dtype(np.float64): pb.DTYPE_FLOAT64,
    np.dtype(np.int64): pb.DTYPE_INT64,
}
_NUMPY_BY_PROTO = {v: k for k, v in _NUMPY.items()}

# Same-size integer type used to carry the raw bytes of a torch-only dtype.
_CARRIER = {1: np.dtype(np.uint8), 2: np.dtype(np.int16)}

_ITEMSIZE = {pb.DTYPE_FLOAT8_E4M3FN: 1, pb.DTYPE_FLOAT8_E5M2: 1, pb.DTYPE_BFLOAT16: 2}
_ITEMSIZE.update({v: k.itemsize for k, v in _NUMPY.items()})


def itemsize(dtype):
    """Bytes per element of a proto DType."""
    try:
        return _ITEMSIZE[dtype]
    except KeyError:
        raise TypeError("unsupported tokensel dtype %r" % dtype) from None


def from_numpy(dtype):
    """proto DType of a numpy dtype; TypeError for unsupported ones."""
    dtype = np.dtype(dtype)
    if dtype.byteorder == ">":
        raise TypeError("big-endian dtype %s: tokensel tensors are little-endian" % dtype)
    try:
        return _NUMPY[dtype.newbyteorder("=")]
    except KeyError:
        raise TypeError("dtype %s has no tokensel equivalent" % dtype) from None


def to_numpy(dtype):
    """numpy dtype of a proto DType, or None for torch-only dtypes."""
    return _NUMPY_BY_PROTO.get(dtype)


def carrier(dtype):
    """numpy dtype holding the raw bytes of any proto DType (uint8/int16 for
    the torch-only ones)."""
    np_dtype = to_numpy(dtype)
    return np_dtype if np_dtype is not None else _CARRIER[itemsize(dtype)]


def _torch_table(torch):
    table = {
        torch.bool: pb.DTYPE_BOOL, torch.int8: pb.DTYPE_INT8, torch.uint8: pb.DTYPE_UINT8,
        torch.float16: pb.DTYPE_FLOAT16, torch.bfloat16: pb.DTYPE_BFLOAT16,
        torch.int16: pb.DTYPE_INT16, torch.float32: pb.DTYPE_FLOAT32,
        torch.int32: pb.DTYPE_INT32, torch.float64: pb.DTYPE_FLOAT64,
        torch.int64: pb.DTYPE_INT64,
    }
    for name, proto in (("float8_e4m3fn", pb.DTYPE_FLOAT8_E4M3FN),
                        ("float8_e5m2", pb.DTYPE_FLOAT8_E5M2)):
        if hasattr(torch, name):
            table[getattr(torch, name)] = proto
    return table


def from_torch(dtype):
    """proto DType of a torch dtype; TypeError for unsupported ones."""
    import torch
    try:
        return _torch_table(torch)[dtype]
    except KeyError:
        raise TypeError("torch dtype %s has no tokensel equivalent" % dtype) from None


def to_torch(dtype):
    """torch dtype of a proto DType; TypeError if this torch lacks it."""
    import torch
    for t, p in _torch_table(torch).items():
        if p == dtype:
            return t
    raise TypeError("tokensel dtype %s is not available in torch %s"
                    % (pb.DType.Name(dtype), torch.__version__))


def parse(dtype):
    """proto DType from a numpy dtype (or anything np.dtype accepts), a torch
    dtype, a proto enum value or its name ("DTYPE_BFLOAT16" / "bfloat16")."""
    if isinstance(dtype, str):
        name = dtype.upper()
        name = name if name.startswith("DTYPE_") else "DTYPE_" + name
        if name in pb.DType.keys() and name != "DTYPE_UNSPECIFIED":
            return pb.DType.Value(name)
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in _ITEMSIZE:
            return dtype
        raise TypeError("unsupported tokensel dtype %r" % dtype)
    if type(dtype).__module__ == "torch":
        return from_torch(dtype)
    return from_numpy(dtype)
