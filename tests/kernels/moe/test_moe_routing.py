"""Routing grouped once: sorted rows, token of each row, and group ends, checked against a hand-made case."""

from __future__ import annotations

import torch

from hone.kernels.moe.routing import route


def test_route_sorts_stably_and_counts_each_expert():
    # 4 tokens, top-2, 5 experts; expert 2 gets nothing, expert 4 gets three slots.
    index = torch.tensor([[4, 0], [1, 4], [0, 4], [3, 1]])
    r = route(index, 5)
    assert r.group_ends.dtype == torch.int32
    assert r.group_ends.tolist() == [2, 4, 4, 5, 8]
    assert r.counts.tolist() == [2, 2, 0, 1, 3]
    assert r.expert.tolist() == [0, 0, 1, 1, 3, 4, 4, 4]
    # flat slots in (token, k) order, stable within each expert
    assert r.perm.tolist() == [1, 4, 2, 7, 6, 0, 3, 5]
    assert r.token.tolist() == [0, 2, 1, 3, 3, 0, 1, 2]
    assert r.bounds() == [(0, 2), (2, 4), (4, 4), (4, 5), (5, 8)]
    assert r.num_rows == 8


def test_route_all_tokens_to_one_expert_and_top_k_equal_to_experts():
    one = route(torch.full((6, 1), 2), 3)
    assert one.group_ends.tolist() == [0, 0, 6]
    every = route(torch.tensor([[2, 0, 1], [1, 2, 0]]), 3)
    assert every.counts.tolist() == [2, 2, 2]
    assert every.token.tolist() == [0, 1, 0, 1, 0, 1]
