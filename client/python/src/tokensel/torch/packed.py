"""Random-LTD for packed (THD) batches: the hidden state is [T, ...] with
the sequences' boundaries in `cu_seqlens` (int32 [N+1], Transformer
Engine's and flash-attn's varlen layout), and each wrapped layer runs on a
reproducible uniform subset of every sequence's tokens (SamplePackedTokens,
docs/ops.md section 11).

    ltd = PackedRandomLTD(client, FixedLinearSchedule(64, 128, require_steps=1000),
                          seed=1234, arena=arena, positions_name="position_ids")
    convert_to_random_ltd(model, Block, ltd)   # Block(x [T,C], cu_seqlens=..., ...)
    for step in range(steps):
        ltd.update(step)
        loss = model(x, cu_seqlens=cu).sum(); loss.backward()

Per wrapped layer, in training and while the keep fraction is below 1:
sequence i keeps r_i = min(n_i, max(min_tokens, ceil(n_i * keep))) of its
n_i tokens, keep = schedule value / schedule max_value (or a fixed
(num, den)). The layer is called on the kept tokens [T', ...] with its
`cu_seqlens` keyword replaced by the kept tokens' boundaries, optionally
their original positions within their sequences (for RoPE) and the longest
kept sequence (flash-attn's max_seqlen); its output is merged back, and
dropped tokens skip the layer unchanged. Padding tokens (cu[N] <= t < T)
are never kept. The first wrapped layer of a forward samples the ids of
every layer at once, from (seed, step, layer, sequence) alone: a recomputed
forward gets the same ids, and a sequence's ids do not depend on the rest
of the pack.

Gradients are exact and out of place (tokensel.torch.functions: the pack is
one row of GatherTokens / MergeTokens). Sizing the outputs needs T', so a
cu_seqlens on a GPU is read on the host once per forward (one sync).
"""
import torch

from tokensel.ops import packed_kept_tokens
from tokensel.torch.functions import GatherTokens, MergeTokens, Ops
from tokensel.torch.ltd import FixedLinearSchedule, RandomLayerTokenDrop


class PackedRandomLTD:
    """The state the packed Random-LTD layers of one model share.

    `keep`: a FixedLinearSchedule (keep fraction = its value / max_value at
    the step) or a fixed fraction (num, den). `min_tokens`: the floor of
    every r_i (capped at n_i). `cu_seqlens_name`: the layers' keyword that
    carries cu_seqlens (required on every call); `positions_name`: keyword
    that receives the kept tokens' positions within their sequences (int64
    [T']); `max_seqlen_name`: keyword that receives the longest kept
    sequence (int). `arena`: where tensors live (tokensel.torch.Arena);
    None stages them inline."""

    def __init__(self, client, keep, *, seed, arena=None, min_tokens=0,
                 cu_seqlens_name="cu_seqlens", positions_name=None, max_seqlen_name=None):
        if isinstance(keep, FixedLinearSchedule):
            self.schedule, self._fixed = keep, None
        else:
            num, den = (int(v) for v in keep)
            if den < 1 or not 0 <= num <= den:
                raise ValueError("keep must be a FixedLinearSchedule or (num, den) with "
                                 "0 <= num <= den, den >= 1; got %r" % (keep,))
            self.schedule, self._fixed = None, (num, den)
        if int(min_tokens) < 0:
            raise ValueError("min_tokens must be >= 0, got %d" % min_tokens)
        self.client, self.seed, self.min_tokens = client, int(seed), int(min_tokens)
        self.ops = Ops(client, arena)
        self.cu_seqlens_name, self.positions_name = cu_seqlens_name, positions_name
        self.max_seqlen_name = max_seqlen_name
        self.num_layers = 0  # set by convert_to_random_ltd
        self.global_step = None
        self.sample_step = None
        self.samples = 0  # SamplePackedTokens calls made (each covers all layers)
        self._state = None  # (key, sample)

    def wrap(self, layer, ltd_layer_id):
        return PackedRandomLayerTokenDrop(layer, self, ltd_layer_id)

    def update(self, global_step, sample_step=None):
        """Start of a training step: the keep fraction of `global_step` and
        the step the ids are drawn from (`sample_step`, default
        global_step). Returns (num, den)."""
        self.global_step = int(global_step)
        self.sample_step = self.global_step if sample_step is None else int(sample_step)
        if self.schedule is not None:
            self.schedule.update_seq(self.global_step)
        return self.keep()

    def keep(self):
        if self.schedule is None:
            return self._fixed
        return self.schedule.get_current_seq(), self.schedule.max_value

    def sample(self, cu_seqlens, total_tokens):
        """SamplePackedTokens for all layers at (seed, sample_step):
        PackedSample(cu_seqlens_kept [N+1], ids [L,T'] int32, positions
        [L,T'] int32 or None, max_seqlen_kept)."""
        if self.sample_step is None:
            raise RuntimeError("PackedRandomLTD.update(step) was not called before the forward")
        num, den = self.keep()
        host_cu = cu_seqlens.detach().to("cpu", torch.int32)  # one sync for a GPU cu_seqlens
        kept = packed_kept_tokens(host_cu, num, den, self.min_tokens)
        if kept is None:  # bad cu_seqlens: the server names the sequence
            kept = 0
        ops, layers = self.ops, self.num_layers
        cu_kept = ops.empty(tuple(host_cu.shape), torch.int32)
        ids = ops.empty((layers, kept), torch.int32)
        positions = ops.empty((layers, kept), torch.int32) if self.positions_name else False
        res = self.client.sample_packed_tokens(
            ops.place(host_cu), num, den, layers=layers, seed=self.seed, step=self.sample_step,
            min_tokens=self.min_tokens, total_tokens=total_tokens, kept_tokens=kept,
            cu_seqlens_kept=cu_kept, ids=ids, positions=positions)
        self.samples += 1
        cu_kept = torch.as_tensor(res.cu_seqlens_kept)
        lengths = cu_kept[1:] - cu_kept[:-1]
        max_seqlen = int(lengths.max()) if lengths.numel() else 0
        device = cu_seqlens.device  # what the layer gets lives where its cu_seqlens did
        positions = None if res.positions is None else torch.as_tensor(res.positions).to(device)
        return PackedSample(cu_kept.to(device), torch.as_tensor(res.ids), positions, max_seqlen)

    def sample_for(self, layer_id, cu_seqlens, total_tokens):
        """The step's sample for Random-LTD layer `layer_id`: layer 0 samples
        anew on every forward (a recomputed one too: same (seed, step), same
        ids); the others reuse its sample when it is of this step and pack."""
        key = (self.seed, self.sample_step, self.keep(), self.min_tokens, total_tokens,
               cu_seqlens.data_ptr(), tuple(cu_seqlens.shape), cu_seqlens.device)
        if layer_id == 0 or self._state is None or self._state[0] != key:
            self._state = (key, self.sample(cu_seqlens, total_tokens))
        return self._state[1]

    def state_dict(self):
        return {"schedule": None if self.schedule is None else self.schedule.state_dict(),
                "keep": self._fixed, "seed": self.seed, "min_tokens": self.min_tokens,
                "global_step": self.global_step, "sample_step": self.sample_step}

    def load_state_dict(self, state):
        if self.schedule is not None and state.get("schedule") is not None:
            self.schedule.load_state_dict(state["schedule"])
        self.seed, self.min_tokens = int(state["seed"]), int(state["min_tokens"])
        self.global_step, self.sample_step = state["global_step"], state["sample_step"]
        self._state = None


class PackedSample:
    __slots__ = ("cu_seqlens_kept", "ids", "positions", "max_seqlen_kept")

    def __init__(self, cu_seqlens_kept, ids, positions, max_seqlen_kept):
        self.cu_seqlens_kept, self.ids = cu_seqlens_kept, ids
        self.positions, self.max_seqlen_kept = positions, max_seqlen_kept


class PackedRandomLayerTokenDrop(RandomLayerTokenDrop):
    """Wraps `layer` (called as layer(hidden_states [T, ...], *args,
    cu_seqlens=..., **kwargs), returning a tensor or a tuple whose element 0
    is the hidden states) as packed Random-LTD layer `ltd_layer_id` of
    `ltd` (a PackedRandomLTD). State-dict keys as RandomLayerTokenDrop's."""

    def forward(self, hidden_states, *args, **kwargs):
        ltd = self.ltd
        name = ltd.cu_seqlens_name
        if kwargs.get(name) is None:
            raise ValueError("a packed Random-LTD layer needs its %r keyword (int32 [N+1])" % name)
        num, den = ltd.keep()
        if not self.training or num >= den:
            return self.random_ltd_layer(hidden_states, *args, **kwargs)
        total = hidden_states.shape[0]
        sample = ltd.sample_for(self.ltd_layer_id, kwargs[name], total)
        ops = ltd.ops
        rows = hidden_states.reshape(1, total, -1)  # the pack is one row of [B,S,C]
        ids = sample.ids[self.ltd_layer_id].unsqueeze(0)
        rows_sent = ops.place(rows)  # one copy for both ops
        part = GatherTokens.apply(rows, ids, ops, True, rows_sent)
        kwargs[name] = sample.cu_seqlens_kept
        if ltd.positions_name:
            kwargs[ltd.positions_name] = sample.positions[self.ltd_layer_id].long()
        if ltd.max_seqlen_name:
            kwargs[ltd.max_seqlen_name] = sample.max_seqlen_kept
        outputs = self.random_ltd_layer(part.reshape((ids.shape[1],) + hidden_states.shape[1:]),
                                        *args, **kwargs)
        layer_out = outputs[0] if isinstance(outputs, tuple) else outputs
        merged = MergeTokens.apply(rows, layer_out.reshape(part.shape), ids, ops, True,
                                   rows_sent).reshape(hidden_states.shape)
        if isinstance(outputs, tuple):
            return (merged,) + tuple(outputs[1:])
        return merged
