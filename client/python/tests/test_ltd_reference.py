"""The pure-PyTorch Random-LTD reference semantics (DeepSpeed utils.py
bsh_decoder_gather / bsh_decoder_scatter, RandomLayerTokenDrop, and the
general BERT mask row+column gather) against the server."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tokensel[torch]')")

B, S, C, H = 3, 32, 8, 2


def bsh_decoder_gather(hidden, mask, R, gen):
    """DeepSpeed utils.py: per batch item randperm(S)[:R], sorted, then
    hidden[k, idx, :]; the mask becomes mask[:, :, :R, :R]."""
    idx = torch.stack([torch.randperm(hidden.shape[1], generator=gen)[:R].sort().values
                       for _ in range(hidden.shape[0])])
    part = torch.stack([hidden[k, idx[k], :] for k in range(hidden.shape[0])])
    return idx, part, mask[:, :, :R, :R]


def bsh_decoder_scatter(hidden, part, idx):
    out = hidden.clone()
    for k in range(hidden.shape[0]):
        out[k, idx[k], :] = part[k]
    return out


def causal_mask():
    return torch.tril(torch.ones(S, S, dtype=torch.bool)).expand(B, H, S, S).contiguous()


def test_decoder_layer_step_matches_reference(client):
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(B, S, C, generator=gen)
    mask = causal_mask()
    for R in (S, 24, 16, 1):  # a retention schedule 100% -> small
        idx, part_ref, mask_ref = bsh_decoder_gather(hidden, mask, R, gen)
        part = torch.from_numpy(client.gather_tokens(hidden, idx.to(torch.int32)))
        assert torch.equal(part, part_ref)
        mask_got = client.slice_gpt_mask(mask, R)
        assert torch.equal(torch.from_numpy(mask_got), mask_ref)
        layer_out = torch.tanh(part) * 3  # the stand-in layer
        merged = hidden.clone()
        client.scatter_tokens(merged, layer_out, idx)
        want = bsh_decoder_scatter(hidden, layer_out, idx)
        assert torch.equal(merged, want)
        # Dropped tokens skip the layer unchanged.
        dropped = torch.ones(B, S, dtype=torch.bool)
        dropped[torch.arange(B)[:, None], idx] = False
        assert torch.equal(merged[dropped], hidden[dropped])
        hidden = merged


def bert_mask_reference(mask, ids):
    """out[l,b,h] = mask[b,h][rows][:, ids[l,b]], rows = ids (or row 0 when Sq=1)."""
    L, Bb, R = ids.shape
    out = torch.empty((L, Bb, mask.shape[1], R, R), dtype=mask.dtype)
    for l in range(L):
        for b in range(Bb):
            rows = ids[l, b] if mask.shape[2] > 1 else torch.zeros(R, dtype=torch.long)
            out[l, b] = mask[b][:, rows][:, :, ids[l, b]]
    return out


def test_bert_mask_row_and_column_gather(client):
    gen = torch.Generator().manual_seed(8)
    L, R = 3, 10
    ids = torch.stack([torch.randperm(S, generator=gen)[:R].sort().values
                       for _ in range(L * B)]).reshape(L, B, R)
    full = torch.randn(B, H, S, S, generator=gen)  # layer offset must be applied
    got = client.gather_bert_mask(full, ids)
    assert torch.equal(torch.from_numpy(got), bert_mask_reference(full, ids))
    padding = torch.rand(B, 1, 1, S, generator=gen) > 0.3  # HF [B,1,1,S] padding mask
    got = client.gather_bert_mask(padding, ids.to(torch.int32))
    assert torch.equal(torch.from_numpy(got), bert_mask_reference(padding, ids))


def test_sampled_ids_drive_the_whole_step(client):
    """SampleTokens -> GatherBertMask / SliceGptMask agree with the reference
    applied to the sampled ids (the fused masks SampleTokens can emit too)."""
    L, R = 2, 12
    mask = causal_mask()
    res = client.sample_tokens(L, B, S, R, seed=99, step=3, mask=mask, bert_mask=True,
                               gpt_mask=True, inverse=True)
    ids = torch.from_numpy(res.ids).long()
    assert torch.equal(torch.from_numpy(res.bert_mask), bert_mask_reference(mask, ids))
    assert torch.equal(torch.from_numpy(res.gpt_mask), mask[:, :, :R, :R])
    inverse = np.full((L, B, S), -1, dtype=np.int32)
    for l in range(L):
        for b in range(B):
            inverse[l, b, res.ids[l, b]] = np.arange(R)
    np.testing.assert_array_equal(res.inverse, inverse)
