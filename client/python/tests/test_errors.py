"""Errors come back as TokenselError subclasses with the gRPC code."""
import os
import sys
import time

import grpc
import numpy as np
import pytest

import tokensel
from conftest import requires_torch, torch
from tokensel import fd_channel
from tokensel import cuda_ipc
from tokensel.v1 import tokensel_pb2 as pb


def test_bad_index_is_invalid_argument_naming_the_field(client):
    act = np.zeros((2, 5, 3), dtype=np.float32)
    with pytest.raises(tokensel.InvalidArgumentError) as info:
        client.gather_tokens(act, np.array([[0, 1], [7, 0]], dtype=np.int32))
    err = info.value
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "indices[1,0] = 7 is out of range [0, 5)" in err.message
    assert isinstance(err, tokensel.TokenselError)


def test_duplicate_scatter_indices(client):
    with pytest.raises(tokensel.InvalidArgumentError, match=r"indices\[0,1\]"):
        client.scatter_tokens(np.zeros((1, 4, 2)), np.ones((1, 2, 2)), [[3, 3]])


def test_unknown_buffer_is_not_found(client):
    prepared = client.ops.gather_tokens(np.zeros((1, 4, 2), np.float32), [[0]])
    prepared.request.activations.buffer.buffer = "no-such-buffer"
    prepared.request.activations.buffer.byte_offset = 0
    with pytest.raises(tokensel.NotFoundError, match="no-such-buffer") as info:
        client.run(prepared)
    assert info.value.code == grpc.StatusCode.NOT_FOUND


def test_registration_by_name_is_permission_denied(client):
    # The server never opens an object with its own rights.
    request = pb.RegisterBufferRequest(
        name="evil", host_shm=pb.HostShm(shm_name="/tokensel-anything", size=64))
    with pytest.raises(tokensel.PermissionDeniedError, match="registration by name") as info:
        client.call("RegisterBuffer", request)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_a_descriptor_that_is_not_memory_is_refused_on_the_fd_channel(client):
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(tokensel.InvalidArgumentError, match="a pipe cannot be registered"):
            fd_channel.send_fd(client.fd_channel, client.session_id, read_end)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_tcp_client_cannot_register_shared_memory():
    with pytest.raises(tokensel.FailedPreconditionError, match="not a unix socket"):
        fd_channel.send_fd(fd_channel.channel_path("127.0.0.1:50051"), "s", 0)


def test_duplicate_buffer_name_cleans_up(client):
    with client.shared_buffer(64, name="dup"):
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(tokensel.AlreadyExistsError):
            client.shared_buffer(64, name="dup")
        assert set(os.listdir("/proc/self/fd")) == before  # the second memfd was closed


def test_bad_dtype_is_caught_client_side(client):
    with pytest.raises(TypeError, match="complex"):
        client.topk_tokens(np.zeros((1, 4), np.complex64), 1)
    with pytest.raises(TypeError, match="out: an output must be"):
        client.gather_tokens(np.zeros((1, 2, 1)), [[0]], out=[[0.0]])


@requires_torch
def test_bad_device_is_caught_client_side(client):
    with pytest.raises(tokensel.FailedPreconditionError, match="meta"):
        client.topk_tokens(torch.empty((1, 4), device="meta"), 1)


@requires_torch
def test_cuda_without_bindings_or_gpu_is_a_clean_error(client, monkeypatch):
    t = torch.zeros(4)
    # Without cuda-bindings (hidden, so the check runs where they are installed too).
    for module in ("cuda", "cuda.bindings", "cuda.bindings.driver", "cuda.cuda"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(tokensel.CudaUnavailableError) as info:
        client.register_cuda(t)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "cuda-bindings" in info.value.message
    # With the bindings present but no device (this machine; hidden on a GPU machine): still clean.
    monkeypatch.setattr(cuda_ipc, "driver", lambda: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(tokensel.CudaUnavailableError, match="CUDA device"):
        client.register_cuda(t)
    assert client.list_buffers() == []


def test_expired_session_is_not_found_and_keepalive_prevents_it(server):
    with tokensel.Client(server.target, lease_ttl=1.0) as kept:
        lapsed = tokensel.Client(server.target, lease_ttl=1.0, keepalive=False)
        time.sleep(2.5)
        assert kept.list_buffers() == []  # renewed every 1/3 s
        with pytest.raises(tokensel.NotFoundError):
            lapsed.list_buffers()
        with pytest.raises(tokensel.NotFoundError):
            lapsed.close()  # CloseSession on an expired session
        assert kept.keepalive_error is None


def test_unreachable_server_is_unavailable(tmp_path):
    with pytest.raises(tokensel.UnavailableError):
        tokensel.Client("unix://%s/none.sock" % tmp_path, timeout=1.0)
