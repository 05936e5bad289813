"""Fixtures for the MoE tests."""

from __future__ import annotations

import copy

import pytest
from moe_testing import build_tiny_moe


@pytest.fixture(scope="module")
def tiny_moe_cache():
    """Build each tiny model once per test module; tests get deep copies."""
    built = {}

    def get(shape: str, **kwargs):
        key = (shape, tuple(sorted(kwargs.items())))
        if key not in built:
            built[key] = build_tiny_moe(shape, **kwargs)
        return copy.deepcopy(built[key])

    return get


@pytest.fixture(autouse=True)
def _untuned_triton(monkeypatch):
    """Triton block sizes from the heuristic: tuning every test shape would spend GPU minutes compiling."""
    monkeypatch.setenv("HONE_TRITON_AUTOTUNE", "0")
