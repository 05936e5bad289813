"""Packing planner: group rows into packed rows of at most `budget` tokens, once per epoch.

`plan_packs` gives per pack the row indices (their lengths are the sequence lengths of that packed row), which the
packed-attention batch builder consumes. Every row appears in exactly one pack, and the same (seed, epoch) always
gives the same plan, which is what lets a resumed run continue at the saved pack position.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

import numpy as np

from hone.core.errors import ConfigError

METHODS = ("best-fit", "first-fit")
# Mixes the epoch into the seed so that (seed, epoch) pairs give independent shuffles.
_EPOCH_STRIDE = 1_000_003


def plan_packs(
    lengths: Sequence[int], budget: int, *, seed: int, epoch: int, method: str = "best-fit"
) -> list[list[int]]:
    """Plan one epoch of packed rows.

    Both methods sort rows by length, longest first, after a seeded shuffle (so equal lengths land in a different
    order each epoch), then place each row:

        best-fit     into the open pack with the least room that still fits it (tightest packs, the default;
                     ties go to the oldest pack);
        first-fit    into the oldest open pack that fits it.

    A row that fits no open pack starts a new one. Finally the packs are shuffled, so an epoch does not start with
    all the long rows.

    Args:
        lengths: tokens per row (int, each 1..budget).
        budget: most tokens in one packed row.
        seed: run seed; epoch: 0-based epoch number. Together they fix the plan.
        method: "best-fit" or "first-fit" (both on rows sorted longest first).

    Returns:
        Packs in training order; each a list of row indices whose lengths sum to at most `budget`.

    Raises:
        ConfigError: a row is longer than the budget.
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    sizes = np.asarray(lengths, dtype=np.int64)
    if len(sizes) == 0:
        return []
    if sizes.max() > budget:
        worst = int(sizes.argmax())
        raise ConfigError(
            f"row {worst} has {int(sizes[worst])} tokens, more than the packing budget of {budget} tokens",
            "set train.batch_tokens to at least data.max_length",
        )
    if sizes.min() < 1:
        raise ValueError("every row needs at least one token")
    rng = np.random.default_rng([seed, epoch * _EPOCH_STRIDE])
    shuffled = rng.permutation(len(sizes))
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    packs = _best_fit(order, sizes, budget) if method == "best-fit" else _first_fit(order, sizes, budget)
    return [packs[i] for i in rng.permutation(len(packs))]


def _best_fit(order: np.ndarray, lengths: np.ndarray, budget: int) -> list[list[int]]:
    """Best fit with packs bucketed by free room: `rooms` is the sorted list of distinct free-room values, each
    bucket a heap of pack numbers (ties go to the oldest pack)."""
    packs: list[list[int]] = []
    by_room: dict[int, list[int]] = {}
    rooms: list[int] = []
    for index in order.tolist():
        size = int(lengths[index])
        at = bisect.bisect_left(rooms, size)
        if at < len(rooms):
            room = rooms[at]
            bucket = by_room[room]
            pack = heapq.heappop(bucket)
            if not bucket:
                del by_room[room]
                rooms.pop(at)
        else:
            room, pack = budget, len(packs)
            packs.append([])
        packs[pack].append(index)
        left = room - size
        if left > 0:
            if left not in by_room:
                by_room[left] = []
                bisect.insort(rooms, left)
            heapq.heappush(by_room[left], pack)
    return packs


def _first_fit(order: np.ndarray, lengths: np.ndarray, budget: int) -> list[list[int]]:
    """First fit with a max segment tree over the packs' free room (leftmost pack with enough room in O(log n))."""
    n = len(order)
    size = 1
    while size < n:
        size *= 2
    tree = [0] * (2 * size)  # leaves: free room of pack i (0 = not opened yet or full)
    packs: list[list[int]] = []
    for index in order.tolist():
        need = int(lengths[index])
        if tree[1] >= need:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= need else 2 * node + 1
            pack = node - size
        else:
            pack = len(packs)
            packs.append([])
            node = size + pack
            tree[node] = budget
        packs[pack].append(index)
        tree[node] -= need
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return packs


def packing_efficiency(plan: Sequence[Sequence[int]], lengths: Sequence[int], budget: int) -> float:
    """Real tokens / (packs * budget): 1.0 means no padding at all."""
    if not plan:
        return 0.0
    sizes = np.asarray(lengths, dtype=np.int64)
    used = sum(int(sizes[list(pack)].sum()) for pack in plan)
    return used / (len(plan) * budget)
