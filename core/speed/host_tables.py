"""The frozen vocabulary tables, which LoRA never trains, kept in pinned host memory instead of GPU memory.

The input embedding's rows are looked up on the CPU by the trainer's collation and reach the model as
`inputs_embeds`; the LM head is copied to the GPU once per step, while the forward runs, for the chunked loss, and
freed after it. The one thing to know: only those two callers are fast. Any other call (generation, a batch
collated elsewhere) goes through the stand-ins' `forward`, correct but copying on every call, except within
`tables_on_device` (a sampling loop), which holds one device copy while it lasts. `apply_host_tables`
decides what moves; `HostTables.restore` puts it back. What it saves and costs: docs/performance/memory.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hone.core.models.head import HeadPlan, head_plan


class _HostTable(nn.Module):
    """A frozen vocabulary-sized weight moved to (pinned) host memory, standing in for the module that held it.

    Args:
        original: the model's module (its weight is emptied on the device; `restore` brings it back).
        device: the device the model computes on.
        table: the host copy already made of this weight (one table tied to two places), else None.
    """

    def __init__(self, original: nn.Module, device: torch.device | str, table: torch.Tensor | None = None):
        super().__init__()
        self.device = torch.device(device)
        self.table = table if table is not None else _host_copy(original.weight, self.device)
        self._original = [original]  # a list: not a submodule (its parameters must not count twice)
        original.weight.data = torch.empty(0, dtype=self.table.dtype, device=original.weight.device)
        self.resident: torch.Tensor | None = None  # a device copy held by `tables_on_device`, used while it lasts

    @property
    def original(self) -> nn.Module:
        return self._original[0]

    @property
    def weight(self) -> torch.Tensor:
        """The host table (read-only use: exports, and readers of the module's `.weight`)."""
        return self.table

    def _brought_back(self) -> nn.Module:
        """The original module with the table in its (emptied) weight again: once, since a tied table's second
        owner finds it there already."""
        original = self.original
        if original.weight.numel() == 0:
            original.weight.data = self.table.to(self.device)
        return original


class HostEmbedding(_HostTable):
    """Stands in for a frozen `nn.Embedding` whose table lives in pinned host memory.

    A step reads only its batch's rows of the table. The trainer's collation (on its background thread, while the
    GPU runs the previous step) gathers them from the host table into pinned memory (`rows`); they travel to the
    GPU with the batch's other tensors (one asynchronous copy of T x H values) and reach the model as
    `inputs_embeds`, so the table takes no GPU memory during the step. `forward` serves any other caller.

    Args:
        original: the model's embedding module (its weight is moved off the device; `restore` brings it back).
        device: the device the model computes on (where looked-up rows are returned).
    """

    def __init__(self, original: nn.Embedding, device: torch.device | str):
        super().__init__(original, device)
        self.dtype = self.table.dtype
        self.num_embeddings, self.embedding_dim = original.num_embeddings, original.embedding_dim
        self.padding_idx = original.padding_idx

    def rows(self, input_ids: torch.Tensor, *, pin_memory: bool = False) -> torch.Tensor:
        """The embedding rows of host `input_ids` (any shape), gathered on the CPU; (*ids.shape, H)."""
        flat = input_ids.reshape(-1)
        out = torch.empty((flat.numel(), self.embedding_dim), dtype=self.dtype, pin_memory=pin_memory)
        torch.index_select(self.table, 0, flat, out=out)
        return out.view(*input_ids.shape, self.embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.resident is not None:
            return F.embedding(input_ids, self.resident, self.padding_idx)
        # A call the trainer did not prepare rows for: correct, not fast (the ids' copy to the host waits).
        rows = self.rows(input_ids.to("cpu"), pin_memory=self.device.type == "cuda")
        return rows.to(input_ids.device, non_blocking=True)

    def restore(self, model) -> None:
        """Put the original module back into `model` with its table on the device again."""
        _base(model).set_input_embeddings(self._brought_back())

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, table in host memory"


class HostLMHead(_HostTable):
    """Stands in for a frozen `nn.Linear` LM head whose weight lives in pinned host memory.

    Only the loss reads the head, after every layer's forward and before any layer's backward, so the layers'
    backward never needs it. The chunked loss (`hone.core.train.loss`) takes it once per step with `device_weight`:
    an asynchronous copy from pinned memory, started on a side stream when the model's forward starts
    (`prefetch_during`) so the layers' forward hides it, and freed when the loss drops it. `forward` serves any
    other caller (generation, say) by copying the whole weight on every call.

    Args:
        original: the model's head (its weight is moved off the device; `restore` brings it back). A bias, if
            any, stays on the device.
        device: the device the model computes on.
        table: the host copy already made of this weight (a head tied to the input embeddings), else None.
    """

    def __init__(self, original: nn.Linear, device: torch.device | str, table: torch.Tensor | None = None):
        super().__init__(original, device, table)
        self.in_features, self.out_features = original.in_features, original.out_features
        self.bias = original.bias  # None, or the original's (device) bias parameter
        self._pending: tuple[torch.Tensor, torch.cuda.Stream] | None = None  # a copy started early, not yet used
        self._stream: torch.cuda.Stream | None = None
        self._hooks: list = []

    def device_weight(self, device: torch.device | str) -> torch.Tensor:
        """The weight on `device`: an asynchronous copy from pinned memory, freed when the caller drops it. A copy
        `prefetch_during` started is handed over (the current stream waits for it) instead of a new one."""
        if self._pending is not None:
            weight, stream = self._pending
            self._pending = None
            if weight.device == torch.device(device):
                current = torch.cuda.current_stream(weight.device)
                current.wait_stream(stream)
                weight.record_stream(current)  # freed by this stream's work, not the copy stream's
                return weight
        return self.table.to(device, non_blocking=True)

    def prefetch_during(self, body: nn.Module) -> None:
        """Start the weight's copy on a side stream when `body`'s forward starts, so it overlaps the decoder
        layers instead of delaying the loss. The copy then shares memory with the forward pass, whose layers need
        less than their backward on the models measured; a layer recomputed in backward (checkpointing) does not
        run `body`'s forward, so it starts no copy. CUDA only."""
        if self.device.type != "cuda":
            return

        def start(module, args):
            if self._pending is None and self.resident is None:
                self._stream = self._stream or torch.cuda.Stream(self.device)
                with torch.cuda.stream(self._stream):
                    self._pending = (self.table.to(self.device, non_blocking=True), self._stream)

        self._hooks.append(body.register_forward_pre_hook(start))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.resident is not None:
            return F.linear(hidden, self.resident, self.bias)
        # A caller other than the chunked loss (generation, say): correct, but the whole weight travels each call.
        return F.linear(hidden, self.device_weight(hidden.device), self.bias)

    def restore(self, model) -> None:
        """Put the original head back into `model` with its weight on the device again."""
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._pending = [], None
        _base(model).set_output_embeddings(self._brought_back())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weight in host memory"


@contextlib.contextmanager
def tables_on_device(model):
    """While it lasts, each host table of `model` computes from one device copy of its weight, made on entry:
    what a decode loop calling the model hundreds of times needs (no weight copy per call, no ids read back to
    the host, so its step can be captured as a CUDA graph). The copies take the tables' device memory meanwhile."""
    tables = [m for m in model.modules() if isinstance(m, _HostTable) and m.device.type == "cuda"]
    copies: dict[int, torch.Tensor] = {}  # a table tied to two places is copied once
    try:
        for table in tables:
            key = table.table.data_ptr()
            if key not in copies:
                copies[key] = table.table.to(table.device, non_blocking=True)
            table.resident = copies[key]
        yield
    finally:
        for table in tables:
            table.resident = None


def _host_copy(weight: torch.Tensor, device: torch.device) -> torch.Tensor:
    host = weight.detach().to("cpu")
    return host.pin_memory() if device.type == "cuda" else host.clone()


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _tied(base) -> bool:
    head = base.get_output_embeddings()
    return head is not None and getattr(head, "weight", None) is base.get_input_embeddings().weight


def _embedding_reason(base) -> str | None:
    """What about the model keeps its input table on the device (whatever the device)."""
    config = getattr(base, "config", None)
    if config is not None and hasattr(config, "vision_config"):
        return "vision-language models merge image features into the embeddings inside their forward"
    embedding = base.get_input_embeddings()
    if type(embedding) is not nn.Embedding:
        return f"the input embedding is a {type(embedding).__name__}, not a plain nn.Embedding"
    if embedding.weight.requires_grad:
        return "the input embeddings are trained"
    return None


def _head_reason(base) -> str | None:
    """What about the model keeps its LM head on the device (whatever the device)."""
    head = base.get_output_embeddings()
    if type(head) is not nn.Linear:
        return f"the LM head is a {type(head).__name__}, not a plain nn.Linear"
    if head.weight.requires_grad or (head.bias is not None and head.bias.requires_grad):
        return "the LM head is trained"
    plan = head_plan(base)
    if not isinstance(plan, HeadPlan) or plan.head is not head:
        return "the chunked loss cannot compute this model's head"
    return None


@dataclass
class HostTables:
    """What `apply_host_tables` moved: each table's stand-in, or the reason it stays on the device."""

    embedding: HostEmbedding | str
    head: HostLMHead | str

    def restore(self, model) -> None:
        """Both tables back on the device, their original modules back in the model (idempotent)."""
        for moved in (self.embedding, self.head):
            if not isinstance(moved, str):
                moved.restore(model)
        self.embedding = self.embedding if isinstance(self.embedding, str) else "restored"
        self.head = self.head if isinstance(self.head, str) else "restored"


def apply_host_tables(
    model,
    device: torch.device | str,
    *,
    embedding: bool = True,
    head: bool = True,
    chunked_loss: bool = True,
    force: bool = False,
) -> HostTables:
    """Move `model`'s frozen vocabulary tables to pinned host memory where they can go, putting a `HostEmbedding`
    and a `HostLMHead` in the model's places.

    Where: on a CUDA device, a plain `nn.Embedding` / `nn.Linear` whose weight is frozen; the input table of text
    models only (vision-language models merge image features into the embeddings inside their forward); the head
    only when the chunked loss computes it. A table tied to the head is one table: it moves when both places can
    move.

    Args:
        embedding / head: which tables may move (the `speed.host_embeddings` / `speed.host_lm_head` switches).
        chunked_loss: the run computes its loss with `hone.core.train.loss`'s chunked mode (the head moves only then:
            the model's own forward would copy the head on every call).
        force: skip the GPU-only condition (tests check the bookkeeping on the CPU).

    Returns:
        A `HostTables`: each table's stand-in, or the reason it stays on the device; `restore` undoes the move.
    """
    base = _base(model)
    on_device = (
        None
        if force or torch.device(device).type == "cuda"
        else ("only on a GPU (on the CPU the table is in host memory already)")
    )
    embedding_why = on_device or _embedding_reason(base) if embedding else "speed.host_embeddings = false"
    if not head:
        head_why = "speed.host_lm_head = false"
    elif not chunked_loss:
        head_why = "only with speed.loss = chunked (the model's own forward reads the head on every call)"
    else:
        head_why = on_device or _head_reason(base)
    tied = _tied(base)
    if tied and (embedding_why or head_why):
        embedding_why = embedding_why or f"the table is tied to the LM head, which stays on the GPU: {head_why}"
        head_why = head_why or f"the weight is tied to the input embeddings, which stay on the GPU: {embedding_why}"
    host_embedding = HostEmbedding(base.get_input_embeddings(), device) if embedding_why is None else None
    host_head = None
    if head_why is None:
        shared = host_embedding.table if tied and host_embedding is not None else None
        host_head = HostLMHead(base.get_output_embeddings(), device, table=shared)
    if host_embedding is not None:
        base.set_input_embeddings(host_embedding)
    if host_head is not None:
        base.set_output_embeddings(host_head)
        host_head.prefetch_during(head_plan(base).body)  # `_head_reason` checked the chunked loss has a body
    return HostTables(embedding=host_embedding or embedding_why, head=host_head or head_why)
