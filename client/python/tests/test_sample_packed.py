"""sample_packed_tokens (docs/ops.md section 11) against a numpy reference
written from the spec (the Philox keys recomputed here in Python): the spec
vectors, random packs, the fused gather, equal lengths = sample_tokens,
registered buffers with kept_tokens computed by the client, and errors."""
import numpy as np
import pytest

import tokensel

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def _philox(c, k):
    c = list(c)
    k0, k1 = k
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & MASK, p1 & MASK, ((p0 >> 32) ^ c[3] ^ k1) & MASK, p0 & MASK]
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return c


def _key(seed, step, l, b, s):
    out = _philox([s >> 1, b, l, step], [seed & MASK, seed >> 32])
    half = s & 1
    return (out[2 * half] << 32) | out[2 * half + 1]


def _keep(n, num, den, floor):
    return min(n, max(floor, (n * num + den - 1) // den))


def _reference(cu, total, num, den, floor, layers, seed, step):
    n_seq = len(cu) - 1
    kept = [0]
    for i in range(n_seq):
        kept.append(kept[-1] + _keep(cu[i + 1] - cu[i], num, den, floor))
    ids = np.zeros((layers, kept[-1]), np.int32)
    pos = np.zeros_like(ids)
    inv = np.full((layers, total), -1, np.int32)
    for l in range(layers):
        for i in range(n_seq):
            n = cu[i + 1] - cu[i]
            r = kept[i + 1] - kept[i]
            order = sorted(range(n), key=lambda s: (_key(seed, step, l, i, s), s))[:r]
            for k, s in enumerate(sorted(order)):
                ids[l, kept[i] + k] = cu[i] + s
                pos[l, kept[i] + k] = s
                inv[l, cu[i] + s] = kept[i] + k
    return np.array(kept, np.int32), ids, pos, inv


def test_spec_vector(client):
    cu = np.array([0, 3, 3, 8], np.int32)
    got = client.sample_packed_tokens(cu, 1, 2, min_tokens=1, layers=2, seed=7, step=1,
                                      total_tokens=8, positions=True, inverse=True)
    np.testing.assert_array_equal(got.cu_seqlens_kept, [0, 2, 2, 5])
    want = _reference([0, 3, 3, 8], 8, 1, 2, 1, 2, 7, 1)
    np.testing.assert_array_equal(got.ids, want[1])
    np.testing.assert_array_equal(got.positions, got.ids - np.array([0, 0, 3, 3, 3]))
    np.testing.assert_array_equal(got.inverse, want[3])
    assert got.out is None


def test_keep_all_and_keep_none(client):
    cu = np.array([0, 4, 4, 9], np.int32)
    got = client.sample_packed_tokens(cu, 1, 1, total_tokens=11, inverse=True)
    np.testing.assert_array_equal(got.ids, [np.arange(9)])
    np.testing.assert_array_equal(got.inverse, [list(range(9)) + [-1, -1]])
    got = client.sample_packed_tokens(cu, 0, 1, total_tokens=9)
    np.testing.assert_array_equal(got.cu_seqlens_kept, [0, 0, 0, 0])
    assert got.ids.shape == (1, 0)


@pytest.mark.parametrize("seed", range(6))
def test_random_packs_with_gather(client, seed):
    rng = np.random.default_rng(seed)
    n_seq = int(rng.integers(0, 12))
    cu = np.concatenate([[0], np.cumsum(rng.integers(0, 30, n_seq))]).astype(np.int32)
    total = int(cu[-1]) + int(rng.integers(0, 3))
    den = int(rng.integers(1, 8))
    num, floor = int(rng.integers(0, den + 1)), int(rng.integers(0, 3))
    acts = rng.standard_normal((total, 5)).astype(np.float32)
    got = client.sample_packed_tokens(cu, num, den, min_tokens=floor, seed=seed, step=3,
                                      activations=acts, positions=True, inverse=True, out=True)
    kept, ids, pos, inv = _reference([int(v) for v in cu], total, num, den, floor, 1, seed, 3)
    np.testing.assert_array_equal(got.cu_seqlens_kept, kept)
    np.testing.assert_array_equal(got.ids, ids)
    np.testing.assert_array_equal(got.positions, pos)
    np.testing.assert_array_equal(got.inverse, inv)
    np.testing.assert_array_equal(got.out, acts[ids[0]])
    assert tokensel.packed_kept_tokens(cu, num, den, floor) == kept[-1]


def test_equal_lengths_reproduce_sample_tokens(client):
    cu = np.arange(0, 5 * 40 + 1, 40, dtype=np.int32)
    packed = client.sample_packed_tokens(cu, 1, 4, layers=2, seed=11, step=2)
    sampled = client.sample_tokens(2, 5, 40, 10, 11, 2)
    np.testing.assert_array_equal(packed.ids.reshape(2, 5, 10), sampled.ids + cu[:-1, None])


def test_registered_buffers(client):
    cu = np.array([0, 6, 6, 20], np.int32)
    with client.shared_buffer(4096) as buf:
        view = buf.numpy(np.int32, (4,))
        view[:] = cu
        got = client.sample_packed_tokens(view, 1, 3, total_tokens=20, seed=1, step=0)
        want = _reference([0, 6, 6, 20], 20, 1, 3, 0, 1, 1, 0)
        np.testing.assert_array_equal(got.ids, want[1])
        np.testing.assert_array_equal(got.cu_seqlens_kept, want[0])


def test_errors_name_the_sequence(client):
    with pytest.raises(tokensel.InvalidArgumentError, match=r"decreasing at sequence i = 1"):
        client.sample_packed_tokens(np.array([0, 4, 2], np.int32), 1, 2, total_tokens=4)
    with pytest.raises(tokensel.InvalidArgumentError, match=r"cu_seqlens\[0\] is 1"):
        client.sample_packed_tokens(np.array([1, 3], np.int32), 1, 2, total_tokens=4)
    with pytest.raises(tokensel.InvalidArgumentError, match=r"past total_tokens T = 4"):
        client.sample_packed_tokens(np.array([0, 5], np.int32), 1, 2, total_tokens=4)
    with pytest.raises(tokensel.InvalidArgumentError, match=r"keep_num: 3"):
        client.sample_packed_tokens(np.array([0, 2], np.int32), 3, 2, total_tokens=4)
    with pytest.raises(tokensel.InvalidArgumentError, match=r"keep_den: 0"):
        client.sample_packed_tokens(np.array([0, 2], np.int32), 0, 0, total_tokens=4)
