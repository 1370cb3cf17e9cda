"""Fixtures: one real tokensel-server subprocess per test session.

The binary is $TOKENSEL_SERVER_BINARY (the ctest registration sets it to
$<TARGET_FILE:tokensel-server>). The server listens on a unix socket in a
temp directory, with metrics off and a per-run --shm_prefix.
"""
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time

import grpc
import numpy
import pytest

import tokensel
from tokensel.v1 import tokensel_pb2 as pb
from tokensel.v1 import tokensel_pb2_grpc as pb_grpc

try:
    import torch
except ImportError:  # the package works without it; its tests skip (see below)
    torch = None

# Skips and CI. Under CI=true (.ci/run sets it) a skipped test fails, as in
# the C++ suites (tests/testing/gtest_main.cc), unless it is marked `gpu` or
# TOKENSEL_TEST_MAY_SKIP=1: a missing dependency must not pass for green. A
# run without torch by design (.venv-client-newest, install-pyclient-ends.sh)
# says so with TOKENSEL_PYCLIENT_NO_TORCH=1 (its ctest entry sets it): its
# torch tests are deselected, not skipped, and torch missing anywhere else
# fails CI.
NO_TORCH = os.environ.get("TOKENSEL_PYCLIENT_NO_TORCH") == "1"
# The modules that import torch at the top (test_torch_*: tokensel.torch).
TORCH_MODULES = ["test_ops_torch.py", "test_ltd_reference.py", "test_torch_functions.py",
                 "test_torch_ltd.py", "test_torch_packed.py", "test_example_random_ltd_gpt.py"]
collect_ignore = TORCH_MODULES if NO_TORCH else []
TORCH_REASON = "torch is not installed (pip install 'tokensel[torch]')"


def requires_torch(test):
    """Marks a test `torch` (deselected by TOKENSEL_PYCLIENT_NO_TORCH=1) and
    skips it when torch is missing."""
    return pytest.mark.skipif(torch is None, reason=TORCH_REASON)(pytest.mark.torch(test))


def _skips_fail():
    return (os.environ.get("CI") == "true"
            and os.environ.get("TOKENSEL_TEST_MAY_SKIP") != "1")


def _skip_reason(report):
    if isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    return str(report.longrepr)


def _ci_failure(reason):
    return ("skipped under CI=true, where a skip is a failure unless the test is marked "
            "`gpu` (TOKENSEL_TEST_MAY_SKIP=1 allows it): %s" % reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: needs torch (deselected without it by design)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device (may skip in CI)")


def pytest_collection_modifyitems(config, items):
    if not NO_TORCH:
        return
    deselected = [item for item in items if item.get_closest_marker("torch") is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker("torch") is None]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and not hasattr(report, "wasxfail") and _skips_fail()
            and item.get_closest_marker("gpu") is None):
        report.outcome = "failed"
        report.longrepr = _ci_failure(_skip_reason(report))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module that skips itself (pytest.importorskip at import) under CI."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _skips_fail():
        report.outcome = "failed"
        report.longrepr = _ci_failure(_skip_reason(report))

STARTUP_TIMEOUT_S = 30.0
PR_SET_PDEATHSIG = 1


def pytest_report_header(config):
    """Which end of the supported range this run is (install-pyclient-ends.sh)."""
    from google.protobuf import __version__ as protobuf_version
    from google.protobuf.internal import api_implementation
    return "tokensel %s: grpcio %s, protobuf %s (%s), numpy %s, torch %s" % (
        tokensel.__version__, grpc.__version__, protobuf_version, api_implementation.Type(),
        numpy.__version__, torch.__version__ if torch else "absent")


def _die_with_parent():
    """Child side of Popen: SIGKILL the server if pytest dies (even by a crash)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# The server gets PR_SET_PDEATHSIG from util-linux's setpriv where there is one,
# not from a preexec_fn: a preexec_fn makes subprocess fork() (not vfork) this
# multi-threaded process, which runs grpcio's fork handlers while keep-alive
# threads are inside gRPC (seen to hang the suite once in ~20 runs) and calls
# dlopen in the child, whose locks another thread may have held at the fork.
_SETPRIV = shutil.which("setpriv")


def _spawn_dying_with_parent(argv, **kwargs):
    if _SETPRIV:
        return subprocess.Popen([_SETPRIV, "--pdeathsig", "KILL", "--", *argv], **kwargs)
    return subprocess.Popen(argv, preexec_fn=_die_with_parent, **kwargs)


class Server:
    def __init__(self, binary, extra_args=(), *, replaces=None):
        """`replaces`: a dead Server whose socket path and shm prefix to reuse
        (a restart as clients see it)."""
        self.dir = tempfile.TemporaryDirectory(prefix="tokensel-py-")
        if replaces is None:
            self.target = "unix://%s/tokensel.sock" % self.dir.name
            self.shm_prefix = "/tokensel-pytest-%d-%d-" % (os.getpid(), id(self) % 100000)
        else:
            self.target, self.shm_prefix = replaces.target, replaces.shm_prefix
        self.log_path = os.path.join(self.dir.name, "server.log")
        self._log = open(self.log_path, "wb")
        self.proc = _spawn_dying_with_parent(
            [binary, "--listen=" + self.target, "--metrics_address=", "--threads=2",
             "--shm_prefix=" + self.shm_prefix, *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_serving()

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def _wait_serving(self):
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("tokensel-server exited with %d:\n%s"
                                   % (self.proc.returncode, self.log()))
            # A fresh channel with its own subchannel per attempt: one that
            # failed to connect keeps failing for its reconnect backoff, ~5 s
            # on grpcio 1.51 whatever the backoff options say.
            options = [("grpc.use_local_subchannel_pool", 1)]
            with grpc.insecure_channel(self.target, options=options) as channel:
                try:
                    pb_grpc.TokenSelectStub(channel).Ping(pb.PingRequest(), timeout=1.0)
                    return
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("tokensel-server not serving after %.0f s:\n%s"
                                   % (STARTUP_TIMEOUT_S, self.log()))
            time.sleep(0.05)

    def kill(self):
        """SIGKILL (no cleanup: the socket file stays) and reap."""
        self.proc.kill()
        self.proc.wait()
        self._log.close()

    def stop(self):
        """SIGTERM, then the exit code (SIGKILL after 15 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def server_binary():
    binary = os.environ.get("TOKENSEL_SERVER_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail("set TOKENSEL_SERVER_BINARY to a built tokensel-server (got %r)" % binary,
                    pytrace=False)
    return binary


@pytest.fixture(scope="session")
def server():
    srv = Server(server_binary())
    yield srv
    code = srv.stop()
    assert code == 0, "tokensel-server exited with %s:\n%s" % (code, srv.log())
    srv.dir.cleanup()


@pytest.fixture
def client(server):
    with tokensel.Client(server.target, client_name="pytest") as c:
        yield c


def shm_path(shm_name):
    return "/dev/shm/" + shm_name.lstrip("/")
