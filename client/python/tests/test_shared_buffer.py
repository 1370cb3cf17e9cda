"""SharedBuffer: by-reference ops on shared-memory views, registration lifecycle."""
import os

import numpy as np
import pytest

import tokensel
from conftest import requires_torch, torch


def test_views_are_passed_by_reference_and_written_in_place(client, server):
    B, S, C, R = 2, 16, 6, 5
    with client.shared_buffer(1 << 16) as buf:
        # A sealed memfd, handed to the server by descriptor: no name anyone
        # else could open, and it cannot shrink under the server.
        assert buf.shm_name.startswith("memfd:")
        assert os.path.exists("/proc/self/fd/%d" % buf.region.fd)
        assert {b.name: b.sealed for b in client.list_buffers()}[buf.name]
        acts = buf.numpy(np.float32, (B, S, C))
        ids = buf.numpy(np.int32, (B, R), offset=acts.nbytes)
        part = buf.numpy(np.float32, (B, R, C), offset=acts.nbytes + ids.nbytes)
        rng = np.random.default_rng(1)
        acts[:] = rng.standard_normal((B, S, C))
        sample = client.sample_tokens(1, B, S, R, seed=3, step=0, ids=ids[None])
        assert sample.ids.base is not None and np.shares_memory(sample.ids, ids)
        want_ids = client.sample_tokens(1, B, S, R, seed=3, step=0).ids[0]
        np.testing.assert_array_equal(ids, want_ids)  # written by the server
        assert client.gather_tokens(acts, ids, out=part) is part
        np.testing.assert_array_equal(part, acts[np.arange(B)[:, None], ids])
        part *= -1
        client.scatter_tokens(acts, part, ids)
        np.testing.assert_array_equal(acts[np.arange(B)[:, None], ids], part)
        names = [b.name for b in client.list_buffers()]
        assert names == [buf.name]
    assert client.list_buffers() == []
    assert buf.region.fd == -1  # the memfd was closed


def test_strided_views_by_reference(client):
    with client.shared_buffer(1 << 16) as buf:
        padded = buf.numpy(np.float64, (3, 10, 7))  # view [3, 10, 4] of a padded layout
        padded[:] = np.arange(padded.size).reshape(padded.shape)
        acts = padded[:, :, 1:5]
        idx = buf.numpy(np.int64, (3, 4), offset=padded.nbytes)
        idx[:] = [[9, 0, 3, 3], [1, 2, 3, 4], [0, 9, 8, 7]]
        got = client.gather_tokens(acts, idx)
        np.testing.assert_array_equal(got, acts[np.arange(3)[:, None], idx])
        req = client.ops.gather_tokens(acts, idx).request
        assert req.activations.WhichOneof("data") == "buffer"
        assert list(req.activations.strides) == [70, 7, 1]
        assert req.activations.buffer.byte_offset == 8
        assert req.indices.buffer.byte_offset == padded.nbytes


@requires_torch
def test_torch_views_bf16_by_reference(client):
    B, S, C, R = 2, 8, 4, 3
    with client.shared_buffer(4096) as buf:
        hidden = buf.torch(torch.bfloat16, (B, S, C))
        hidden.copy_(torch.randn(B, S, C))
        layer = buf.torch(torch.bfloat16, (B, R, C), offset=hidden.numel() * 2)
        idx = buf.torch(torch.int64, (B, R), offset=1024)
        idx.copy_(torch.tensor([[0, 3, 7], [1, 2, 5]]))
        client.gather_tokens(hidden, idx, out=layer)
        assert torch.equal(layer, torch.stack([hidden[b].index_select(0, idx[b]) for b in range(B)]))
        want = hidden.clone()
        update = torch.randn(B, R, C).to(torch.bfloat16)
        for b in range(B):
            want[b].index_copy_(0, idx[b], update[b])
        layer.copy_(update)
        client.scatter_tokens(hidden, layer, idx)
        assert torch.equal(hidden, want)
        ids = buf.torch(torch.int32, (B, R), offset=2048)
        ids.copy_(torch.tensor([[7, 1, 4], [5, 0, 2]]))
        assert client.sort_tokens(ids, S).ids is ids  # by reference, in place
        assert ids.tolist() == [[1, 4, 7], [0, 2, 5]]


def test_view_bounds_and_close_semantics(client):
    buf = client.shared_buffer(64, name="small")
    with pytest.raises(ValueError, match="outside"):
        buf.numpy(np.float32, (17,))
    view = buf.numpy(np.uint8, (64,))
    view[:] = 7
    buf.close()
    buf.close()  # idempotent
    assert view.sum() == 7 * 64  # a live view keeps the mapping
    assert buf.region.fd == -1
    with pytest.raises(ValueError, match="closed"):
        buf.numpy(np.uint8, (1,))
    # No longer registered: the view now goes inline.
    assert client.gather_tokens(view.reshape(1, 64, 1), [[0]]).tolist() == [[[7]]]


def test_client_close_releases_buffers(server):
    client = tokensel.Client(server.target)
    buf = client.shared_buffer(128)
    client.close()
    assert buf.closed and buf.region.fd == -1
    with pytest.raises(tokensel.FailedPreconditionError, match="closed"):
        client.list_buffers()
    client.close()  # idempotent
