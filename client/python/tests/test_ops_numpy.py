"""Operators on numpy arrays (inline and into `out`), and Execute: no torch needed."""
import numpy as np
import pytest

import tokensel

RNG_SEED = 20241122


def test_gather_numpy_advanced_indexing_and_out(client):
    rng = np.random.default_rng(RNG_SEED)
    act = rng.standard_normal((2, 9, 4)).astype(np.float64)[:, ::2]  # strided input [2,5,4]
    idx = np.array([[4, 0, 2], [1, 1, 3]], dtype=np.int64)
    want = act[np.arange(2)[:, None], idx]
    np.testing.assert_array_equal(client.gather_tokens(act, idx), want)
    out = np.zeros((2, 3, 4))
    assert client.gather_tokens(act, idx, out=out) is out
    np.testing.assert_array_equal(out, want)


def test_inline_output_dtype_follows_out(client):
    scores = np.arange(10, dtype=np.float32)[None]
    ids64 = np.zeros((1, 3), dtype=np.int64)
    client.topk_tokens(scores, 3, ids=ids64)
    np.testing.assert_array_equal(ids64, [[7, 8, 9]])
    assert client.topk_tokens(scores, 3).dtype == np.int32  # the op's default


def test_execute_runs_ops_in_one_round_trip(client):
    act = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
    idx = np.array([[5, 1], [0, 4]], dtype=np.int32)
    gathered, topk = client.execute([client.ops.gather_tokens(act, idx),
                                     client.ops.topk_tokens(act[:, :, 0], 2)])
    np.testing.assert_array_equal(gathered, act[np.arange(2)[:, None], idx])
    np.testing.assert_array_equal(topk, [[4, 5], [4, 5]])
    with pytest.raises(tokensel.InvalidArgumentError, match=r"ops\[1\] \(GatherTokens\)"):
        client.execute([client.ops.topk_tokens(act[:, :, 0], 2),
                        client.ops.gather_tokens(act, np.array([[6, 0], [0, 0]], np.int32))])
