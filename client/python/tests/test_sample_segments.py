"""SampleTokens properties and SegmentSeqlens against a naive Python loop."""
import numpy as np
import pytest


def test_sample_sorted_unique_in_range_deterministic(client):
    L, B, S, R = 3, 4, 100, 37
    a = client.sample_tokens(L, B, S, R, seed=1234, step=5).ids
    assert a.shape == (L, B, R) and a.dtype == np.int32
    assert ((a >= 0) & (a < S)).all()
    assert (np.diff(a, axis=-1) > 0).all()  # strictly ascending: sorted and unique
    again = client.sample_tokens(L, B, S, R, seed=1234, step=5).ids
    np.testing.assert_array_equal(a, again)  # same seed and step, same ids
    assert not np.array_equal(a, client.sample_tokens(L, B, S, R, seed=1234, step=6).ids)
    assert not np.array_equal(a, client.sample_tokens(L, B, S, R, seed=1235, step=5).ids)
    rows = {tuple(r) for r in a.reshape(-1, R)}
    assert len(rows) == L * B  # rows are independent draws
    ids64 = np.empty((L, B, R), dtype=np.int64)
    client.sample_tokens(L, B, S, R, seed=1234, step=5, ids=ids64)
    np.testing.assert_array_equal(ids64, a)
    assert client.sample_tokens(1, 2, 5, 5, seed=0, step=0).ids.tolist() == [[list(range(5))] * 2]


def test_sample_is_roughly_uniform(client):
    S, R, rows = 16, 4, 4000
    ids = client.sample_tokens(1, rows, S, R, seed=42, step=0).ids.reshape(-1)
    counts = np.bincount(ids, minlength=S)
    expected = rows * R / S  # 1000 per position
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)


def naive_seqlens(ids_row, NS):
    """Self-attention, one row: (seqlen [NS], offset [NS+1])."""
    seqlen = [0] * NS
    offset = []
    prev = 0
    for t, x in enumerate(ids_row):
        if x != 0:
            seqlen[x - 1] += 1
            if t == 0 or x != prev:
                offset.append(t)
        prev = x
    offset = (offset + [-1] * (NS + 1))[:NS + 1]
    return seqlen, offset


def naive_packed(ids, NS):
    B, T = ids.shape
    seqlens, offsets = [], []
    for b in range(B):
        sl, off = naive_seqlens(list(ids[b]), NS)
        seqlens += [s for s in sl if s != 0]
        offsets += [o + b * T for o in off if o != -1]
    seqlens += [0] * (B * NS - len(seqlens))
    offsets += [B * T] * (B * (NS + 1) - len(offsets))
    cu = [0] + list(np.cumsum(seqlens))
    return seqlens, offsets, cu


def random_segments(rng, B, T, NS):
    rows = []
    for _ in range(B):
        row, t, next_id = [], 0, 1
        while t < T:
            if rng.random() < 0.25:
                n = int(rng.integers(1, 4))
                row += [0] * n  # padding between segments
            elif next_id <= NS:
                n = int(rng.integers(1, 7))
                row += [next_id] * n
                next_id += int(rng.integers(1, 3))  # ids may skip
            else:
                row += [0]
            t = len(row)
        rows.append(row[:T])
    return np.array(rows, dtype=np.int32)


@pytest.mark.parametrize("spec_case", [
    ([1, 1, 1, 1], 1, [4], [0, -1]),
    ([1, 1, 1, 2, 2, 3, 3, 3, 3], 3, [3, 2, 4], [0, 3, 5, -1]),
    ([0, 0, 1, 1, 0, 2], 2, [2, 1], [2, 5, -1]),
    ([1, 1, 2], 4, [2, 1, 0, 0], [0, 2, -1, -1, -1]),
])
def test_segment_seqlens_spec_vectors(client, spec_case):
    ids, NS, seqlen, offset = spec_case
    got = client.segment_seqlens(np.array([ids], dtype=np.int64), NS)
    assert got["q_seqlen"].tolist() == [seqlen]
    assert got["q_offset"].tolist() == [offset]


@pytest.mark.parametrize("mask", ["padding", "causal", "causal_bottom_right"])
def test_segment_seqlens_matches_naive_loop(client, mask):
    rng = np.random.default_rng(5)
    B, T, NS = 5, 61, 9
    ids = random_segments(rng, B, T, NS)
    got = client.segment_seqlens(ids, NS, mask=mask, packed=True)
    assert set(got) == {"q_seqlen", "q_offset", "q_packed_seqlens", "q_packed_offsets",
                        "q_cu_seqlens"}
    for b in range(B):
        seqlen, offset = naive_seqlens(list(ids[b]), NS)
        assert got["q_seqlen"][b].tolist() == seqlen
        assert got["q_offset"][b].tolist() == offset
    seqlens, offsets, cu = naive_packed(ids, NS)
    assert got["q_packed_seqlens"].tolist() == seqlens
    assert got["q_packed_offsets"].tolist() == offsets
    assert got["q_cu_seqlens"].tolist() == cu
    out = np.empty((B, NS), dtype=np.int32)
    client.segment_seqlens(ids, NS, out={"q_seqlen": out})
    np.testing.assert_array_equal(out, got["q_seqlen"])
