"""tokensel.torch's autograd functions against autograd on the pure-PyTorch
formulation (index_select / index_copy): bitwise forward outputs and
gradients on random inputs (R = 0, 1, S; B = 1; odd C; both layouts; float32
and float64), gradcheck, gradients never written, and what the arena stages."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tokensel[torch]')")
import tokensel.torch as tst  # noqa: E402

SEED = 20260214
SIZES = [(1, 1, 1, 1), (1, 7, 0, 3), (2, 9, 1, 5), (3, 16, 16, 7), (2, 33, 12, 3)]  # B,S,R,C


@pytest.fixture
def arena(client):
    with tst.Arena(client, chunk_bytes=1 << 20) as a:
        yield a


def bits(t):
    """The tensor's bytes as integers: equality that tells -0.0 from +0.0 and
    compares NaN payloads."""
    t = t.detach().contiguous()
    return t.view(torch.int64 if t.element_size() == 8 else torch.int32)


def assert_bitwise(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(bits(got), bits(want)), (got - want).abs().max()


def case(b, s, r, c, dtype, batch_first, gen):
    x = torch.randn(b, s, c, generator=gen, dtype=dtype)
    layer = torch.randn(b, r, c, generator=gen, dtype=dtype)
    idx = torch.stack([torch.randperm(s, generator=gen)[:r].sort().values for _ in range(b)])
    idx = idx.reshape(b, r).to(torch.int32)
    if not batch_first:
        x, layer = x.transpose(0, 1).contiguous(), layer.transpose(0, 1).contiguous()
    return x, layer, idx


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("b,s,r,c", SIZES)
@pytest.mark.parametrize("use_arena", [True, False])
def test_gather_merge_bitwise_against_autograd(client, arena, dtype, batch_first, b, s, r, c,
                                               use_arena):
    gen = torch.Generator().manual_seed(SEED + 97 * s + r)
    x0, layer0, idx = case(b, s, r, c, dtype, batch_first, gen)
    kw = dict(batch_first=batch_first, arena=arena if use_arena else None)
    runs = {}
    for name in ("tokensel", "reference"):
        x, layer = x0.clone().requires_grad_(), layer0.clone().requires_grad_()
        if name == "tokensel":
            part = tst.gather_tokens(client, x, idx, **kw)
            merged = tst.merge_tokens(client, x, layer, idx, **kw)
            pair = tst.merge_tokens(client, x, torch.tanh(tst.gather_tokens(client, x, idx, **kw)),
                                    idx, **kw)
        else:
            part = tst.gather_tokens_reference(x, idx, batch_first=batch_first)
            merged = tst.merge_tokens_reference(x, layer, idx, batch_first=batch_first)
            pair = tst.merge_tokens_reference(
                x, torch.tanh(tst.gather_tokens_reference(x, idx, batch_first=batch_first)), idx,
                batch_first=batch_first)
        g = torch.Generator().manual_seed(SEED)  # the same upstream gradients for both
        gp, gm, gpair = (torch.randn(t.shape, generator=g, dtype=dtype) for t in (part, merged, pair))
        runs[name] = (part, merged, pair)
        # each function alone, then all three (their gradients of x summed by autograd)
        runs[name] += torch.autograd.grad(part, x, gp, retain_graph=True)
        runs[name] += torch.autograd.grad(merged, (x, layer), gm, retain_graph=True)
        runs[name] += torch.autograd.grad(pair, x, gpair, retain_graph=True)
        runs[name] += torch.autograd.grad((part, merged, pair), (x, layer), (gp, gm, gpair))
    for got, want in zip(runs["tokensel"], runs["reference"]):
        assert_bitwise(got, want)


@pytest.mark.parametrize("batch_first", [True, False])
def test_gradcheck_float64(client, arena, batch_first):
    gen = torch.Generator().manual_seed(SEED + 1)
    x, layer, idx = case(2, 6, 3, 3, torch.float64, batch_first, gen)
    x.requires_grad_()
    layer.requires_grad_()
    kw = dict(batch_first=batch_first, arena=arena)
    assert torch.autograd.gradcheck(lambda a: tst.gather_tokens(client, a, idx, **kw), (x,))
    assert torch.autograd.gradcheck(
        lambda a, l: tst.merge_tokens(client, a, l, idx, **kw), (x, layer))
    assert torch.autograd.gradcheck(
        lambda a: tst.merge_tokens(client, a, tst.gather_tokens(client, a, idx, **kw) ** 2,
                                   idx, **kw), (x,))


def test_random_ltd_pair_is_bitwise_even_with_signed_zeros(client, arena):
    """In the pair, autograd adds the two gradients of x, so -0.0 in the
    upstream gradient comes out as in the reference; gather alone copies
    -0.0 where index_select's backward (0 + g) gives +0.0 (equal values)."""
    gen = torch.Generator().manual_seed(SEED + 2)
    x0, _, idx = case(2, 8, 3, 4, torch.float32, True, gen)
    grad = torch.randn(2, 8, 4, generator=gen)
    grad[:, ::2, 1] = -0.0  # in kept and dropped rows
    dxs = []
    for gather, merge in ((lambda x: tst.gather_tokens(client, x, idx, arena=arena),
                           lambda x, l: tst.merge_tokens(client, x, l, idx, arena=arena)),
                          (lambda x: tst.gather_tokens_reference(x, idx),
                           lambda x, l: tst.merge_tokens_reference(x, l, idx))):
        x = x0.clone().requires_grad_()
        dxs.append(torch.autograd.grad(merge(x, gather(x) * 2), x, grad)[0])
    assert_bitwise(dxs[0], dxs[1])
    part_grad = torch.full((2, 3, 4), -0.0)
    x = x0.clone().requires_grad_()
    alone = torch.autograd.grad(tst.gather_tokens(client, x, idx, arena=arena), x, part_grad)[0]
    ref = torch.autograd.grad(tst.gather_tokens_reference(x, idx), x, part_grad)[0]
    assert torch.equal(alone, ref)  # equal values; only the zero's sign differs


@pytest.mark.parametrize("registered", [True, False])
def test_backward_never_writes_the_gradient_it_is_given(client, arena, registered):
    gen = torch.Generator().manual_seed(SEED + 3)
    x, layer, idx = case(2, 10, 4, 3, torch.float32, True, gen)
    x.requires_grad_()
    layer.requires_grad_()
    out = tst.merge_tokens(client, x, layer, idx, arena=arena)
    part = tst.gather_tokens(client, x, idx, arena=arena)
    g_out, g_part = torch.randn(out.shape, generator=gen), torch.randn(part.shape, generator=gen)
    if registered:  # by reference: the server could write it
        g_out, g_part = arena.copy_of(g_out), arena.copy_of(g_part)
        assert arena.contains(g_out) and arena.contains(g_part)
    keep = g_out.clone(), g_part.clone()
    grads = torch.autograd.grad((out, part), (x, layer), (g_out, g_part))
    assert_bitwise(g_out, keep[0])
    assert_bitwise(g_part, keep[1])
    assert all(g.data_ptr() not in (g_out.data_ptr(), g_part.data_ptr()) for g in grads)


def test_arena_steady_state_stages_nothing(client, arena):
    """After one warm-up step, a gather -> layer -> merge step with its
    backward sends no byte inline and carves no new slot."""
    gen = torch.Generator().manual_seed(SEED + 4)
    w = torch.randn(5, 5, generator=gen, requires_grad=True)
    x0, _, idx = case(3, 20, 8, 5, torch.float32, True, gen)
    idx = arena.copy_of(idx)
    for step in range(3):
        client.stats.reset()
        before = arena.stats.snapshot()
        x = x0.clone().requires_grad_()
        y = tst.merge_tokens(client, x, tst.gather_tokens(client, x, idx, arena=arena) @ w, idx,
                             arena=arena)
        (y * y).sum().backward()
        after = arena.stats.snapshot()
        if step > 0:
            assert client.stats.inline_bytes_sent == 0 and client.stats.inline_bytes_received == 0
            assert after["allocations"] == before["allocations"]
            assert after["reuses"] > before["reuses"]
    # x, the layer output and both upstream gradients were torch's: copied in
    assert after["copied_in_tensors"] - before["copied_in_tensors"] == 5


def test_without_arena_staging_is_counted(client):
    gen = torch.Generator().manual_seed(SEED + 5)
    x, _, idx = case(2, 12, 5, 4, torch.float32, True, gen)
    client.stats.reset()
    part = tst.gather_tokens(client, x, idx)
    assert client.stats.inline_bytes_sent == x.numel() * 4 + idx.numel() * 4
    assert client.stats.inline_bytes_received == part.numel() * 4


def test_arena_never_hands_out_a_live_slot(client, arena):
    a = arena.empty((4, 16), torch.float32)
    view = a[1:].t()  # a view keeps the slot alive
    del a
    b = arena.empty((4, 16), torch.float32)
    assert not (b.data_ptr() <= view.data_ptr() < b.data_ptr() + 256)
    addr = b.data_ptr()
    del b
    c = arena.empty((4, 16), torch.float32)  # b's slot is free again
    assert c.data_ptr() == addr and arena.stats.reuses == 1
    assert arena.contains(c) and not arena.contains(torch.empty(4))
    z = arena.zeros((2, 3), torch.float64)
    assert z is arena.zeros((2, 3), torch.float64) and not z.any()
