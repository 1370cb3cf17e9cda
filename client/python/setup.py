"""Build hook: generates tokensel/v1/tokensel_pb2{,_grpc}.py with grpc_tools.

The .proto is taken from the repository (../../proto, when building from a
checkout) or from proto/ inside this directory (an sdist, which the sdist
command below fills). The stubs are written into the build tree only, so the
installed package never needs the repository layout.
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


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        import grpc_tools  # build requirement (pyproject.toml)
        from grpc_tools import protoc

        root = _proto_root()
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        out = self.build_lib
        os.makedirs(os.path.join(out, "tokensel", "v1"), exist_ok=True)
        args = ["grpc_tools.protoc", "-I" + root, "-I" + well_known,
                "--python_out=" + out, "--grpc_python_out=" + out,
                os.path.join(root, _PROTO_REL)]
        if protoc.main(args) != 0:
            raise RuntimeError("grpc_tools.protoc failed: %s" % " ".join(args))
        # The .proto travels with the package (for reflection-less tools).
        shutil.copy(os.path.join(root, _PROTO_REL), os.path.join(out, "tokensel", "v1"))


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
setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
      options={"build": {"build_base": _BUILD_DIR}, "egg_info": {"egg_base": _BUILD_DIR}})
