"""A small GPT-style decoder in plain PyTorch: token embedding, pre-LN blocks
with rotary position embeddings (RoPE) and causal attention computed from
each token's position, a GELU MLP, a final LayerNorm and an untied head.

Blocks take `positions` ([B,T] int64, default 0..T-1): under Random-LTD a
block sees only the kept tokens, and RoPE and the causal mask must use their
original positions (ids are ascending, so "j before i" is pos[j] <= pos[i])."""
import math

import torch
import torch.utils.checkpoint
from torch import nn


def rope(x, positions):
    """Rotary embedding of x [B,H,T,D] (D even) at positions [B,T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = positions.to(torch.float32)[:, None, :, None] * inv_freq  # [B,1,T,D/2]
    cos, sin = torch.cos(angles), torch.sin(angles)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, d_model, heads, log=None):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.log = log  # list receiving (self, positions) per call, or None

    def forward(self, x, positions=None):
        b, t, c = x.shape
        if positions is None:
            positions = torch.arange(t).expand(b, t)
        if self.log is not None:
            self.log.append((self, positions))
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(
            2, 0, 3, 1, 4)
        q, k = rope(q, positions), rope(k, positions)
        scores = q @ k.transpose(-1, -2) / math.sqrt(c // self.heads)
        visible = positions[:, None, None, :] <= positions[:, None, :, None]  # [B,1,T,T]
        scores = scores.masked_fill(~visible, float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """`recompute`: run the blocks that drop tokens under
    torch.utils.checkpoint (their forward runs again in backward)."""

    def __init__(self, vocab, d_model, layers, heads, log=None, recompute=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, log) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.recompute = recompute

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            if self.recompute and not isinstance(blk, Block):  # a token-dropping wrapper
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.head(self.ln_f(x))
