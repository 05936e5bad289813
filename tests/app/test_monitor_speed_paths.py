"""The Monitor's log says what a run's speed paths did, as the run's own train.log says it: a CPU run's vocabulary
tables are "off (CPU)", not "on the GPU"."""

from __future__ import annotations

import time

from hone.core.config import RunConfig, SpeedConfig
from hone.core.events import RunFinished, RunStarted


def _cpu_choices() -> dict[str, str]:
    """The speed-path choices a CPU run records, made by the engine's own code on a tiny model."""
    from hone.core.models.shapes import build_model
    from hone.core.speed.paths import SpeedSetup, _embeddings

    setup = SpeedSetup()
    _embeddings(build_model("tiny-dense", seed=0), SpeedConfig(loss="chunked"), "cpu", setup)
    return setup.choices


def _paths(log: str, choices: dict[str, str]) -> dict[str, str]:
    """Each speed path's line in a log (after its time stamp): path -> what the line says."""
    found = {}
    for line in log.splitlines():
        for path in choices:
            head, sep, said = line.partition(f"  {path}: ")
            if sep and head.strip():
                found[path] = said
    return found


def test_a_cpu_runs_embeddings_line_says_what_train_log_says(qtbot, window, tmp_path):
    from hone.core.train.run_dir import RunWriter

    choices = _cpu_choices()
    assert choices["embeddings"].startswith("on the GPU"), "the engine's raw choice, which the Monitor must not echo"
    run_dir = tmp_path / "runs" / "cpu-run"
    writer = RunWriter(run_dir, RunConfig())
    writer.write(
        RunStarted(
            run_dir=str(run_dir),
            model="m",
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=1,
            total_steps=1,
            tokens_per_epoch=1,
            time=time.time(),
            speed_paths=choices,
        )
    )
    writer.write(RunFinished(step=0, run_dir=str(run_dir), adapter_dir="", final_loss=float("nan"), elapsed=1.0))
    writer.close()
    logged = _paths((run_dir / "train.log").read_text(encoding="utf-8"), choices)
    assert logged["embeddings"] == "off (CPU)" and logged["lm_head"] == "off (CPU)"

    monitor = window.monitor
    with qtbot.waitSignal(monitor.run_shown, timeout=10_000):
        monitor.show_run(run_dir)
    shown = _paths(monitor.log.toPlainText(), choices)
    assert shown == logged
    assert "on the GPU" not in monitor.log.toPlainText()
