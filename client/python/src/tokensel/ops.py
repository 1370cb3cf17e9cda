"""Request builders for the operators (contracts: docs/ops.md).

`OpBuilder` methods return a `PreparedOp`; `Client` runs one with its RPC
(`client.gather_tokens(...)`) or several in one round trip
(`client.execute([client.ops.gather_tokens(...), ...])`). Every result is
what the matching Client method returns.

Argument conventions: inputs are numpy arrays, CPU torch tensors (inline or,
inside a registered buffer, by reference) or registered CUDA tensors.
Output arguments: None = returned inline; an array = written there (in place
for registered buffers, else the inline result is copied into it). Optional
outputs (`inverse`, `bert_mask`, `gpt_mask`) take False (not computed), True
(returned inline) or an array.
"""
import collections

import numpy as np

from tokensel.tensors import Codec, InPlace, decode
from tokensel.v1 import tokensel_pb2 as pb

SortResult = collections.namedtuple("SortResult", ["ids", "inverse"])
SampleResult = collections.namedtuple("SampleResult", ["ids", "inverse", "bert_mask", "gpt_mask"])
SplitResult = collections.namedtuple("SplitResult", ["layer_grad", "rest_grad"])
PackedSampleResult = collections.namedtuple(
    "PackedSampleResult", ["cu_seqlens_kept", "ids", "positions", "inverse", "out"])

SEGMENT_OUTPUTS = ("q_seqlen", "q_offset", "kv_seqlen", "kv_offset", "q_packed_seqlens",
                   "q_packed_offsets", "q_cu_seqlens", "kv_packed_seqlens",
                   "kv_packed_offsets", "kv_cu_seqlens")
_MASKS = {"padding": pb.ATTN_MASK_PADDING, "causal": pb.ATTN_MASK_CAUSAL,
          "causal_bottom_right": pb.ATTN_MASK_CAUSAL_BOTTOM_RIGHT}


class PreparedOp:
    """One operator request: `field` names it in tokensel.v1.Op, `rpc` is the
    unary method, `finish(OpResponse)` builds the Python result."""

    def __init__(self, field, rpc, request, finish, stats=None):
        self.field = field
        self.rpc = rpc
        self.request = request
        self._finish = finish
        self._stats = stats

    def finish(self, response):
        if self._stats is not None:
            inline = [len(o.tensor.inline_data) for o in response.outputs
                      if o.tensor.WhichOneof("data") == "inline_data"]
            self._stats._add(inline_bytes_received=sum(inline), inline_tensors_received=len(inline))
        return self._finish({o.name: decode(o.tensor) for o in response.outputs})


def _put(message, field, tensor):
    sub = getattr(message, field)
    sub.CopyFrom(tensor)
    sub.SetInParent()  # present even when empty (= "return it inline")


class OpBuilder:
    """Builds requests against one client's registered buffers."""

    def __init__(self, find_region, stats=None):
        self._codec = Codec(find_region, stats)
        self.stats = self._codec.stats

    def _prepared(self, field, rpc, req, finish):
        return PreparedOp(field, rpc, req, finish, self.stats)

    def _in(self, req, field, x):
        _put(req, field, self._codec.input(x, field))

    def _out(self, req, field, x):
        """Required output (None = inline). Returns its sink or None."""
        tensor, sink = self._codec.output(x, field)
        _put(req, field, tensor)
        return sink

    def _opt_out(self, req, field, x):
        """Optional output: False/None = absent, True = inline, array."""
        if x is None or x is False:
            return False
        return self._out(req, field, None if x is True else x)

    @staticmethod
    def _result(outputs, name, sink):
        """An output's value: False = not requested, sink = user's array."""
        if sink is False:
            return None
        if sink is None:
            return outputs.get(name)
        return sink.deliver(outputs.get(name))

    def sort_tokens(self, ids, original_tokens, *, out=None, inverse=False):
        """Sorts each row of `ids` ([..., R], int32/int64, unique in [0, S))
        ascending: in place, or into `out`. `inverse` ([..., S] int32) maps
        position -> rank or -1. Returns SortResult(ids, inverse): `ids` is
        `out` if given, else `ids` itself (updated in place; a list or other
        non-array input comes back as a new array)."""
        req = pb.SortTokensRequest(original_tokens=int(original_tokens))
        self._in(req, "ids", ids)
        if out is not None:
            sink = self._out(req, "out", out)
        elif req.ids.WhichOneof("data") == "inline_data" and hasattr(ids, "shape"):
            sink = InPlace(ids)  # the server returns the sorted copy as "out"
        else:
            sink = None  # by reference: sorted in place by the server
        inv_sink = self._opt_out(req, "inverse", inverse)

        def finish(o):
            sorted_ids = sink.deliver(o.get("out")) if sink else o.get("out", ids)
            return SortResult(sorted_ids, self._result(o, "inverse", inv_sink))
        return self._prepared("sort_tokens", "SortTokens", req, finish)

    def gather_tokens(self, activations, indices, *, out=None, batch_first=True):
        """out[b, r] = activations[b, indices[b, r]] ([B,S,C] -> [B,R,C]);
        seq-first ([S,B,C] -> [R,B,C]) with batch_first=False."""
        req = pb.GatherTokensRequest(batch_first=bool(batch_first))
        self._in(req, "activations", activations)
        self._in(req, "indices", indices)
        sink = self._out(req, "out", out)
        return self._prepared("gather_tokens", "GatherTokens", req,
                          lambda o: self._result(o, "out", sink))

    def scatter_tokens(self, all, layer, indices, *, batch_first=True):  # noqa: A002
        """all[b, indices[b, r]] = layer[b, r], in place on `all` (returned)."""
        req = pb.ScatterTokensRequest(batch_first=bool(batch_first))
        tensor, sink = self._codec.output(all, "all")
        self._in(req, "all", all) if sink.copy else _put(req, "all", tensor)
        self._in(req, "layer", layer)
        self._in(req, "indices", indices)
        return self._prepared("scatter_tokens", "ScatterTokens", req,
                          lambda o: sink.deliver(o.get("all")))

    def gather_bert_mask(self, mask, indices, *, out=None):
        """out[l,b,h,i,j] = mask[b,h,indices[l,b,i] (row; 0 if Sq=1),
        indices[l,b,j]]: [B,H,Sq,S] x [L,B,R] -> [L,B,H,R,R]."""
        req = pb.GatherBertMaskRequest()
        self._in(req, "mask", mask)
        self._in(req, "indices", indices)
        sink = self._out(req, "out", out)
        return self._prepared("gather_bert_mask", "GatherBertMask", req,
                          lambda o: self._result(o, "out", sink))

    def slice_gpt_mask(self, mask, retained_tokens=None, *, out=None):
        """out = mask[:, :, :R, :R]: R is `retained_tokens`, or when that is
        None the last dimension of `out` (one of the two is required)."""
        if retained_tokens is None:
            if out is None or not hasattr(out, "shape") or len(out.shape) == 0:
                raise ValueError("slice_gpt_mask needs retained_tokens or an `out` array "
                                 "to take R from")
            retained_tokens = out.shape[-1]
        req = pb.SliceGptMaskRequest(retained_tokens=int(retained_tokens))
        self._in(req, "mask", mask)
        sink = self._out(req, "out", out)
        return self._prepared("slice_gpt_mask", "SliceGptMask", req,
                          lambda o: self._result(o, "out", sink))

    def segment_seqlens(self, segment_ids_q, max_segments, *, segment_pos_q=None,
                        segment_ids_kv=None, segment_pos_kv=None, mask="padding",
                        packed=False, out=None):
        """THD bookkeeping from segment ids ([B,T], 0 = padding, ids 1..NS in
        runs). Returns a dict of every output that applies ("q_seqlen",
        "q_offset", kv_* with segment_ids_kv, packed ones with packed=True);
        `out` maps output names to arrays to write."""
        if mask not in _MASKS:
            raise ValueError("mask must be one of %s, got %r" % (sorted(_MASKS), mask))
        req = pb.SegmentSeqlensRequest(max_segments=int(max_segments), mask=_MASKS[mask],
                                       packed=bool(packed))
        self._in(req, "segment_ids_q", segment_ids_q)
        for field, x in (("segment_pos_q", segment_pos_q), ("segment_ids_kv", segment_ids_kv),
                         ("segment_pos_kv", segment_pos_kv)):
            if x is not None:
                self._in(req, field, x)
        out = dict(out or {})
        unknown = set(out) - set(SEGMENT_OUTPUTS)
        if unknown:
            raise ValueError("unknown segment_seqlens outputs %s" % sorted(unknown))
        sinks = {name: self._out(req, name, x) for name, x in out.items()}

        def finish(o):
            result = dict(o)
            result.update({name: sink.deliver(o.get(name)) for name, sink in sinks.items()})
            return result
        return self._prepared("segment_seqlens", "SegmentSeqlens", req, finish)

    def sample_tokens(self, layers, batch, original_tokens, retained_tokens, seed, step, *,
                      ids=None, inverse=False, mask=None, bert_mask=False, gpt_mask=False):
        """R of S positions per (layer, batch) row, seeded (Philox; same seed
        and step -> same ids), ascending. Returns SampleResult(ids [L,B,R],
        inverse [L,B,S], bert_mask [L,B,H,R,R], gpt_mask [B,H,R,R]) with None
        for what was not requested; masks need `mask`."""
        req = pb.SampleTokensRequest(layers=int(layers), batch=int(batch),
                                     original_tokens=int(original_tokens),
                                     retained_tokens=int(retained_tokens),
                                     seed=int(seed), step=int(step))
        if mask is not None:
            self._in(req, "mask", mask)
        sinks = {"ids": self._out(req, "ids", ids)}
        for field, x in (("inverse", inverse), ("bert_mask", bert_mask), ("gpt_mask", gpt_mask)):
            sinks[field] = self._opt_out(req, field, x)
        return self._prepared("sample_tokens", "SampleTokens", req, lambda o: SampleResult(
            *(self._result(o, f, sinks[f]) for f in SampleResult._fields)))

    def topk_tokens(self, scores, retained_tokens, *, ids=None):
        """Positions of the R largest scores per row (ties to the lower
        position; NaN lowest), ascending: [..., S] -> [..., R]."""
        req = pb.TopKTokensRequest(retained_tokens=int(retained_tokens))
        self._in(req, "scores", scores)
        sink = self._out(req, "ids", ids)
        return self._prepared("top_k_tokens", "TopKTokens", req,
                          lambda o: self._result(o, "ids", sink))

    def merge_tokens(self, x, layer, indices, *, out=None, batch_first=True):
        """out[b, s] = layer[b, r] where indices[b, r] == s, else x[b, s]
        ([B,S,C] x [B,R,C] -> [B,S,C]; seq-first with batch_first=False):
        Random-LTD's scatter without the clone. `out=x` with x in a
        registered buffer merges in place."""
        req = pb.MergeTokensRequest(batch_first=bool(batch_first))
        self._in(req, "x", x)
        self._in(req, "layer", layer)
        self._in(req, "indices", indices)
        sink = self._out(req, "out", out)
        return self._prepared("merge_tokens", "MergeTokens", req,
                          lambda o: self._result(o, "out", sink))

    def split_tokens(self, grad, indices, *, layer_grad=None, rest_grad=None, batch_first=True):
        """MergeTokens' adjoint: layer_grad = grad gathered at `indices`
        ([B,R,C]), rest_grad = grad with those rows zeroed ([B,S,C]).
        `rest_grad=grad` with grad in a registered buffer zeroes in place.
        Returns SplitResult(layer_grad, rest_grad)."""
        req = pb.SplitTokensRequest(batch_first=bool(batch_first))
        self._in(req, "grad", grad)
        self._in(req, "indices", indices)
        layer_sink = self._out(req, "layer_grad", layer_grad)
        rest_sink = self._out(req, "rest_grad", rest_grad)
        return self._prepared("split_tokens", "SplitTokens", req, lambda o: SplitResult(
            self._result(o, "layer_grad", layer_sink), self._result(o, "rest_grad", rest_sink)))

    def sample_packed_tokens(self, cu_seqlens, keep_num, keep_den, *, layers=1, seed=0, step=0,
                             min_tokens=0, total_tokens=None, kept_tokens=None, activations=None,
                             cu_seqlens_kept=None, ids=None, positions=False, inverse=False,
                             out=False):
        """Random-LTD for a packed (THD) batch: per sequence i of `cu_seqlens`
        (int32 [N+1]) a reproducible uniform r_i-subset of its n_i tokens,
        r_i = min(n_i, max(min_tokens, ceil(n_i * keep_num / keep_den))).
        Returns PackedSampleResult(cu_seqlens_kept [N+1], ids [L,T'] (positions
        in the pack, ascending per sequence), positions [L,T'] (ids - cu[i],
        for RoPE), inverse [L,T] (rank or -1), out [T',C] (the kept rows of
        `activations`, layers == 1)); None for what was not requested.
        T is `total_tokens`, else activations' dim 0, else (a host
        cu_seqlens) its last value: no padding. T' (kept_tokens) is
        computed here from a host cu_seqlens when not given (a CUDA one in a
        registered buffer needs it passed when ids/positions/out come back
        inline)."""
        req = pb.SamplePackedTokensRequest(
            keep_num=int(keep_num), keep_den=int(keep_den), min_tokens=int(min_tokens),
            layers=int(layers), seed=int(seed), step=int(step))
        if total_tokens is None and activations is None:
            host = _host_array(cu_seqlens)
            if host is not None and host.ndim == 1 and host.size:
                total_tokens = int(host[-1])
        if total_tokens is not None:
            req.total_tokens = int(total_tokens)
        if kept_tokens is None:
            kept_tokens = packed_kept_tokens(cu_seqlens, keep_num, keep_den, min_tokens)
        if kept_tokens is not None:
            req.kept_tokens = int(kept_tokens)
        self._in(req, "cu_seqlens", cu_seqlens)
        if activations is not None:
            self._in(req, "activations", activations)
        sinks = {"cu_seqlens_kept": self._out(req, "cu_seqlens_kept", cu_seqlens_kept),
                 "ids": self._out(req, "ids", ids)}
        for field, x in (("positions", positions), ("inverse", inverse), ("out", out)):
            sinks[field] = self._opt_out(req, field, x)
        return self._prepared("sample_packed_tokens", "SamplePackedTokens", req,
                              lambda o: PackedSampleResult(
                                  *(self._result(o, f, sinks[f])
                                    for f in PackedSampleResult._fields)))


def _host_array(x):
    """x as a numpy array when it lives in host memory (numpy, CPU torch),
    else None (a CUDA tensor: reading it would synchronize its stream)."""
    if isinstance(x, np.ndarray):
        return x
    device = getattr(x, "device", None)
    if device is not None and getattr(device, "type", None) == "cpu" and hasattr(x, "numpy"):
        return x.numpy()
    return None


def packed_kept_tokens(cu_seqlens, keep_num, keep_den, min_tokens=0):
    """T' = sum of r_i for host `cu_seqlens` (docs/ops.md section 11), exact
    for any keep_num <= keep_den; None when cu_seqlens is not on the host or
    the rule is invalid (the server then reports the error)."""
    cu = _host_array(cu_seqlens)
    num, den, floor = int(keep_num), int(keep_den), int(min_tokens)
    if cu is None or cu.ndim != 1 or den < 1 or not 0 <= num <= den or floor < 0:
        return None
    n = np.diff(cu.astype(np.int64))
    if n.size and n.min() < 0:
        return None  # bad data: the server names it
    if den < 2**31:
        want = (n * num + den - 1) // den
    else:  # exact with Python integers
        want = np.array([(int(v) * num + den - 1) // den for v in n], dtype=np.int64)
    return int(np.minimum(n, np.maximum(want, floor)).sum())


OP_NAMES = ("sort_tokens", "gather_tokens", "scatter_tokens", "gather_bert_mask",
            "slice_gpt_mask", "segment_seqlens", "sample_tokens", "topk_tokens", "merge_tokens",
            "split_tokens", "sample_packed_tokens")
