"""The door into the engine (hone.core.api): every name it lists resolves to the engine's own object, loading its
module only then, and the machine facts the Studio's run checks read."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from types import SimpleNamespace

import pytest

from hone.core.api import GpuListing, MachineFacts, read_machine
from tests.core.machine.test_telemetry import FakeNvml

DOORS = ("hone.core.api", "hone.core.api.bench", "hone.core.api.child_run")


@pytest.mark.parametrize("module", DOORS)
def test_every_name_the_door_lists_resolves(module):
    door = importlib.import_module(module)
    assert [name for name in door.__all__ if not hasattr(door, name)] == []
    assert len(set(door.__all__)) == len(door.__all__)
    with pytest.raises(AttributeError, match="no attribute 'no_such_verb'"):
        door.no_such_verb  # noqa: B018


def test_the_door_hands_out_the_engines_own_objects():
    """A re-export, not a copy: what the Studio and the CLI call is what the engine's tests test (names resolved on
    first use included, through the door's package and its submodule)."""
    import hone.core.api as door
    from hone.core.bench.report import ratio_table
    from hone.core.data import check_data
    from hone.core.export.dispatch import export_run
    from hone.core.train.child_run import train_in_child
    from hone.core.train.distributed import PEER_ADVICE
    from hone.core.train.sharding import refusal
    from hone.core.train.trainer import Trainer

    assert door.check_data is check_data and door.sharding_refusal is refusal
    assert door.Trainer is Trainer and door.export_run is export_run and door.PEER_ADVICE is PEER_ADVICE
    assert importlib.import_module("hone.core.api.bench").ratio_table is ratio_table
    assert importlib.import_module("hone.core.api.child_run").train_in_child is train_in_child


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_machine_facts_name_every_gpu_nvml_lists(monkeypatch):
    total = 141 * 2**30
    nvml = FakeNvml(memory=SimpleNamespace(total=total, used=0, free=total), devices=("NVIDIA H200", "NVIDIA H100"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    facts = read_machine()
    assert facts == MachineFacts(
        gpu="NVIDIA H200",
        bitsandbytes=_installed("bitsandbytes"),
        reason="",
        gpus=(GpuListing(0, "NVIDIA H200", total), GpuListing(1, "NVIDIA H100", total)),
    )
    assert facts.has_gpu and nvml.shut_down


def test_machine_facts_without_nvml_say_why_there_is_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    facts = read_machine()
    assert facts == MachineFacts(
        gpu="", bitsandbytes=_installed("bitsandbytes"), reason="nvidia-ml-py is not installed", gpus=()
    )
    assert not facts.has_gpu


def test_the_door_lists_each_submodule_exactly():
    """The door's table names each verb's submodule for every name that submodule exports, no more, no fewer: a
    name added to a submodule and not to the door (or the reverse) is caught here. The corners with a door of their
    own (hone.core.api.bench) lend the top door only some names."""
    import hone.core.api as door

    for module in sorted(set(door._LAZY.values())):
        listed = {name for name, home in door._LAZY.items() if home == module}
        exported = set(importlib.import_module(module).__all__)
        assert listed <= exported if module in DOORS else listed == exported, module
