"""Operators (inline numpy / CPU torch) against torch reference ops."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tokensel[torch]')")

RNG_SEED = 20241122


def sorted_subsets(gen, rows, S, R):
    """[rows, R] int64: a sorted uniform R-subset of [0, S) per row."""
    return torch.stack([torch.randperm(S, generator=gen)[:R].sort().values for _ in range(rows)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.bool])
@pytest.mark.parametrize("batch_first", [True, False])
def test_gather_matches_index_select(client, dtype, batch_first):
    gen = torch.Generator().manual_seed(RNG_SEED)
    B, S, C, R = 3, 17, 5, 6
    base = torch.randn(B, S, C, generator=gen) * 10
    act = (base > 0) if dtype == torch.bool else base.to(dtype)
    idx = torch.randint(0, S, (B, R), generator=gen)  # need not be sorted or unique
    if batch_first:
        want = torch.stack([act[b].index_select(0, idx[b]) for b in range(B)])
        got = client.gather_tokens(act, idx.to(torch.int32))
    else:
        act_sf = act.transpose(0, 1).contiguous()  # [S,B,C]
        want = torch.stack([act_sf[:, b].index_select(0, idx[b]) for b in range(B)], dim=1)
        got = client.gather_tokens(act_sf, idx, batch_first=False)
    if dtype == torch.bfloat16:
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    else:
        assert isinstance(got, np.ndarray)
        got = torch.from_numpy(got)
    assert torch.equal(got, want)


@pytest.mark.parametrize("batch_first", [True, False])
def test_scatter_matches_index_copy(client, batch_first):
    gen = torch.Generator().manual_seed(RNG_SEED + 1)
    B, S, C, R = 4, 12, 3, 5
    hidden = torch.randn(B, S, C, generator=gen).to(torch.bfloat16)
    layer = torch.randn(B, R, C, generator=gen).to(torch.bfloat16)
    idx = sorted_subsets(gen, B, S, R)
    want = hidden.clone()
    for b in range(B):
        want[b].index_copy_(0, idx[b], layer[b])
    if batch_first:
        got = hidden.clone()
        assert client.scatter_tokens(got, layer, idx) is got  # in place
    else:
        got_sf = hidden.transpose(0, 1).contiguous()
        client.scatter_tokens(got_sf, layer.transpose(0, 1).contiguous(), idx, batch_first=False)
        got = got_sf.transpose(0, 1)
    assert torch.equal(got, want)


def test_sort_matches_torch_sort_with_inverse(client):
    gen = torch.Generator().manual_seed(RNG_SEED + 2)
    L, B, S, R = 2, 3, 50, 20
    ids = torch.stack([torch.randperm(S, generator=gen)[:R] for _ in range(L * B)]).reshape(L, B, R)
    ids32 = ids.to(torch.int32).numpy()
    result = client.sort_tokens(ids32, S, inverse=True)
    assert result.ids is ids32  # sorted in place
    want = torch.sort(ids, dim=-1).values
    np.testing.assert_array_equal(ids32, want.numpy())
    inverse = torch.full((L, B, S), -1, dtype=torch.int32)
    inverse.scatter_(-1, want, torch.arange(R, dtype=torch.int32).expand(L, B, R).contiguous())
    np.testing.assert_array_equal(result.inverse, inverse.numpy())
    out = np.empty((L, B, R), dtype=np.int64)
    unsorted = ids.numpy()
    client.sort_tokens(unsorted, S, out=out)
    np.testing.assert_array_equal(out, want.numpy())
    np.testing.assert_array_equal(unsorted, ids.numpy())  # input untouched with `out`


def topk_reference(row, R):
    """Exact rule: R highest keys, NaN below -inf, -0 == +0, ties to the lower
    position; returned ascending."""
    def key(s):
        v = float(row[s])
        return (0, 0.0, -s) if math.isnan(v) else (1, v, -s)
    return sorted(sorted(range(len(row)), key=key, reverse=True)[:R])


def test_topk_matches_torch_topk(client):
    gen = torch.Generator().manual_seed(RNG_SEED + 3)
    scores = torch.randn(4, 2, 33, generator=gen)  # distinct: torch.topk is exact
    R = 9
    want = torch.topk(scores, R, dim=-1).indices.sort(dim=-1).values
    got = client.topk_tokens(scores, R)
    np.testing.assert_array_equal(got, want.numpy())
    ids = np.empty((4, 2, R), dtype=np.int64)
    client.topk_tokens(scores.numpy(), R, ids=ids)
    np.testing.assert_array_equal(ids, want.numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_topk_tie_rules(client, dtype):
    nan, inf = float("nan"), float("inf")
    rows = torch.tensor([[1.0, 2.0, 2.0, 1.0, 2.0, 0.5],
                         [nan, -inf, nan, -0.0, 0.0, -1.0],
                         [3.0, 3.0, 3.0, 3.0, 3.0, 3.0],
                         [nan, nan, -inf, nan, 5.0, nan]]).to(dtype)
    for R in (0, 1, 3, 6):
        got = client.topk_tokens(rows, R)
        want = [topk_reference(rows[i].float().tolist(), R) for i in range(rows.shape[0])]
        np.testing.assert_array_equal(got, np.array(want, dtype=np.int32).reshape(4, R))
