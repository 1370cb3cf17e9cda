"""tokensel.torch Random-LTD: RandomLayerTokenDrop against a pure-PyTorch
reference layer on the same ids (outputs and gradients bitwise; GPT- and
BERT-style masks; both layouts), the fixed_linear schedule and its
checkpoint, convert_to_random_ltd, and ids that a recomputed forward
(torch.utils.checkpoint) and another session reproduce from (seed, step)."""
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tokensel[torch]')")
import tokensel  # noqa: E402
import tokensel.torch as tst  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

SEED = 20260301
B, S, C, H = 3, 12, 5, 2


def bits(t):
    t = t.detach().contiguous()
    return t.view(torch.int64 if t.element_size() == 8 else torch.int32)


class Block(nn.Module):
    """A layer that uses everything the wrapper hands it: its tokens, their
    positions (for the log) and the attention mask (the mask mixes tokens,
    so a wrong mask changes the output)."""

    def __init__(self, batch_first, log):
        super().__init__()
        self.lin = nn.Linear(C, C)
        self.batch_first, self.log = batch_first, log

    def forward(self, x, positions=None, attention_mask=None):
        self.log.append((self, positions))
        h = x if self.batch_first else x.transpose(0, 1)  # [B,T,C]
        h = torch.tanh(self.lin(h))
        if attention_mask is not None:
            w = attention_mask.to(h.dtype).mean(dim=1)  # [B,Tq|1,T]
            h = h + w @ h / h.shape[1]
        h = h if self.batch_first else h.transpose(0, 1)
        return x + h, "aux"


class Model(nn.Module):
    def __init__(self, batch_first, log, layers=4, recompute=None):
        super().__init__()
        self.blocks = nn.ModuleList(Block(batch_first, log) for _ in range(layers))
        self.recompute = recompute  # None, or use_reentrant for torch.utils.checkpoint

    def forward(self, x, mask=None):
        for blk in self.blocks:
            if self.recompute is None or not isinstance(blk, tst.RandomLayerTokenDrop):
                x = blk(x, attention_mask=mask)[0]
            else:
                x = checkpoint(lambda h, m, blk=blk: blk(h, attention_mask=m)[0], x, mask,
                               use_reentrant=self.recompute)
        return x


def reference_forward(model, x, mask, ids, masks_of_layer, batch_first):
    """The same model, Random-LTD done in plain PyTorch on given ids [L,B,R]."""
    ltd_id = 0
    for blk in model.blocks:
        if isinstance(blk, tst.RandomLayerTokenDrop):
            inner, i = blk.random_ltd_layer, ids[ltd_id]
            part = tst.gather_tokens_reference(x, i, batch_first=batch_first)
            y = inner(part, positions=i.long(), attention_mask=masks_of_layer(ltd_id))[0]
            x = tst.merge_tokens_reference(x, y, i, batch_first=batch_first)
            ltd_id += 1
        else:
            x = blk(x, attention_mask=mask)[0]
    return x


def bert_mask_reference(mask, ids_l):
    rows = ids_l.long() if mask.shape[2] > 1 else torch.zeros_like(ids_l, dtype=torch.long)
    return torch.stack([mask[b][:, rows[b]][:, :, ids_l[b].long()] for b in range(len(ids_l))])


def make(client, arena, batch_first, model_type="decoder", mask_name="attention_mask",
         schedule=None, recompute=None, seed=SEED):
    log = []
    model = Model(batch_first, log, recompute=recompute)
    torch.manual_seed(SEED)
    for p in model.parameters():
        nn.init.normal_(p)
    ltd = tst.RandomLTD(client, schedule or tst.FixedLinearSchedule(5, 9, 4, 2), seed=seed,
                        arena=arena, model_type=model_type, mask_name=mask_name,
                        batch_first=batch_first, positions_name="positions")
    tst.convert_to_random_ltd(model, Block, ltd, layer_ids=[1, 2])
    return model, ltd, log


@pytest.fixture
def arena(client):
    with tst.Arena(client, chunk_bytes=1 << 20) as a:
        yield a


MASKS = {
    "none": None,
    "causal": torch.tril(torch.ones(S, S, dtype=torch.bool)).expand(B, H, S, S).contiguous(),
    "padding": torch.rand(B, 1, 1, S, generator=torch.Generator().manual_seed(1)) > 0.3,
    "dense": torch.randn(B, H, S, S, generator=torch.Generator().manual_seed(2)),
}


@pytest.mark.parametrize("model_type,mask_kind,batch_first", [
    ("decoder", "causal", True), ("decoder", "none", False), ("decoder", "causal", False),
    ("encoder", "padding", True), ("encoder", "dense", True), ("encoder", "dense", False)])
def test_matches_pure_pytorch_on_the_same_ids(client, arena, model_type, mask_kind, batch_first):
    mask = MASKS[mask_kind]
    model, ltd, log = make(client, arena, batch_first, model_type)
    gen = torch.Generator().manual_seed(SEED + 1)
    for step in (0, 3, 7):  # R = 5, 7, 9 of S = 12
        R = ltd.update(step)
        x0 = torch.randn((B, S, C) if batch_first else (S, B, C), generator=gen)
        upstream = torch.randn(x0.shape, generator=gen)
        del log[:]
        x = x0.clone().requires_grad_()
        out = model(x, mask)
        got = (out,) + torch.autograd.grad(out, (x,) + tuple(model.parameters()), upstream)
        ids = torch.as_tensor(client.sample_tokens(2, B, S, R, SEED, step).ids)
        seen = [p for blk, p in log if p is not None]
        assert [p.tolist() for p in seen] == [ids[0].long().tolist(), ids[1].long().tolist()]
        if mask is None:
            masks = lambda l: None  # noqa: E731
        elif ltd.mask_mode == "slice":
            masks = lambda l: mask[:, :, :R, :R]  # noqa: E731
        else:
            masks = lambda l: bert_mask_reference(mask, ids[l])  # noqa: E731
        x = x0.clone().requires_grad_()
        ref = reference_forward(model, x, mask, ids, masks, batch_first)
        want = (ref,) + torch.autograd.grad(ref, (x,) + tuple(model.parameters()), upstream)
        for g, w in zip(got, want):
            assert torch.equal(bits(g), bits(w))


def test_recomputed_forward_gets_the_same_ids(client, arena):
    """torch.utils.checkpoint runs each Random-LTD layer's forward again in
    backward; layer 0 samples again there, and (seed, step) gives it the same
    ids: the positions each layer saw match, step after step, and the
    gradients equal those of the run without recomputation bit for bit."""
    for use_reentrant in (True, False):
        plain, ltd_plain, _ = make(client, arena, True)
        recomputed, ltd, log = make(client, arena, True, recompute=use_reentrant)
        gen = torch.Generator().manual_seed(SEED + 2)
        seen_by_step = []
        for step in range(4):
            ltd.update(step)
            ltd_plain.update(step)
            x0 = torch.randn(B, S, C, generator=gen)
            del log[:]
            samples = ltd.samples
            grads = []
            for model in (recomputed, plain):
                x = x0.clone().requires_grad_()
                model.zero_grad(set_to_none=True)
                out = model(x, MASKS["causal"])
                (out * out).sum().backward()  # checkpoint does not support autograd.grad
                grads.append([x.grad] + [p.grad for p in model.parameters()])
            assert ltd.samples - samples == 2  # the forward's and the recompute's
            for g, w in zip(*grads):
                assert torch.equal(bits(g), bits(w))
            calls = {}
            for blk, p in log:
                if p is not None and blk in (recomputed.blocks[1].random_ltd_layer,
                                             recomputed.blocks[2].random_ltd_layer):
                    calls.setdefault(blk, []).append(p)
            for blk, ps in calls.items():
                assert len(ps) == 2 and torch.equal(ps[0], ps[1])  # forward, recompute
            seen_by_step.append(calls[recomputed.blocks[1].random_ltd_layer][0])
        assert any(not torch.equal(a, b) for a, b in zip(seen_by_step, seen_by_step[1:]))


def test_ids_depend_on_seed_and_step_only(client, server):
    with tokensel.Client(server.target, client_name="pytest-rank1") as other:
        a = client.sample_tokens(3, B, S, 7, seed=5, step=11).ids
        b = other.sample_tokens(3, B, S, 7, seed=5, step=11).ids  # another rank's session
        c = other.sample_tokens(3, B, S, 7, seed=5, step=12).ids
    assert (a == b).all() and not (a == c).all()


def test_pass_through_in_eval_and_at_full_length(client, arena):
    model, ltd, _ = make(client, arena, True, schedule=tst.FixedLinearSchedule(S, S, 1))
    plain = Model(True, [])
    plain.load_state_dict(tst.remove_random_ltd_state_dict(model.state_dict()))
    x = torch.randn(B, S, C, generator=torch.Generator().manual_seed(3))
    ltd.update(0)
    client.stats.reset()
    assert torch.equal(model(x), plain(x))  # R = S: every token goes through
    ltd2 = make(client, arena, True)[0]
    ltd2.eval()
    ltd2.load_state_dict(model.state_dict())
    assert torch.equal(ltd2(x), plain(x))
    assert client.stats.snapshot()["by_reference"] == 0 and ltd.samples == 0


def test_convert_to_random_ltd_selects_layers(client):
    log = []
    model = Model(True, log, layers=5)
    ltd = tst.RandomLTD(client, tst.FixedLinearSchedule(4, 8, 10), seed=1)
    tst.convert_to_random_ltd(model, Block, ltd, layer_ids=[3, 1])
    kinds = [type(b).__name__ for b in model.blocks]
    assert kinds == ["Block", "RandomLayerTokenDrop", "Block", "RandomLayerTokenDrop", "Block"]
    assert [model.blocks[i].ltd_layer_id for i in (1, 3)] == [0, 1] and ltd.num_layers == 2
    with pytest.raises(ValueError, match=r"layer_ids \[5\] out of range"):
        tst.convert_to_random_ltd(Model(True, log, layers=5), Block, ltd, layer_ids=[5])
    assert "blocks.1.random_ltd_layer.lin.weight" in model.state_dict()
    Model(True, log, layers=5).load_state_dict(tst.remove_random_ltd_state_dict(
        model.state_dict()))


def deepspeed_value(step, lo, hi, require, per):
    """DeepSpeed scheduler.py fixed_linear (__fixed_root_get_value, root 1)."""
    v = math.floor(float(step) / require * (hi - lo) + lo)
    v -= v % per
    return min(v, hi)


def test_fixed_linear_schedule_and_its_checkpoint():
    lo, hi, require, per = 16, 64, 30, 8
    sched = tst.FixedLinearSchedule(lo, hi, require, per, total_layers=6, ltd_layers=4,
                                    global_batch_size=8)
    values = [sched.update_seq(step) for step in range(40)]
    assert values == [deepspeed_value(s, lo, hi, require, per) for s in range(40)]
    assert values[0] == 16 and values[-1] == 64 and sorted(values) == values
    assert sched.consumed_layer_tokens == sum(8 * (v * 4 + 64 * 2) for v in values)
    # DeepSpeed's rounding goes below min (6 - 6 % 4 = 4); this never does
    assert deepspeed_value(0, 6, 20, 10, 4) == 4
    assert tst.FixedLinearSchedule(6, 20, 10, 4).update_seq(0) == 6
    # save mid-schedule, restore into a fresh one: the rest is the same
    a = tst.FixedLinearSchedule(lo, hi, require, per)
    for step in range(12):
        a.update_seq(step)
    b = tst.FixedLinearSchedule(lo, hi, require, per)  # the config comes from the code, as in DeepSpeed
    b.load_state_dict(a.state_dict())
    assert b.consumed_layer_tokens == a.consumed_layer_tokens > 0
    assert [a.update_seq(s) for s in range(12, 40)] == [b.update_seq(s) for s in range(12, 40)]
    assert a.state_dict() == b.state_dict()


def test_random_ltd_state_dict_round_trip(client):
    ltd = tst.RandomLTD(client, tst.FixedLinearSchedule(4, 8, 10, 2), seed=9)
    for step in range(6):
        ltd.update(step, sample_step=100 + step)
    other = tst.RandomLTD(client, tst.FixedLinearSchedule(4, 8, 10, 2), seed=0)
    other.load_state_dict(ltd.state_dict())
    assert other.state_dict() == ltd.state_dict() and other.retained_tokens() == 6
