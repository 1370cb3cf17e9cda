"""Automatic recovery: the server is SIGKILLed and a new one starts on the
same socket; the client re-opens its session and re-registers its buffers on
its own, and by-reference ops on the old views work again."""
import time

import numpy as np
import pytest

import tokensel
from conftest import Server, server_binary
from tokensel.v1 import tokensel_pb2 as pb


@pytest.fixture
def restartable():
    servers = [Server(server_binary())]
    yield servers
    for srv in servers:
        if srv.proc.poll() is None:
            srv.stop()
        srv.dir.cleanup()


def _until_reachable(call, timeout=30.0):
    """`call()`, retried while the channel still reports the old server gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except tokensel.UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_session_and_buffers_come_back_after_a_server_restart(restartable):
    first = restartable[0]
    B, S, C, R = 3, 17, 5, 7
    rng = np.random.default_rng(7)
    with tokensel.Client(first.target, lease_ttl=0.6, timeout=5.0) as client:
        buf = client.shared_buffer(1 << 14)
        other = client.shared_buffer(4096)
        acts = buf.numpy(np.float32, (B, S, C))
        ids = buf.numpy(np.int64, (B, R), offset=acts.nbytes)
        out = buf.numpy(np.float32, (B, R, C), offset=acts.nbytes + ids.nbytes)
        acts[:] = rng.standard_normal((B, S, C))
        ids[:] = np.sort(rng.permuted(np.tile(np.arange(S), (B, 1)), axis=1)[:, :R], axis=1)
        client.gather_tokens(acts, ids, out=out)
        np.testing.assert_array_equal(out, acts[np.arange(B)[:, None], ids])
        other.close()  # unregistered: must not come back
        old_session = client.session_id

        first.kill()
        with pytest.raises(tokensel.UnavailableError):
            client.call("ListBuffers", pb.ListBuffersRequest(), timeout=2.0)

        restartable.append(Server(server_binary(), replaces=first))
        assert client.wait_reopened(1, timeout=30.0), client.keepalive_error
        assert client.session_id != old_session
        assert [b.name for b in client.list_buffers()] == [buf.name]

        out[:] = 0
        acts[:] = rng.standard_normal((B, S, C))
        client.gather_tokens(acts, ids, out=out)  # by reference, re-registered buffer
        np.testing.assert_array_equal(out, acts[np.arange(B)[:, None], ids])
        buf.close()
        assert client.list_buffers() == []


def test_without_auto_reopen_the_session_stays_gone(restartable):
    first = restartable[0]
    with tokensel.Client(first.target, lease_ttl=0.3, timeout=5.0, auto_reopen=False) as client:
        first.kill()
        restartable.append(Server(server_binary(), replaces=first))
        with pytest.raises(tokensel.NotFoundError):
            _until_reachable(client.list_buffers)
        assert client.reopen_count == 0
        client.reopen()  # on demand
        assert client.reopen_count == 1
        assert client.list_buffers() == []
