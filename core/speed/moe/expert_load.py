"""Tokens routed to each expert per optimizer step, counted on the device (StepMetrics.expert_load)."""

from __future__ import annotations

import torch
from torch import nn

from hone.core.speed.moe.experts import find_experts


def _inside_backward() -> bool:
    # Activation checkpointing reruns layer forwards inside the backward pass; those must not count twice.
    return torch._C._current_graph_task_id() != -1


class ExpertLoadMeter:
    """Counts (token, expert) assignments of every experts layer while the model trains.

    A forward hook on each experts module adds its top-k choice into one (layers, E) int64 counter on the
    device (an index_add: no sync, any backend). Forwards in eval mode or re-run by checkpointing inside backward
    are not counted. `read_and_reset` copies the counts to the host once per optimizer step.

    Args:
        model: a transformers model or a peft model around one.
    """

    def __init__(self, model: nn.Module) -> None:
        self._experts = [m for _, m in find_experts(model)]
        self.num_experts = max((m.num_experts for m in self._experts), default=0)
        self._counts: torch.Tensor | None = None
        self._handles = [
            m.register_forward_hook(self._make_hook(i), with_kwargs=True) for i, m in enumerate(self._experts)
        ]

    @property
    def num_layers(self) -> int:
        return len(self._experts)

    def _make_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output) -> None:
            if not module.training or _inside_backward():
                return
            index = args[1] if len(args) > 1 else kwargs.get("top_k_index", kwargs.get("router_indices"))
            if index is None:
                return
            flat = index.reshape(-1)
            if self._counts is None:
                self._counts = torch.zeros(self.num_layers, self.num_experts, dtype=torch.int64, device=flat.device)
            self._counts[layer].index_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int64))

        return hook

    def read_and_reset(self, per_layer: bool = False) -> list[int] | list[list[int]]:
        """Tokens per expert since the last call, summed over layers (or one list per layer); zeros them.

        Reading copies E (or layers x E) integers to the host: call it once per optimizer step, after the step's
        loss has been read.
        """
        if self._counts is None:
            return [[0] * self.num_experts for _ in self._experts] if per_layer else [0] * self.num_experts
        counts = self._counts if per_layer else self._counts.sum(0)
        values = counts.tolist()
        self._counts.zero_()
        return values

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
