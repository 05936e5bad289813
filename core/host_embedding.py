"""The frozen input-embedding table kept in host memory: each batch's rows are looked up on the CPU.

Why: LoRA never trains the input embeddings, and a step reads only the rows of the batch's tokens, yet the table
sits in GPU memory for the whole run: 1.16 GiB for Qwen3-8B (151,936 x 4,096 bf16), 0.58 GiB for Qwen3-30B-A3B.
On a laptop GPU that is room for several thousand more tokens per batch.

How: `apply_host_embedding` moves the table to pinned host memory and puts a `HostEmbedding` in the model's
place. The trainer's collation (on its background thread, while the GPU runs the previous step) gathers each
batch's rows from the host table into pinned memory (`HostEmbedding.rows`); they travel to the GPU with the
batch's other tensors (one asynchronous copy, T x H values) and reach the model as `inputs_embeds`. Any other
call (generation, a batch collated elsewhere) goes through `HostEmbedding.forward`, which copies the ids to the
host, looks them up there and copies the rows back: correct, but it waits for the GPU, so only the trainer's
path is fast. `restore` puts the table and the original module back (the run's end).

Where: a plain `nn.Embedding` whose weight is frozen and not shared with the LM head (tied tables are read by the
head for every token anyway), on a CUDA device, for text models (vision-language models merge image features
into the embeddings inside their forward).
"""

from __future__ import annotations

import torch
from torch import nn


class HostEmbedding(nn.Module):
    """Stands in for a frozen `nn.Embedding` whose table lives in pinned host memory (see the module docstring).

    Args:
        original: the model's embedding module (its weight is moved off the device; `restore` brings it back).
        device: the device the model computes on (where looked-up rows are returned).
    """

    def __init__(self, original: nn.Embedding, device: torch.device | str):
        super().__init__()
        self.device = torch.device(device)
        self.dtype = original.weight.dtype
        self.num_embeddings, self.embedding_dim = original.num_embeddings, original.embedding_dim
        self.padding_idx = original.padding_idx
        host = original.weight.detach().to("cpu")
        self.table = host.pin_memory() if self.device.type == "cuda" else host.clone()
        self._original = [original]  # a list: not a submodule (its parameters must not count twice)
        original.weight.data = torch.empty(0, dtype=self.dtype, device=original.weight.device)

    @property
    def original(self) -> nn.Embedding:
        return self._original[0]

    @property
    def weight(self) -> torch.Tensor:
        """The host table (read-only use: exports and `get_input_embeddings().weight` readers)."""
        return self.table

    def rows(self, input_ids: torch.Tensor, *, pin_memory: bool = False) -> torch.Tensor:
        """The embedding rows of host `input_ids` (any shape), gathered on the CPU; (*ids.shape, H)."""
        flat = input_ids.reshape(-1)
        out = torch.empty((flat.numel(), self.embedding_dim), dtype=self.dtype, pin_memory=pin_memory)
        torch.index_select(self.table, 0, flat, out=out)
        return out.view(*input_ids.shape, self.embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # A call the trainer did not prepare rows for: correct, not fast (the ids' copy to the host waits).
        rows = self.rows(input_ids.to("cpu"), pin_memory=self.device.type == "cuda")
        return rows.to(input_ids.device, non_blocking=True)

    def restore(self, model) -> None:
        """Put the original module back into `model` with its table on the device again."""
        original = self.original
        original.weight.data = self.table.to(self.device)
        _base(model).set_input_embeddings(original)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, table in host memory"


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported_reason(model, device: torch.device | str) -> str | None:
    """Why the input embeddings must stay on the device for this model, or None when they can move."""
    if torch.device(device).type != "cuda":
        return "only on a GPU (on the CPU the table is in host memory already)"
    return _model_reason(model)


def _model_reason(model) -> str | None:
    """What about the model itself keeps its table on the device (whatever the device)."""
    base = _base(model)
    config = getattr(base, "config", None)
    if config is not None and hasattr(config, "vision_config"):
        return "vision-language models merge image features into the embeddings inside their forward"
    embedding = base.get_input_embeddings()
    if type(embedding) is not nn.Embedding:
        return f"the input embedding is a {type(embedding).__name__}, not a plain nn.Embedding"
    if embedding.weight.requires_grad:
        return "the input embeddings are trained"
    head = base.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is embedding.weight:
        return "the table is tied to the LM head, which reads all of it at every step"
    return None


def apply_host_embedding(model, device: torch.device | str, *, force: bool = False) -> HostEmbedding | str:
    """Move `model`'s frozen input-embedding table to host memory (see the module docstring).

    Args:
        force: skip the GPU-only condition (tests check the bookkeeping on the CPU).

    Returns:
        The `HostEmbedding` now in the model, or the reason the table stays where it is.
    """
    reason = _model_reason(model) if force else unsupported_reason(model, device)
    if reason is not None:
        return reason
    base = _base(model)
    host = HostEmbedding(base.get_input_embeddings(), device)
    base.set_input_embeddings(host)
    return host
