"""tokensel.torch packed Random-LTD: PackedRandomLayerTokenDrop against the
same model with the drop done in plain PyTorch on ids recomputed here from
the spec (test_sample_packed's Python Philox reference): outputs and
gradients bit for bit, with padding, empty and one-token sequences, a
schedule, trailing dims; what the layer is handed (cu_seqlens of the kept
tokens, positions, max_seqlen); pass-through; recomputation; errors."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tokensel[torch]')")
import tokensel  # noqa: E402
import tokensel.torch as tst  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from test_sample_packed import _reference  # noqa: E402

SEED = 20261126
C = 6


def bits(t):
    t = t.detach().contiguous()
    return t.view(torch.int64 if t.element_size() == 8 else torch.int32)


class PackedBlock(nn.Module):
    """Uses everything the wrapper hands it: tokens, their sequences'
    boundaries (a per-sequence mean mixes tokens of one sequence, so a wrong
    cu_seqlens changes the output), positions and max_seqlen."""

    def __init__(self, log):
        super().__init__()
        self.lin = nn.Linear(C, C)
        self.log = log

    def forward(self, x, cu_seqlens=None, positions=None, max_seqlen=None):
        self.log.append((self, cu_seqlens.clone(), None if positions is None else positions.clone(),
                         max_seqlen))
        shape = x.shape
        if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
            return x, "aux"  # bad boundaries (test_errors): the wrapper must refuse them
        h = torch.tanh(self.lin(x.reshape(shape[0], C)))
        parts = []
        for i in range(len(cu_seqlens) - 1):
            seg = h[int(cu_seqlens[i]):int(cu_seqlens[i + 1])]
            parts.append(seg + seg.mean(dim=0, keepdim=True))
        parts.append(h[int(cu_seqlens[-1]):])  # padding
        h = torch.cat(parts)
        if positions is not None:
            h = h + 0.01 * positions.to(h.dtype).unsqueeze(1)
        return x + h.reshape(shape), "aux"


class Model(nn.Module):
    def __init__(self, log, layers=4, recompute=None):
        super().__init__()
        self.blocks = nn.ModuleList(PackedBlock(log) for _ in range(layers))
        self.recompute = recompute

    def forward(self, x, cu):
        for blk in self.blocks:
            if self.recompute is None or not isinstance(blk, tst.PackedRandomLayerTokenDrop):
                x = blk(x, cu_seqlens=cu)[0]
            else:
                x = checkpoint(lambda h, blk=blk: blk(h, cu_seqlens=cu)[0], x,
                               use_reentrant=self.recompute)
        return x


def make(client, arena, keep, *, min_tokens=0, recompute=None, positions=True, max_seqlen=True):
    log = []
    model = Model(log, recompute=recompute)
    torch.manual_seed(SEED)
    for p in model.parameters():
        nn.init.normal_(p, std=0.5)
    ltd = tst.PackedRandomLTD(client, keep, seed=SEED, arena=arena, min_tokens=min_tokens,
                              positions_name="positions" if positions else None,
                              max_seqlen_name="max_seqlen" if max_seqlen else None)
    tst.convert_to_random_ltd(model, PackedBlock, ltd, layer_ids=[1, 2])
    return model, ltd, log


def reference_forward(model, x, cu, total, num, den, floor, step):
    """The model with the drop done in plain PyTorch on reference ids."""
    kept, ids, pos, _ = _reference(cu.tolist(), total, num, den, floor, 2, SEED, step)
    kept = torch.as_tensor(kept)
    lengths = kept[1:] - kept[:-1]
    layer = 0
    for blk in model.blocks:
        if isinstance(blk, tst.PackedRandomLayerTokenDrop):
            inner, i = blk.random_ltd_layer, torch.as_tensor(ids[layer]).long()
            part = x.index_select(0, i)
            y = inner(part, cu_seqlens=kept, positions=torch.as_tensor(pos[layer]).long(),
                      max_seqlen=int(lengths.max()) if lengths.numel() else 0)[0]
            x = x.index_copy(0, i, y)
            layer += 1
        else:
            x = blk(x, cu_seqlens=cu)[0]
    return x, ids, pos, kept


@pytest.fixture
def arena(client):
    with tst.Arena(client, chunk_bytes=1 << 20) as a:
        yield a


PACKS = {  # lengths, padding
    "mixed": ([5, 1, 0, 9, 3, 12], 4),
    "one": ([17], 0),
    "empty": ([], 3),
    "odd": ([1, 1, 2, 3, 5, 8, 13, 21], 1),
}


@pytest.mark.parametrize("pack", sorted(PACKS))
@pytest.mark.parametrize("use_arena", [True, False])
def test_matches_pure_pytorch_on_reference_ids(client, arena, pack, use_arena):
    lengths, pad = PACKS[pack]
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    total = int(cu[-1]) + pad
    sched = tst.FixedLinearSchedule(2, 10, 4, 2)  # keep 2/10, 4/10, 6/10 at steps 0, 1, 2
    model, ltd, log = make(client, arena if use_arena else None, sched, min_tokens=1)
    gen = torch.Generator().manual_seed(SEED + len(lengths))
    for step in range(3):
        num, den = ltd.update(step)
        assert (num, den) == (2 + 2 * step, 10)
        x0 = torch.randn(total, C, generator=gen)
        upstream = torch.randn(x0.shape, generator=gen)
        del log[:]
        x = x0.clone().requires_grad_()
        out = model(x, cu)
        got = (out,) + torch.autograd.grad(out, (x,) + tuple(model.parameters()), upstream)
        seen = [entry for entry in log if entry[0] in (model.blocks[1].random_ltd_layer,
                                                        model.blocks[2].random_ltd_layer)]
        x = x0.clone().requires_grad_()
        ref, ids, pos, kept = reference_forward(model, x, cu, total, num, den, 1, step)
        want = (ref,) + torch.autograd.grad(ref, (x,) + tuple(model.parameters()), upstream)
        for g, w in zip(got, want):
            assert torch.equal(bits(g), bits(w))
        # what the two wrapped layers saw: the kept boundaries, positions, max
        assert len(seen) == 2
        lens = kept[1:] - kept[:-1]
        for layer, (_, cu_seen, pos_seen, max_seen) in enumerate(seen):
            assert torch.equal(cu_seen, kept)
            assert pos_seen.tolist() == pos[layer].tolist()
            assert max_seen == (int(lens.max()) if lens.numel() else 0)
        used = ltd._state[1].ids  # what the wrapper sampled: the reference's, no padding token
        assert torch.equal(used, torch.as_tensor(ids))
        if used.shape[1]:
            assert int(used.max()) < int(cu[-1])
    assert ltd.samples == 3  # one SamplePackedTokens per forward, for both layers


def test_trailing_dims_and_fixed_fraction(client, arena):
    """A [T, H, D] hidden state, keep (1, 3) fixed, no positions."""
    log = []
    inner = PackedBlock(log)
    ltd = tst.PackedRandomLTD(client, (1, 3), seed=SEED, arena=arena)
    wrapped = tst.convert_to_random_ltd(nn.Sequential(inner), PackedBlock, ltd)[0]
    cu = torch.tensor([0, 7, 8, 20], dtype=torch.int32)
    ltd.update(5)
    x = torch.randn(20, 2, C // 2, generator=torch.Generator().manual_seed(4))
    out = wrapped(x, cu_seqlens=cu)[0]
    _, ids, _, _ = _reference(cu.tolist(), 20, 1, 3, 0, 1, SEED, 5)
    i = torch.as_tensor(ids[0]).long()
    kept_cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    y = inner(x.index_select(0, i), cu_seqlens=kept_cu)[0]
    assert torch.equal(bits(out), bits(x.index_copy(0, i, y)))
    assert log[0][2] is None and log[0][3] is None  # nothing asked, nothing passed


def test_recomputed_forward_gets_the_same_ids(client, arena):
    cu = torch.tensor([0, 6, 6, 15, 16], dtype=torch.int32)
    for use_reentrant in (True, False):
        plain, ltd_plain, _ = make(client, arena, (1, 2))
        recomputed, ltd, log = make(client, arena, (1, 2), recompute=use_reentrant)
        for step in range(3):
            ltd.update(step)
            ltd_plain.update(step)
            x0 = torch.randn(16, C, generator=torch.Generator().manual_seed(step))
            del log[:]
            samples = ltd.samples
            grads = []
            for model in (recomputed, plain):
                x = x0.clone().requires_grad_()
                model.zero_grad(set_to_none=True)
                (model(x, cu) ** 2).sum().backward()
                grads.append([x.grad] + [p.grad for p in model.parameters()])
            assert ltd.samples - samples == 2  # the forward's and the recompute's
            for g, w in zip(*grads):
                assert torch.equal(bits(g), bits(w))
            inner = recomputed.blocks[1].random_ltd_layer
            pos = [p for blk, _, p, _ in log if blk is inner]
            assert len(pos) == 2 and torch.equal(pos[0], pos[1])


def test_pass_through_in_eval_and_at_keep_one(client, arena):
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    x = torch.randn(11, C, generator=torch.Generator().manual_seed(5))
    model, ltd, log = make(client, arena, tst.FixedLinearSchedule(8, 8, 1))
    plain = Model([])
    plain.load_state_dict(tst.remove_random_ltd_state_dict(model.state_dict()))
    ltd.update(0)
    assert torch.equal(model(x, cu), plain(x, cu))  # keep 8/8
    model2, ltd2, _ = make(client, arena, (1, 4))
    ltd2.update(0)
    model2.eval()
    assert torch.equal(model2(x, cu), plain(x, cu))
    assert ltd.samples == 0 and ltd2.samples == 0
    assert all(entry[2] is None for entry in log)  # nobody got positions


def test_errors(client, arena):
    with pytest.raises(ValueError, match="num <= den"):
        tst.PackedRandomLTD(client, (3, 2), seed=1)
    with pytest.raises(ValueError, match="min_tokens"):
        tst.PackedRandomLTD(client, (1, 2), seed=1, min_tokens=-1)
    model, ltd, _ = make(client, arena, (1, 2))
    x = torch.randn(8, C)
    with pytest.raises(RuntimeError, match=r"update\(step\)"):
        model(x, torch.tensor([0, 8], dtype=torch.int32))
    ltd.update(0)
    with pytest.raises(ValueError, match="'cu_seqlens' keyword"):
        model.blocks[1](x)
    bad = torch.tensor([0, 5, 3, 8], dtype=torch.int32)  # sequence 1 ends before it starts
    with pytest.raises(tokensel.InvalidArgumentError, match="cu_seqlens"):
        model(x, bad)


def test_state_dict_round_trip(client):
    ltd = tst.PackedRandomLTD(client, tst.FixedLinearSchedule(2, 8, 10, 2), seed=9, min_tokens=3)
    for step in range(6):
        ltd.update(step, sample_step=50 + step)
    other = tst.PackedRandomLTD(client, tst.FixedLinearSchedule(2, 8, 10, 2), seed=0)
    other.load_state_dict(ltd.state_dict())
    assert other.state_dict() == ltd.state_dict() and other.keep() == ltd.keep()
