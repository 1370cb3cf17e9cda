"""tokensel.Stream (the pipelined Stream RPC) and slice_gpt_mask taking R from `out`.

Expected values are numpy's fancy indexing, never the client's own unary path."""
import concurrent.futures
import threading

import numpy as np
import pytest

import tokensel

RNG_SEED = 20261126


def _gather_reference(act, idx):
    return act[np.arange(act.shape[0])[:, None], idx]


def _random_case(rng, b, s, r, c):
    act = rng.standard_normal((b, s, c)).astype(np.float32)
    idx = np.stack([rng.choice(s, size=r, replace=False) for _ in range(b)]).astype(np.int32)
    return act, idx


@pytest.mark.parametrize("window", [1, 3, 16])
def test_pipelined_gathers_come_back_in_order(client, window):
    rng = np.random.default_rng(RNG_SEED + window)
    cases = [_random_case(rng, b, s, r, c)
             for b, s, r, c in [(1, 1, 1, 1), (2, 9, 4, 3), (3, 17, 0, 5)] * 20]
    with client.stream(window=window) as stream:
        futures = [stream.submit(client.ops.gather_tokens(a, i)) for a, i in cases]
        for (act, idx), future in zip(cases, futures):
            np.testing.assert_array_equal(future.result(timeout=60), _gather_reference(act, idx))


def test_map_and_run_match_the_reference(client):
    rng = np.random.default_rng(RNG_SEED)
    cases = [_random_case(rng, 2, 33, 7, 4) for _ in range(50)]
    with client.stream() as stream:
        got = stream.map(client.ops.gather_tokens(a, i) for a, i in cases)
        scores = rng.standard_normal((3, 11)).astype(np.float32)
        top = stream.run(client.ops.topk_tokens(scores, 4))
    for (act, idx), result in zip(cases, got):
        np.testing.assert_array_equal(result, _gather_reference(act, idx))
    want = np.sort(np.argsort(-scores, axis=1, kind="stable")[:, :4], axis=1)
    np.testing.assert_array_equal(top, want)


def test_an_error_fails_its_own_future_and_the_stream_goes_on(client):
    act = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
    good = np.array([[5, 1], [0, 4]], dtype=np.int32)
    bad = np.array([[6, 0], [0, 0]], dtype=np.int32)  # 6 is out of [0, 6)
    with client.stream(window=4) as stream:
        futures = [stream.submit(client.ops.gather_tokens(act, i)) for i in (good, bad, good)]
        np.testing.assert_array_equal(futures[0].result(timeout=60), _gather_reference(act, good))
        with pytest.raises(tokensel.InvalidArgumentError, match="indices"):
            futures[1].result(timeout=60)
        np.testing.assert_array_equal(futures[2].result(timeout=60), _gather_reference(act, good))


def test_submit_execute_runs_ops_in_order(client):
    act = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
    idx = np.array([[5, 1], [0, 4]], dtype=np.int32)
    with client.stream() as stream:
        gathered, top = stream.submit_execute(
            [client.ops.gather_tokens(act, idx), client.ops.topk_tokens(act[:, :, 0], 2)]
        ).result(timeout=60)
        failed = stream.submit_execute(
            [client.ops.topk_tokens(act[:, :, 0], 2),
             client.ops.gather_tokens(act, np.array([[6, 0], [0, 0]], np.int32))])
        with pytest.raises(tokensel.InvalidArgumentError, match=r"ops\[1\] \(GatherTokens\)"):
            failed.result(timeout=60)
    np.testing.assert_array_equal(gathered, _gather_reference(act, idx))
    np.testing.assert_array_equal(top, [[4, 5], [4, 5]])


def test_by_reference_ops_write_the_registered_buffer(client):
    rng = np.random.default_rng(RNG_SEED)
    with client.shared_buffer(1 << 16) as buf:
        act = buf.numpy(np.float32, (2, 16, 8))
        act[...] = rng.standard_normal(act.shape)
        out = buf.numpy(np.float32, (2, 5, 8), offset=act.nbytes)
        idx = np.stack([rng.choice(16, 5, replace=False) for _ in range(2)]).astype(np.int64)
        with client.stream() as stream:
            stream.run(client.ops.gather_tokens(act, idx, out=out))
        np.testing.assert_array_equal(out, _gather_reference(act, idx))


def test_many_threads_share_one_stream(client):
    rng = np.random.default_rng(RNG_SEED)
    cases = [_random_case(rng, 2, 10, 3, 2) for _ in range(64)]
    errors = []
    with client.stream(window=4) as stream:
        def work(part):
            try:
                for act, idx in part:
                    np.testing.assert_array_equal(
                        stream.run(client.ops.gather_tokens(act, idx)), _gather_reference(act, idx))
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)
        threads = [threading.Thread(target=work, args=(cases[k::4],)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_a_closed_stream_refuses_submits(client):
    stream = client.stream()
    stream.close()
    stream.close()  # idempotent
    act = np.zeros((1, 2, 1), np.float32)
    with pytest.raises(tokensel.FailedPreconditionError, match="closed"):
        stream.submit(client.ops.gather_tokens(act, np.zeros((1, 1), np.int32))).result(timeout=10)


def test_a_cancelled_stream_fails_pending_and_later_submits(client):
    stream = client.stream(window=64)
    act = np.zeros((4, 4096, 16), np.float32)
    idx = np.tile(np.arange(2048, dtype=np.int32), (4, 1))
    futures = [stream.submit(client.ops.gather_tokens(act, idx)) for _ in range(32)]
    stream.cancel()
    done, _ = concurrent.futures.wait(futures, timeout=60)
    assert len(done) == len(futures)  # every future completes, answered or failed
    with pytest.raises(tokensel.TokenselError):
        stream.submit(client.ops.gather_tokens(act, idx)).result(timeout=10)


def test_window_must_be_positive(client):
    with pytest.raises(ValueError, match="window"):
        client.stream(window=0)


@pytest.mark.parametrize("r", [0, 1, 3, 7])
def test_slice_gpt_mask_takes_r_from_out(client, r):
    rng = np.random.default_rng(RNG_SEED + r)
    mask = rng.integers(0, 2, size=(2, 3, 7, 7)).astype(np.bool_)
    out = np.ones((2, 3, r, r), np.bool_)
    assert client.slice_gpt_mask(mask, out=out) is out
    np.testing.assert_array_equal(out, mask[:, :, :r, :r])
    np.testing.assert_array_equal(client.slice_gpt_mask(mask, r), mask[:, :, :r, :r])


def test_slice_gpt_mask_without_r_or_out_is_refused_before_sending(client):
    with pytest.raises(ValueError, match="retained_tokens"):
        client.slice_gpt_mask(np.zeros((1, 1, 2, 2), np.bool_))
