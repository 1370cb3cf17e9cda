"""Build hook: serializes tokensel.proto's descriptor with grpc_tools' protoc
into tokensel/v1/tokensel_descriptor.bin, from which tokensel_pb2.py and
tokensel_pb2_grpc.py make the messages and the stub at import.

No protoc-generated Python is shipped: its version gates would tie the wheel
to the protobuf and grpcio of the grpcio-tools that built it, while a
FileDescriptorProto reads the same with every runtime (README.md, "Versions").
So any grpcio-tools will do here, including the newest (wheels for the newest
Pythons).

The .proto is taken from the repository (../../proto, when building from a
checkout) or from proto/ inside this directory (an sdist, which the sdist
command below fills). The descriptor is written into the build tree only, so
the installed package never needs the repository layout.
"""
import atexit
import os
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROTO_REL = os.path.join("tokensel", "v1", "tokensel.proto")
_PROTO_ROOTS = (
    os.path.join(_HERE, "proto"),  # sdist
    os.path.join(_HERE, "..", "..", "proto"),  # repository checkout
)


def _proto_root():
    for root in _PROTO_ROOTS:
        if os.path.isfile(os.path.join(root, _PROTO_REL)):
            return os.path.normpath(root)
    raise RuntimeError(
        "tokensel.proto not found in %s" % ", ".join(os.path.normpath(r) for r in _PROTO_ROOTS))


class BuildPyWithDescriptor(build_py):
    def run(self):
        super().run()
        import grpc_tools  # build requirement (pyproject.toml)
        from google.protobuf import descriptor_pb2  # grpcio-tools depends on protobuf
        from grpc_tools import protoc

        root = _proto_root()
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        out = os.path.join(self.build_lib, "tokensel", "v1")
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            fds = os.path.join(tmp, "tokensel.fds")
            args = ["grpc_tools.protoc", "-I" + root, "-I" + well_known,
                    "--descriptor_set_out=" + fds, os.path.join(root, _PROTO_REL)]
            if protoc.main(args) != 0:
                raise RuntimeError("grpc_tools.protoc failed: %s" % " ".join(args))
            with open(fds, "rb") as f:
                files = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file
        # tokensel_pb2.py adds this one file to the pool: an import in the
        # .proto would need its module imported first, as gencode does.
        if len(files) != 1 or files[0].dependency:
            raise RuntimeError("%s: expected one file without imports, got %s"
                               % (_PROTO_REL, [(f.name, list(f.dependency)) for f in files]))
        with open(os.path.join(out, "tokensel_descriptor.bin"), "wb") as f:
            f.write(files[0].SerializeToString())
        # The .proto travels with the package (for reflection-less tools).
        shutil.copy(os.path.join(root, _PROTO_REL), out)


class SdistWithProto(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = os.path.join(base_dir, "proto", "tokensel", "v1")
        os.makedirs(dest, exist_ok=True)
        shutil.copy(os.path.join(_proto_root(), _PROTO_REL), dest)


# Build products go to a temp dir, not into the source tree (pip builds in
# place).
_BUILD_DIR = tempfile.mkdtemp(prefix="tokensel-build-")
atexit.register(shutil.rmtree, _BUILD_DIR, True)
setup(cmdclass={"build_py": BuildPyWithDescriptor, "sdist": SdistWithProto},
      options={"build": {"build_base": _BUILD_DIR}, "egg_info": {"egg_base": _BUILD_DIR}})
