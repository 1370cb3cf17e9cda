"""tokensel.torch: PyTorch on the tokensel sidecar (needs torch: pip install
'tokensel[torch]'; `import tokensel` alone does not import torch).

- gather_tokens / merge_tokens: autograd functions whose forward and
  backward both run on the server (GatherTokens / MergeTokens forward,
  MergeTokens-into-zeros / SplitTokens backward), bit-exact against autograd on
  gather_tokens_reference / merge_tokens_reference (index_select/index_copy).
- RandomLayerTokenDrop, RandomLTD, FixedLinearSchedule, convert_to_random_ltd:
  DeepSpeed's Random-LTD with ids reproducible from (seed, step) and the kept
  tokens' positions available to the layer.
- PackedRandomLayerTokenDrop, PackedRandomLTD: the same for packed (THD)
  batches, [T, ...] hidden states with cu_seqlens; the layer gets the kept
  tokens' cu_seqlens, positions and longest sequence.
- Arena: shared-memory tensors reused across steps, so that activations and
  gradients go to the server by reference, not inline.
"""
from tokensel.torch.arena import Arena, ArenaStats
from tokensel.torch.functions import (GatherTokens, MergeTokens, Ops, gather_tokens,
                                      gather_tokens_reference, merge_tokens,
                                      merge_tokens_reference)
from tokensel.torch.ltd import (FixedLinearSchedule, RandomLayerTokenDrop, RandomLTD,
                                convert_to_random_ltd, remove_random_ltd_state_dict)
from tokensel.torch.packed import PackedRandomLayerTokenDrop, PackedRandomLTD

__all__ = [
    "Arena", "ArenaStats", "GatherTokens", "MergeTokens", "Ops", "gather_tokens",
    "gather_tokens_reference", "merge_tokens", "merge_tokens_reference", "FixedLinearSchedule",
    "RandomLayerTokenDrop", "RandomLTD", "convert_to_random_ltd", "remove_random_ltd_state_dict",
    "PackedRandomLayerTokenDrop", "PackedRandomLTD",
]
