"""A CPU install has no Triton: every module of hone.core and hone.kernels imports without it, and a run trains on
the torch references, an MoE model with the adamw-bf16 optimizer included (the paths that import kernel modules)."""

from __future__ import annotations

import subprocess
import sys

# Run in a fresh interpreter in which `import triton` fails, as where it is not installed.
SCRIPT = r"""
import importlib, importlib.abc, pkgutil, sys

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTriton())
import hone.core, hone.kernels
skip = {"hone.kernels.benchmark"}  # a GPU micro-benchmark tool: it needs Triton to time the kernels
for package in (hone.core, hone.kernels):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if module.name not in skip and not module.name.endswith(".__main__"):  # those run a command
            importlib.import_module(module.name)
assert "triton" not in sys.modules

from hone.core import events
from hone.core.config import RunConfig
from hone.core.train.trainer import Trainer

config = RunConfig.load(sys.argv[1])
got = list(Trainer(config, device="cpu").run())
assert isinstance(got[-1], events.RunFinished), got[-1]
started = next(e for e in got if isinstance(e, events.RunStarted))
print("finished", got[-1].step, started.speed_paths.get("moe", ""))
"""


def test_hone_imports_and_trains_on_a_cpu_without_triton(tiny_model_dir, chat_files, tiny_config, tmp_path):
    config = tiny_config(
        tiny_model_dir("tiny-moe-qwen3"),
        chat_files,
        tmp_path / "runs",
        "train.max_steps=2",
        'train.optimizer="adamw-bf16"',
    )
    config.save(tmp_path / "run.toml")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "run.toml")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("finished 2 "), done.stdout
