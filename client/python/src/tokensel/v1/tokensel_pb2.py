"""The tokensel.v1 message classes and enums, made at import by the protobuf
runtime in use from the serialized tokensel.proto (tokensel_descriptor.bin,
which the package build writes with protoc; see setup.py).

The module has the names protoc's gencode would give it (`PingRequest`,
`DType`, `DTYPE_FLOAT32`, `DESCRIPTOR`, ...) and does what that gencode does
at import, minus the version gate: protobuf >= 5.26 gencode refuses runtimes
older than its own version (and, at 7.x, older majors), so gencode from one
grpcio-tools cannot serve both protobuf 3.20 and 7.x. The two builder calls
below are the ones every gencode since protobuf 3.20 makes, which is why the
module loads on 3.20 through 7.x (client/python/README.md, "Versions").
"""
import pkgutil

from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf.internal import builder as _builder

_SERIALIZED = pkgutil.get_data(__name__.rpartition(".")[0], "tokensel_descriptor.bin")
if _SERIALIZED is None:  # pragma: no cover (a loader without get_data)
    raise ImportError("tokensel: cannot read tokensel/v1/tokensel_descriptor.bin")

DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(_SERIALIZED)
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, globals())
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, __name__, globals())
