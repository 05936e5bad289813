"""Runs training jobs for the fault-injection tests, each in a process of its own, and says how each ended.

    python tests/reliability/fault_runner.py CONFIG.toml WORK_DIR save,rewrite

One fresh interpreter imports torch and Hone and runs the two uninterrupted runs itself, then forks a child per
run: imports and lazy loading are paid once, and each child is a real process that the checkpoint hook
(`HONE_FAULT_AT=k`, hone.core.train.checkpoints) can SIGKILL. A kill chain forks a child that trains with the fault
set, waits for the kill, records what the run folder then holds (the newest complete checkpoint, any step folder
that is not), and forks a fresh child that resumes without the fault. Chains run two at a time. Every run uses one
CPU thread, so all runs compute alike, bit for bit.

In WORK_DIR: `reference/` (an uninterrupted run), `stopped/` (the same run stopped after its step-1 checkpoint),
`stopped-again/` (a copy of it resumed and stopped at once: the stop saves step 1 again, a same-step save), then for
each k up to the number of file-system changes the hook counted in them (`NAME.ops`): `save-k/` (a new run killed
at change k, then resumed) and `rewrite-k/` (a copy of `stopped/` resumed and stopped at once, killed at change k,
resumed again), each with `save-k.json`: how the kill ended, what the folder held then, how the resume ended.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

NO_FAULT = str(10**9)  # a fault point never reached: the hook counts, nothing is killed


def _train(config_path: str, run_dir: Path, resume: bool, fault_at: str | None, stop: str = "") -> int:
    """In a forked child: one run to its end, or stopped ("after-checkpoint": once its first checkpoint is saved;
    "at-once": before its first step); exit 0 when it finished, 3 when it failed (the hook may kill it)."""
    from hone.core import events
    from hone.core.config import RunConfig
    from hone.core.control import RunControl
    from hone.core.train import checkpoints
    from hone.core.train.trainer import Trainer

    checkpoints._fault_point.count = 0
    if fault_at:
        os.environ["HONE_FAULT_AT"] = fault_at
    else:
        os.environ.pop("HONE_FAULT_AT", None)
    if resume:  # as `hone train --resume` does: the run's own config
        config = RunConfig.load(run_dir / "config.toml")
    else:
        config = RunConfig.load(config_path).with_overrides(
            [f"output.name={json.dumps(run_dir.name)}", f"output.runs_dir={json.dumps(str(run_dir.parent))}"]
        )
    control = RunControl()
    if stop == "at-once":
        control.stop()
    got = []
    for event in Trainer(config, control, device="cpu", resume_dir=run_dir if resume else None).run():
        got.append(event)
        if stop == "after-checkpoint" and isinstance(event, events.CheckpointSaved):
            control.stop()
    last = got[-1] if got else None
    (run_dir.parent / f"{run_dir.name}.ops").write_text(str(getattr(checkpoints._fault_point, "count", 0)))
    if not isinstance(last, events.RunFinished):
        print(f"{run_dir.name}: {last}", file=sys.stderr)
        return 3
    return 0


def _fork(target, *args) -> int:
    """Run target(*args) in a child; its exit status (negative: killed by that signal)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = target(*args)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _chain(config_path: str, chain: dict) -> int:
    """In a forked child: train with the fault, look at the folder, resume; results to RUN_DIR.json."""
    from hone.core.train.checkpoints import checkpoint_report

    run_dir = Path(chain["run_dir"])
    if chain.get("copy_from"):
        shutil.copytree(chain["copy_from"], run_dir)
    killed = _fork(_train, config_path, run_dir, chain["resume"], str(chain["fault_at"]), chain.get("stop", ""))
    complete, broken = checkpoint_report(run_dir)
    root = run_dir / "checkpoints"
    result = {
        "killed": killed,
        "newest": complete[-1].name if complete else None,
        "broken": {str(k): v for k, v in broken.items()},
        "after_kill": sorted(p.name for p in root.iterdir()) if root.is_dir() else [],
    }
    result["resumed"] = _fork(_train, config_path, run_dir, True, None)
    Path(f"{run_dir}.json").write_text(json.dumps(result))
    return 0


def _run_chains(config_path: str, chains: list[dict]) -> None:
    running: list[int] = []
    for chain in chains:
        if len(running) == 2:
            pid, _ = os.wait()
            running.remove(pid)
        pid = os.fork()
        if pid == 0:
            os._exit(_chain(config_path, chain))
        running.append(pid)
    for pid in running:
        os.waitpid(pid, 0)


def main(config_path: str, work: str, scenarios: str) -> None:
    import torch

    torch.set_num_threads(1)
    work = Path(work)
    # The two uninterrupted runs run here, not in children: what they import and load lazily is then loaded once,
    # for every child (a child of a cold process spends seconds on it).
    reference, stopped, again = work / "reference", work / "stopped", work / "stopped-again"
    if _train(config_path, reference, False, NO_FAULT) != 0:
        raise SystemExit("the reference run failed")
    if _train(config_path, stopped, False, NO_FAULT, "after-checkpoint") != 0:
        raise SystemExit("the run stopped after its first checkpoint failed")
    shutil.copytree(stopped, again)
    if _train(config_path, again, True, NO_FAULT, "at-once") != 0:  # resumed and stopped: a same-step save
        raise SystemExit("resuming and stopping the stopped run failed")
    os.environ.pop("HONE_FAULT_AT", None)
    chains = []
    if "save" in scenarios:
        ops = int((work / "reference.ops").read_text())
        chains += [
            {"run_dir": str(work / f"save-{k}"), "copy_from": None, "resume": False, "fault_at": k}
            for k in range(1, ops + 1)
        ]
    if "rewrite" in scenarios:
        ops = int((work / "stopped-again.ops").read_text())
        chains += [
            {
                "run_dir": str(work / f"rewrite-{k}"),
                "copy_from": str(stopped),
                "resume": True,
                "fault_at": k,
                "stop": "at-once",
            }
            for k in range(1, ops + 1)
        ]
    _run_chains(config_path, chains)


if __name__ == "__main__":
    main(*sys.argv[1:4])
