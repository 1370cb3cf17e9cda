"""merge_tokens / split_tokens (docs/ops.md sections 9-10) against numpy's
fancy indexing: inline, into `out` arrays, in place in a registered buffer,
both layouts, errors, and the round trip the autograd pair relies on."""
import numpy as np
import pytest

import tokensel

RNG_SEED = 20261127


def _case(rng, b, s, r, c, dtype=np.float32):
    x = rng.standard_normal((b, s, c)).astype(dtype)
    layer = rng.standard_normal((b, r, c)).astype(dtype)
    idx = np.stack([rng.choice(s, size=r, replace=False) for _ in range(b)]).astype(np.int64)
    return x, layer, idx.reshape(b, r)


def _merge_ref(x, layer, idx):
    out = x.copy()
    out[np.arange(x.shape[0])[:, None], idx] = layer
    return out


def _split_ref(grad, idx):
    rows = np.arange(grad.shape[0])[:, None]
    rest = grad.copy()
    rest[rows, idx] = 0
    return grad[rows, idx], rest


def test_spec_vectors(client):
    x = np.array([[[10 * s, 10 * s + 1] for s in range(5)]], np.float32)
    layer = np.array([[[100, 101], [200, 201]]], np.float32)
    idx = np.array([[1, 3]], np.int32)
    np.testing.assert_array_equal(
        client.merge_tokens(x, layer, idx),
        [[[0, 1], [100, 101], [20, 21], [200, 201], [40, 41]]])
    grad = np.arange(1, 6, dtype=np.float32).reshape(1, 5, 1)
    layer_grad, rest = client.split_tokens(grad, np.array([[0, 2]], np.int64))
    np.testing.assert_array_equal(layer_grad, [[[1], [3]]])
    np.testing.assert_array_equal(rest, [[[0], [2], [0], [4], [5]]])


@pytest.mark.parametrize("b,s,r,c", [(1, 1, 1, 1), (2, 9, 4, 3), (3, 17, 0, 5), (2, 64, 64, 2),
                                     (4, 300, 133, 7)])
def test_random_both_layouts(client, b, s, r, c):
    rng = np.random.default_rng(RNG_SEED + b * 1000 + s)
    x, layer, idx = _case(rng, b, s, r, c, np.float64)
    want = _merge_ref(x, layer, idx)
    np.testing.assert_array_equal(client.merge_tokens(x, layer, idx), want)
    seq_first = client.merge_tokens(x.transpose(1, 0, 2), layer.transpose(1, 0, 2), idx,
                                    batch_first=False)
    np.testing.assert_array_equal(seq_first, want.transpose(1, 0, 2))
    want_layer, want_rest = _split_ref(x, idx)
    got = client.split_tokens(x, idx)
    np.testing.assert_array_equal(got.layer_grad, want_layer)
    np.testing.assert_array_equal(got.rest_grad, want_rest)
    got = client.split_tokens(x.transpose(1, 0, 2), idx, batch_first=False)
    np.testing.assert_array_equal(got.layer_grad, want_layer.transpose(1, 0, 2))
    np.testing.assert_array_equal(got.rest_grad, want_rest.transpose(1, 0, 2))


def test_zeroed_rows_are_positive_zero_bytes(client):
    grad = np.full((1, 4, 3), -0.0, np.float32)
    grad[0, 1] = np.nan
    _, rest = client.split_tokens(grad, np.array([[1, 2]], np.int32))
    assert rest.view(np.uint32)[0, 1:3].tolist() == [[0, 0, 0], [0, 0, 0]]
    assert rest.view(np.uint32)[0, 0].tolist() == [0x80000000] * 3  # -0 copied bit for bit


def test_in_place_in_a_registered_buffer(client):
    rng = np.random.default_rng(RNG_SEED)
    with client.shared_buffer(1 << 16) as buf:
        x = buf.numpy(np.float32, (2, 16, 8))
        x[...] = rng.standard_normal(x.shape)
        layer = rng.standard_normal((2, 5, 8)).astype(np.float32)
        idx = np.stack([rng.choice(16, 5, replace=False) for _ in range(2)])
        want = _merge_ref(x, layer, idx)
        assert client.merge_tokens(x, layer, idx, out=x) is x
        np.testing.assert_array_equal(x, want)

        layer_grad = buf.numpy(np.float32, (2, 5, 8), offset=x.nbytes)
        want_layer, want_rest = _split_ref(x, idx)
        got = client.split_tokens(x, idx, layer_grad=layer_grad, rest_grad=x)
        assert got.layer_grad is layer_grad and got.rest_grad is x
        np.testing.assert_array_equal(layer_grad, want_layer)
        np.testing.assert_array_equal(x, want_rest)


def test_round_trip_is_bit_exact(client):
    rng = np.random.default_rng(RNG_SEED)
    x, _, idx = _case(rng, 3, 40, 17, 6, np.float16)
    part = client.gather_tokens(x, idx)
    merged = client.merge_tokens(x, part, idx)
    assert merged.tobytes() == x.tobytes()
    layer_grad, rest = client.split_tokens(merged, idx)
    assert client.scatter_tokens(rest, layer_grad, idx).tobytes() == x.tobytes()


def test_errors_name_the_index_and_write_nothing(client):
    rng = np.random.default_rng(RNG_SEED)
    x, layer, idx = _case(rng, 2, 9, 3, 2)
    idx[1, 2] = idx[1, 0]
    out = np.full_like(x, 7.0)
    with pytest.raises(tokensel.InvalidArgumentError,
                       match=r"indices\[1,2\] = \d+ duplicates indices\[1,0\]"):
        client.merge_tokens(x, layer, idx, out=out)
    assert (out == 7.0).all()
    idx[1, 2] = 9
    with pytest.raises(tokensel.InvalidArgumentError, match=r"indices\[1,2\] = 9 is out of range"):
        client.split_tokens(x, idx)
    idx[1, 2] = next(v for v in range(9) if v not in idx[1, :2])
    with pytest.raises(tokensel.InvalidArgumentError, match="out"):
        client.merge_tokens(x, layer, idx, out=np.zeros((2, 8, 2), np.float32))
