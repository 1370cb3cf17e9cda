"""Random-LTD (random layerwise token dropping) on tokensel: DeepSpeed's
RandomLayerTokenDrop, its fixed_linear schedule and convert_to_random_ltd,
with the data movement and its gradients on the sidecar.

    client = tokensel.Client(target); arena = Arena(client)
    ltd = RandomLTD(client, FixedLinearSchedule(16, 48, require_steps=40, seq_per_step=8),
                    seed=1234, arena=arena, positions_name="positions")
    convert_to_random_ltd(model, Block, ltd, layer_ids=[1, 2])
    for step in range(steps):
        ltd.update(step)           # schedule -> R, and the step the ids come from
        loss = model(batch).loss; loss.backward(); ...

Per wrapped layer, in training and while R < S: the first Random-LTD layer
of a forward samples the ids of all L layers at once (SampleTokens, [L,B,R]
ascending); each layer gathers its R tokens, runs the layer on them, and
merges the result back (dropped tokens skip the layer unchanged). Otherwise
the layer runs on every token.

What DeepSpeed lacks, kept here:
- the ids are a function of (seed, step, layer, batch row) (Philox on the
  server), not of a global RNG: a recomputed forward (torch.utils.checkpoint)
  and every tensor-parallel rank get the same ids, with no RNG state to
  restore. Give data-parallel ranks different seeds if they should drop
  different tokens; with gradient accumulation pass a per-micro-batch
  `sample_step` to update().
- the layer can be told the original positions of its tokens (for RoPE):
  with `positions_name`, that keyword argument gets the layer's ids as int64
  [B,R] (a copy: the layer may keep or change it).
- exact gradients out of place (tokensel.torch.functions), masks gathered
  per layer where DeepSpeed's kernel used layer 0's, schedule values never
  below min_value.
"""
import math

import torch
from torch import nn

from tokensel.torch.functions import GatherTokens, MergeTokens, Ops


class FixedLinearSchedule:
    """DeepSpeed's RandomLTDScheduler with schedule_type "fixed_linear": the
    retained-token count R grows from `min_value` to `max_value` over
    `require_steps` steps, in multiples of `seq_per_step`:
        R(step) = min(max, v - v % seq_per_step),
        v = floor(step / require_steps * (max - min) + min),
    and, unlike DeepSpeed, never below min_value (its rounding can reach 0).
    Like DeepSpeed it counts the layer-tokens consumed (for `total_layers`
    layers of which `ltd_layers` drop tokens, `global_batch_size`
    sequences per step). state_dict()/load_state_dict() carry it through a
    checkpoint."""

    def __init__(self, min_value, max_value, require_steps, seq_per_step=1, *,
                 total_layers=1, ltd_layers=1, global_batch_size=1):
        if not 1 <= min_value <= max_value:
            raise ValueError("need 1 <= min_value <= max_value, got %d, %d"
                             % (min_value, max_value))
        if require_steps < 1 or seq_per_step < 1:
            raise ValueError("require_steps and seq_per_step must be >= 1")
        self.min_value, self.max_value = int(min_value), int(max_value)
        self.require_steps, self.seq_per_step = int(require_steps), int(seq_per_step)
        self.total_layers, self.ltd_layers = int(total_layers), int(ltd_layers)
        self.global_batch_size = int(global_batch_size)
        self.current_value = self.min_value
        self.current_steps = -1
        self.consumed_layer_tokens = 0

    def value(self, step):
        v = math.floor(float(step) / self.require_steps * (self.max_value - self.min_value)
                       + self.min_value)
        v -= v % self.seq_per_step
        return max(self.min_value, min(v, self.max_value))

    def update_seq(self, step):
        """DeepSpeed's update_seq(global_steps): the R of `step`."""
        if self.current_value < self.max_value:
            self.current_value = self.value(step)
        if step != self.current_steps:
            self.consumed_layer_tokens += self.global_batch_size * (
                self.current_value * self.ltd_layers
                + self.max_value * (self.total_layers - self.ltd_layers))
            self.current_steps = step
        return self.current_value

    def get_current_seq(self):
        return self.current_value

    def state_dict(self):
        return {"consumed_layer_tokens": self.consumed_layer_tokens,
                "current_steps": self.current_steps, "current_value": self.current_value,
                "min_value": self.min_value, "max_value": self.max_value}

    def load_state_dict(self, state):
        self.consumed_layer_tokens = int(state["consumed_layer_tokens"])
        self.current_steps = int(state["current_steps"])
        self.current_value = int(state["current_value"])
        self.min_value = int(state["min_value"])
        self.max_value = int(state["max_value"])


class RandomLTD:
    """The state the Random-LTD layers of one model share (DeepSpeed keeps it
    in the scheduler): schedule, seed, step and the step's sampled ids.

    `model_type`: "decoder" (GPT) or "encoder" (BERT); `mask_name`: the
    layer's attention-mask keyword (None: no mask is touched); `mask_mode`:
    "slice" (DeepSpeed's GPT handling: every layer gets mask[:, :, :R, :R],
    right only for a purely causal mask, since ids are sorted) or "gather"
    (the exact row and column gather, per layer; a [B,H,1,S] padding mask is
    fine), default "slice" for decoders and "gather" for encoders;
    `batch_first`: hidden states [B,S,C] (DeepSpeed "batch_seq_dim") or
    [S,B,C] ("seq_batch_dim"); `positions_name`: keyword that receives the
    kept tokens' original positions. `arena`: where tensors live (see
    tokensel.torch.Arena); None stages them inline."""

    def __init__(self, client, schedule, *, seed, arena=None, model_type="decoder",
                 mask_name=None, mask_mode=None, batch_first=True, positions_name=None):
        if model_type not in ("decoder", "encoder"):
            raise ValueError("model_type must be 'decoder' or 'encoder', got %r" % (model_type,))
        mask_mode = mask_mode or ("slice" if model_type == "decoder" else "gather")
        if mask_mode not in ("slice", "gather"):
            raise ValueError("mask_mode must be 'slice' or 'gather', got %r" % (mask_mode,))
        self.client, self.schedule, self.seed = client, schedule, int(seed)
        self.ops = Ops(client, arena)
        self.model_type, self.mask_name, self.mask_mode = model_type, mask_name, mask_mode
        self.batch_first, self.positions_name = bool(batch_first), positions_name
        self.num_layers = 0  # set by convert_to_random_ltd
        self.global_step = None
        self.sample_step = None
        self.samples = 0  # SampleTokens calls made (each covers all layers)
        self._state = None  # (key, ids [L,B,R], masks)

    def wrap(self, layer, ltd_layer_id):
        return RandomLayerTokenDrop(layer, self, ltd_layer_id)

    def update(self, global_step, sample_step=None):
        """Start of a training step: the schedule's R for `global_step`, and
        the step the ids are drawn from (`sample_step`, default global_step).
        Returns R."""
        self.global_step = int(global_step)
        self.sample_step = self.global_step if sample_step is None else int(sample_step)
        return self.schedule.update_seq(self.global_step)

    def retained_tokens(self):
        return self.schedule.get_current_seq()

    def sample(self, batch, seq, retained, mask=None):
        """SampleTokens for all layers at (seed, sample_step): (ids int32
        [L,B,R], masks) with masks None, one [B,H,R,R] ("slice") or
        [L,B,H,R,R] ("gather")."""
        if self.sample_step is None:
            raise RuntimeError("RandomLTD.update(step) was not called before the forward")
        ops = self.ops
        layers = self.num_layers
        ids = ops.empty((layers, batch, retained), torch.int32)
        kwargs = {}
        if mask is not None:
            mask = ops.place(mask)
            kwargs["mask"] = mask
            if self.mask_mode == "slice":
                kwargs["gpt_mask"] = ops.empty(mask.shape[:2] + (retained, retained), mask.dtype)
            else:
                kwargs["bert_mask"] = ops.empty((layers,) + mask.shape[:2] + (retained, retained),
                                                mask.dtype)
        res = self.client.sample_tokens(layers, batch, seq, retained, self.seed, self.sample_step,
                                        ids=ids, **kwargs)
        self.samples += 1
        return ids, res.gpt_mask if self.mask_mode == "slice" else res.bert_mask

    def ids_for(self, layer_id, batch, seq, retained, mask=None):
        """(ids [B,R], mask for the layer or None) of Random-LTD layer
        `layer_id`. Layer 0 samples anew on every forward (a recomputed one
        too: same ids, same (seed, step)); the others reuse its sample when
        it is of this step and shape."""
        key = (self.seed, self.sample_step, batch, seq, retained,
               None if mask is None else (mask.data_ptr(), tuple(mask.shape), mask.dtype))
        if layer_id == 0 or self._state is None or self._state[0] != key:
            ids, masks = self.sample(batch, seq, retained, mask)
            self._state = (key, ids, masks)
        _, ids, masks = self._state
        if masks is not None and self.mask_mode == "gather":
            masks = masks[layer_id]
        return ids[layer_id], masks

    def state_dict(self):
        return {"schedule": self.schedule.state_dict(), "seed": self.seed,
                "global_step": self.global_step, "sample_step": self.sample_step}

    def load_state_dict(self, state):
        self.schedule.load_state_dict(state["schedule"])
        self.seed = int(state["seed"])
        self.global_step, self.sample_step = state["global_step"], state["sample_step"]
        self._state = None


class RandomLayerTokenDrop(nn.Module):
    """Wraps `layer` (called as layer(hidden_states, *args, **kwargs),
    returning a tensor or a tuple whose element 0 is the hidden states)
    as Random-LTD layer number `ltd_layer_id` of `ltd` (a RandomLTD)."""

    def __init__(self, layer, ltd, ltd_layer_id):
        super().__init__()
        self.random_ltd_layer = layer  # DeepSpeed's attribute name (state_dict keys)
        self.ltd = ltd
        self.ltd_layer_id = int(ltd_layer_id)

    def forward(self, hidden_states, *args, **kwargs):
        ltd = self.ltd
        bf = ltd.batch_first
        seq, batch = ((hidden_states.shape[1], hidden_states.shape[0]) if bf
                      else (hidden_states.shape[0], hidden_states.shape[1]))
        retained = ltd.retained_tokens()
        if not self.training or retained >= seq:
            return self.random_ltd_layer(hidden_states, *args, **kwargs)
        mask = kwargs.get(ltd.mask_name) if ltd.mask_name else None
        ids, layer_mask = ltd.ids_for(self.ltd_layer_id, batch, seq, retained, mask)
        ops = ltd.ops
        x_sent = ops.place(hidden_states)  # one copy for both ops
        part = GatherTokens.apply(hidden_states, ids, ops, bf, x_sent)
        if mask is not None:
            kwargs[ltd.mask_name] = layer_mask
        if ltd.positions_name:
            kwargs[ltd.positions_name] = ids.long()
        outputs = self.random_ltd_layer(part, *args, **kwargs)
        layer_out = outputs[0] if isinstance(outputs, tuple) else outputs
        merged = MergeTokens.apply(hidden_states, layer_out, ids, ops, bf, x_sent)
        if isinstance(outputs, tuple):
            return (merged,) + tuple(outputs[1:])
        return merged


def convert_to_random_ltd(model, layer_class, ltd, *, layer_ids=None):
    """Wraps instances of `layer_class` in `model` (in module order) in
    RandomLayerTokenDrop (PackedRandomLayerTokenDrop when `ltd` is a
    tokensel.torch.PackedRandomLTD): those at positions `layer_ids` among them (e.g. the
    transformer layer numbers), or all. They become Random-LTD layers 0..L-1
    of `ltd` (ltd.num_layers = L). Returns `model` (changed in place)."""
    found = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children()
             if isinstance(child, layer_class) and not isinstance(parent, RandomLayerTokenDrop)]
    if layer_ids is None:
        chosen = found
    else:
        layer_ids = sorted(set(int(i) for i in layer_ids))
        bad = [i for i in layer_ids if not 0 <= i < len(found)]
        if bad:
            raise ValueError("layer_ids %s out of range: the model has %d %s layers"
                             % (bad, len(found), layer_class.__name__))
        chosen = [found[i] for i in layer_ids]
    for k, (parent, name, child) in enumerate(chosen):
        setattr(parent, name, ltd.wrap(child, k))
    ltd.num_layers = len(chosen)
    return model


def remove_random_ltd_state_dict(state_dict):
    """A state dict with the wrappers' ".random_ltd_layer" level removed:
    loadable into the model without Random-LTD (DeepSpeed's helper)."""
    return {k.replace(".random_ltd_layer.", "."): v for k, v in state_dict.items()}
