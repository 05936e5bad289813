"""Activation checkpointing of decoder layers: the inputs kept on the GPU or offloaded to pinned host memory.

checkpointer.py     the checkpointing wrapper and its modes (off, gpu, offload, offload-double)
layer_recompute.py  a checkpointed layer's autograd Function: recomputed and back-propagated in backward
offload_buffers.py  pinned host slots, GPU reload buffers and the copy streams
policy.py           which mode a run uses, and the cost model behind `auto`
layer_groups.py     a checkpointed layer recomputed a group of whole sequences at a time
tiled_mlp.py        a checkpointed layer's MLP back-propagated a tile of tokens at a time
projection_recompute.py  large batches: head-normed q/k projections run again in backward instead of kept
"""

__all__: list[str] = []
