"""Autograd functions whose forward and backward both run on the sidecar.

    part = gather_tokens(client, x, ids)             # GatherTokens
    y = merge_tokens(client, x, layer(part), ids)    # MergeTokens
    y.sum().backward()     # SplitTokens for merge, MergeTokens-into-zeros for gather

Shapes: x [B,S,C] (batch_first) or [S,B,C]; ids [B,R] int32/int64, unique
within each row; part / layer output [B,R,C] or [R,B,C].

Gradients (docs/ops.md sections 9-10), all out of place: a gradient handed
to a backward is only read, never written.
  gather:  dx = Merge(zeros, dpart, ids)          (dpart's rows at ids, 0 elsewhere)
  merge:   dlayer, dx = Split(G, ids)             (G's rows at ids; G with them zeroed)
This is what autograd computes for the pure-PyTorch formulation
(`gather_tokens_reference`: index_select; `merge_tokens_reference`:
index_copy), bit for bit, with one exception: autograd's index_select
backward adds dpart into zeros, which turns a -0.0 gradient element into
+0.0, while the Merge copies its bits. In the Random-LTD pair the two
gradients of x meet in autograd's accumulation (rest + scattered), which does
that same addition, so there the results are identical bit for bit.

Memory: with an `arena` (tokensel.torch.Arena) every output and gradient is
allocated in registered shared memory and inputs that are not there are
copied in first, so nothing is staged inline; without one, outputs come back
inline and inputs are staged inline (both counted in `client.stats`).
"""
import torch
from torch.autograd.function import once_differentiable


class Ops:
    """How the functions reach the server: a tokensel.Client and an
    optional Arena."""

    def __init__(self, client, arena=None):
        self.client = client
        self.arena = arena

    def place(self, t):
        """`t` ready to send: by reference when possible (copied into the
        arena if it has one), else `t` (staged inline)."""
        t = t.detach()
        return self.arena.place(t) if self.arena is not None else t

    def empty(self, shape, dtype):
        if self.arena is not None:
            return self.arena.empty(shape, dtype)
        return torch.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype):
        if self.arena is not None:
            return self.arena.zeros(shape, dtype)
        return torch.zeros(shape, dtype=dtype)


def _check(x, indices, batch_first):
    if x.dim() != 3 or indices.dim() != 2:
        raise ValueError("expected x [B,S,C] / [S,B,C] and indices [B,R], got %s and %s"
                         % (tuple(x.shape), tuple(indices.shape)))
    batch = x.shape[0] if batch_first else x.shape[1]
    if indices.shape[0] != batch:
        raise ValueError("indices has %d rows, x has batch %d" % (indices.shape[0], batch))


def _part_shape(x, indices, batch_first):
    b, r, c = indices.shape[0], indices.shape[1], x.shape[2]
    return (b, r, c) if batch_first else (r, b, c)


class GatherTokens(torch.autograd.Function):
    """apply(x, indices, ops, batch_first, x_sent=None) -> part. `x_sent`:
    x already placed (Ops.place), so that a gather and a merge of the same x
    copy it once."""

    @staticmethod
    def forward(ctx, x, indices, ops, batch_first, x_sent=None):
        _check(x, indices, batch_first)
        idx = ops.place(indices)
        part = ops.empty(_part_shape(x, indices, batch_first), x.dtype)
        ops.client.gather_tokens(x_sent if x_sent is not None else ops.place(x), idx, out=part,
                                 batch_first=batch_first)
        ctx.save_for_backward(idx)
        ctx.ops, ctx.batch_first, ctx.x_shape = ops, batch_first, x.shape
        return part

    @staticmethod
    @once_differentiable
    def backward(ctx, dpart):
        (idx,) = ctx.saved_tensors
        dx = None
        if ctx.needs_input_grad[0]:
            ops = ctx.ops
            dx = ops.empty(ctx.x_shape, dpart.dtype)
            ops.client.merge_tokens(ops.zeros(ctx.x_shape, dpart.dtype), ops.place(dpart), idx,
                                    out=dx, batch_first=ctx.batch_first)
        return dx, None, None, None, None


class MergeTokens(torch.autograd.Function):
    """apply(x, layer, indices, ops, batch_first, x_sent=None) -> out:
    x with the rows at `indices` replaced by `layer`'s (x is not written)."""

    @staticmethod
    def forward(ctx, x, layer, indices, ops, batch_first, x_sent=None):
        _check(x, indices, batch_first)
        if tuple(layer.shape) != _part_shape(x, indices, batch_first) or layer.dtype != x.dtype:
            raise ValueError("layer must be %s %s, got %s %s" % (
                _part_shape(x, indices, batch_first), x.dtype, tuple(layer.shape), layer.dtype))
        idx = ops.place(indices)
        out = ops.empty(x.shape, x.dtype)
        ops.client.merge_tokens(x_sent if x_sent is not None else ops.place(x), ops.place(layer),
                                idx, out=out, batch_first=batch_first)
        ctx.save_for_backward(idx)
        ctx.ops, ctx.batch_first, ctx.layer_shape = ops, batch_first, layer.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (idx,) = ctx.saved_tensors
        ops = ctx.ops
        if not any(ctx.needs_input_grad[:2]):
            return None, None, None, None, None, None
        g = ops.place(grad)
        layer_grad = ops.empty(ctx.layer_shape, grad.dtype)
        if ctx.needs_input_grad[0]:
            rest_grad = ops.empty(grad.shape, grad.dtype)
            ops.client.split_tokens(g, idx, layer_grad=layer_grad, rest_grad=rest_grad,
                                    batch_first=ctx.batch_first)
        else:
            rest_grad = None
            ops.client.gather_tokens(g, idx, out=layer_grad, batch_first=ctx.batch_first)
        return (rest_grad, layer_grad if ctx.needs_input_grad[1] else None,
                None, None, None, None)


def gather_tokens(client, x, indices, *, batch_first=True, arena=None):
    """Differentiable GatherTokens: part[b, r] = x[b, indices[b, r]]
    ([B,S,C] -> [B,R,C]; [S,B,C] -> [R,B,C] with batch_first=False).
    Backward: MergeTokens of the gradient into zeros. `indices` must be
    unique within each row."""
    return GatherTokens.apply(x, indices, Ops(client, arena), bool(batch_first))


def merge_tokens(client, x, layer, indices, *, batch_first=True, arena=None):
    """Differentiable MergeTokens: x with row indices[b, r] replaced by
    layer[b, r] (a new tensor). Backward: SplitTokens (dx = rest_grad,
    dlayer = layer_grad)."""
    return MergeTokens.apply(x, layer, indices, Ops(client, arena), bool(batch_first))


# ----------------------------------------------- pure-PyTorch reference --

def _flat_rows(indices, seq, batch, batch_first):
    """Row numbers of x.reshape(-1, C) in the part's row-major order."""
    idx = indices.long()
    if batch_first:  # x[b, s] is row b*S + s; part order (b, r)
        return (torch.arange(batch).unsqueeze(1) * seq + idx).reshape(-1)
    return (idx.t() * batch + torch.arange(batch)).reshape(-1)  # x[s, b]: s*B + b; order (r, b)


def gather_tokens_reference(x, indices, *, batch_first=True):
    """gather_tokens in plain PyTorch (index_select on x viewed as rows)."""
    seq, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    rows = _flat_rows(indices, seq, batch, batch_first)
    return x.reshape(-1, x.shape[2]).index_select(0, rows).reshape(
        _part_shape(x, indices, batch_first))


def merge_tokens_reference(x, layer, indices, *, batch_first=True):
    """merge_tokens in plain PyTorch (index_copy on x viewed as rows)."""
    seq, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    rows = _flat_rows(indices, seq, batch, batch_first)
    return x.reshape(-1, x.shape[2]).index_copy(0, rows, layer.reshape(-1, x.shape[2])).reshape(
        x.shape)
