"""The Runs page's Compare: every selected run's loss, eval loss, tokens/s and GPU memory overlaid against steps and
against tokens seen, only the settings that differ, each run's numbers, and damaged files said in words.

Run folders are written here file by file (config.toml, metrics.jsonl, run.json) so each number is known; the expected
values are computed from the lists the files were written from, not by the code under test."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from itertools import accumulate
from pathlib import Path

import pytest

from hone.app.pages.runs_compare import MAX_COMPARED, TOKENS
from hone.core.api import RunSummary
from hone.core.config import RunConfig
from hone.core.events import EvalMetrics, RunFinished, RunStarted, StepMetrics, to_dict

GIB = 1024**3


@dataclasses.dataclass
class Run:
    """What a run folder is written from: one entry per step in each step list."""

    name: str
    settings: dict[str, object]
    losses: list[float]
    tokens: list[int]
    speeds: list[float]
    memory: list[int]  # bytes; 0: not reported (a CPU run)
    evals: list[tuple[int, float]]  # (step, loss)
    elapsed: float

    @property
    def steps(self) -> list[int]:
        return list(range(1, len(self.losses) + 1))

    @property
    def seen(self) -> list[int]:
        return list(accumulate(self.tokens))


ALPHA = Run(
    "alpha",
    {"train.lr": 1e-3, "lora.r": 16},
    losses=[3.0, 2.5, 2.0, 1.5],
    tokens=[100, 120, 80, 100],
    speeds=[1000.0, 1100.0, 1200.0, 1300.0],
    memory=[2 * GIB, 3 * GIB, 3 * GIB, 2 * GIB],
    evals=[(2, 2.75), (4, 1.75)],
    elapsed=42.0,
)
BETA = Run(
    "beta",
    {"train.lr": 3e-3, "lora.r": 16},
    losses=[2.8, 2.1, 1.4],
    tokens=[200, 200, 200],
    speeds=[2000.0, 2500.0, 0.0],  # a speed of 0 is none: not drawn
    memory=[5 * GIB, 6 * GIB, 6 * GIB],
    evals=[(1, 2.6), (3, 1.9)],
    elapsed=95.5,
)
GAMMA = Run(
    "gamma",
    {"train.lr": 1e-3, "lora.r": 4},
    losses=[3.2, 2.9, float("nan"), 2.2, 2.0],  # a NaN loss is written null and not drawn
    tokens=[50, 60, 70, 80, 90],
    speeds=[500.0, 510.0, 520.0, 530.0, 540.0],
    memory=[0, 0, 0, 0, 0],  # on the CPU: no memory line
    evals=[(0, 3.5), (5, 2.4)],  # an evaluation before the first step: 0 tokens seen
    elapsed=3725.0,
)


def _write(runs_dir: Path, run: Run, t: float) -> Path:
    run_dir = runs_dir / run.name
    run_dir.mkdir(parents=True)
    config = RunConfig()
    config.output.name = run.name
    for key, value in run.settings.items():
        section, name = key.split(".")
        setattr(getattr(config, section), name, value)
    config.save(run_dir / "config.toml")
    total = len(run.losses)
    lines = [
        RunStarted(
            run_dir=str(run_dir),
            model="bundled:tiny",
            device="cuda",
            dtype="bfloat16",
            params_total=10,
            params_trainable=1,
            total_steps=total,
            tokens_per_epoch=1000,
            time=t,
        )
    ]
    evals = dict(run.evals)
    if 0 in evals:
        lines.append(EvalMetrics(step=0, loss=evals[0], tokens=40, time=t))
    for step, loss, tokens, speed, memory in zip(run.steps, run.losses, run.tokens, run.speeds, run.memory):
        lines.append(
            StepMetrics(
                step=step,
                total_steps=total,
                epoch=step / total,
                loss=loss,
                lr=1e-3,
                grad_norm=1.0,
                tokens=tokens,
                trained_tokens=tokens // 2,
                tokens_per_s=speed,
                step_time=0.1,
                elapsed=run.elapsed * step / total,
                mem_allocated=memory,
                time=t + step,
            )
        )
        if step in evals:
            lines.append(EvalMetrics(step=step, loss=evals[step], tokens=40, time=t + step))
    lines.append(
        RunFinished(
            step=total,
            run_dir=str(run_dir),
            adapter_dir="",
            final_loss=run.losses[-1],
            elapsed=run.elapsed,
            time=t + total + 1,
        )
    )
    text = "".join(json.dumps(to_dict(event)) + "\n" for event in lines)
    (run_dir / "metrics.jsonl").write_text(text.replace("NaN", "null"), encoding="utf-8")
    summary = RunSummary(
        run_dir=str(run_dir),
        name=run.name,
        model="bundled:tiny",
        status="finished",
        step=total,
        total_steps=total,
        final_loss=run.losses[-1] if run.losses[-1] == run.losses[-1] else None,
        started=t,
        updated=t + total + 1,
    )
    (run_dir / "run.json").write_text(json.dumps(dataclasses.asdict(summary)), encoding="utf-8")
    return run_dir


def _finite(xs: list, ys: list[float], positive: bool = False) -> tuple[list, list]:
    kept = [(x, y) for x, y in zip(xs, ys) if y == y and (not positive or y > 0)]
    return [float(x) for x, _ in kept], [float(y) for _, y in kept]


def _expected(run: Run, chart: str, by_tokens: bool) -> tuple[list[float], list[float]]:
    """The points `chart` draws for `run`, from the lists its files were written from."""
    xs = run.seen if by_tokens else run.steps
    if chart == "loss":
        return _finite(xs, run.losses)
    if chart == "speed":
        return _finite(xs, run.speeds, positive=True)
    if chart == "memory":
        return _finite(xs, [m / GIB for m in run.memory], positive=True)
    seen_at = {step: seen for step, seen in zip(run.steps, run.seen)} | {0: 0}
    return _finite([seen_at[s] if by_tokens else s for s, _ in run.evals], [loss for _, loss in run.evals])


@pytest.fixture
def page(window):
    window.show_page("runs")
    return window.page("runs")


def _rows(page) -> dict[str, int]:
    return {page.table.item(row, 0).text(): row for row in range(page.table.rowCount())}


def _compare(qtbot, page, names: list[str]) -> None:
    rows = _rows(page)
    page.select([rows[name] for name in names])
    assert page.compare_button.isEnabled()
    page.compare_button.click()
    view = page.comparison
    qtbot.waitUntil(lambda: view.comparison is not None and not view.reading, timeout=10_000)


@pytest.fixture
def three(tmp_path):
    runs_dir = tmp_path / "runs"
    t = time.time() - 1000
    for i, run in enumerate((ALPHA, BETA, GAMMA)):
        _write(runs_dir, run, t + 100 * i)  # gamma newest: the list shows gamma, beta, alpha
    return runs_dir


def test_three_runs_overlaid_against_steps_and_tokens_seen(qtbot, page, three):
    page.refresh()
    assert page.compare_button.text() == "Compare"
    _compare(qtbot, page, ["alpha", "beta", "gamma"])
    view = page.comparison
    order = [GAMMA, BETA, ALPHA]  # the list's order, newest first
    assert view.run_names() == ["gamma", "beta", "alpha"]
    assert not view.problems.isVisibleTo(view)
    for by_tokens in (False, True):
        if by_tokens:
            view.x_buttons[TOKENS].click()
        for key, chart in view.charts.items():
            assert [name for name, _ in chart.legend_entries()] == ["gamma", "beta", "alpha"], key
            assert len(chart.series) == 3, f"{key}: one line per run"
            colours = [colour for _, colour in chart.legend_entries()]
            assert len(set(colours)) == 3, f"{key}: one colour per run"
            for i, run in enumerate(order):
                xs, ys = chart.points(f"run{i}")
                want_x, want_y = _expected(run, key, by_tokens)
                assert list(xs) == want_x, (key, run.name, by_tokens)
                assert list(ys) == pytest.approx(want_y), (key, run.name, by_tokens)
        label = "tokens seen" if by_tokens else "step"
        assert view.charts["loss"].plot.getPlotItem().getAxis("bottom").labelText == label
    # gamma ran on the CPU: no memory line, the others' are drawn
    assert len(view.charts["memory"].points("run0")[0]) == 0 and len(view.charts["memory"].points("run1")[0]) == 3


def test_only_the_differing_settings_are_listed_with_each_runs_value(qtbot, page, three):
    page.refresh()
    _compare(qtbot, page, ["alpha", "beta", "gamma"])
    view = page.comparison
    # output.name differs too, but names the folder: not a setting
    assert view.settings_rows() == {"lora.r": ["4", "16", "16"], "train.lr": ["0.001", "0.003", "0.001"]}
    headers = [view.settings_table.horizontalHeaderItem(c).text() for c in range(view.settings_table.columnCount())]
    assert headers == ["setting", "gamma", "beta", "alpha"]
    assert not view.same.isVisibleTo(view)


def test_every_setting_the_same_is_said(qtbot, page, tmp_path):
    t = time.time()
    _write(tmp_path / "runs", dataclasses.replace(ALPHA, name="one"), t)
    _write(tmp_path / "runs", dataclasses.replace(ALPHA, name="two", losses=[2.0, 1.0, 0.5, 0.25]), t + 10)
    page.refresh()
    _compare(qtbot, page, ["one", "two"])
    view = page.comparison
    assert view.settings_rows() == {}
    assert view.same.isVisibleTo(view) and view.same.text() == "Every setting is the same in these runs."
    assert not view.settings_table.isVisibleTo(view)


def _wall(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def test_the_numbers_table_has_hone_compares_columns_and_each_runs_numbers(qtbot, page, three):
    page.refresh()
    _compare(qtbot, page, ["alpha", "beta", "gamma"])
    rows = page.comparison.metrics_rows()
    assert list(rows[0]) == [
        "run",
        "status",
        "steps",
        "final loss",
        "final eval",
        "best eval",
        "best at",
        "median tok/s",
        "peak GiB",
        "wall time",
        "best checkpoint",
    ]
    for row, run in zip(rows, [GAMMA, BETA, ALPHA]):
        best_step, best = min(run.evals, key=lambda e: e[1])
        speeds = [s for s in run.speeds if s > 0]
        memory = [m for m in run.memory if m > 0]
        assert row == {
            "run": run.name,
            "status": "Finished",
            "steps": f"{len(run.losses)}/{len(run.losses)}",
            "final loss": f"{run.losses[-1]:.4f}",
            "final eval": f"{run.evals[-1][1]:.4f}",
            "best eval": f"{best:.4f}",
            "best at": str(best_step),
            "median tok/s": f"{statistics.median(speeds):,.0f}",
            "peak GiB": f"{max(memory) / GIB:.2f}" if memory else "—",
            "wall time": _wall(run.elapsed),
            "best checkpoint": "—",  # no checkpoint scored (scores.json)
        }, run.name
    assert rows[0]["wall time"] == "1:02:05" and rows[1]["wall time"] == "1:36" and rows[2]["wall time"] == "42.0 s"


def test_a_damaged_run_says_its_problems_and_the_others_still_compare(qtbot, page, three):
    broken = _write(three, dataclasses.replace(ALPHA, name="broken", losses=[4.0, 3.0, 2.0, 1.0]), time.time())
    with open(broken / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"event": "StepMetrics", "step": "five"}\n')
    (broken / "config.toml").write_bytes(b"[train]\nlr = \xff\xfe\n")  # not UTF-8: cannot be read
    page.refresh()
    _compare(qtbot, page, ["alpha", "beta", "gamma", "broken"])
    view = page.comparison
    assert view.run_names() == ["broken", "gamma", "beta", "alpha"]
    assert view.problems.isVisibleTo(view)
    problems = view.problems.text()
    assert "broken: " in problems and "config.toml is not UTF-8 text" in problems and "settings left out" in problems
    assert "1 line of metrics.jsonl could not be read (line " in problems
    assert "Traceback" not in problems
    assert not any(name in problems for name in ("alpha", "beta", "gamma")), "the others read whole"
    # its settings are unknown ("—"); the three readable runs still differ in lr and rank
    assert view.settings_rows() == {
        "lora.r": ["—", "4", "16", "16"],
        "train.lr": ["—", "0.001", "0.003", "0.001"],
    }
    # the lines that hold events still count: its loss is drawn and its numbers shown
    xs, ys = view.charts["loss"].points("run0")
    assert list(xs) == [1.0, 2.0, 3.0, 4.0] and list(ys) == [4.0, 3.0, 2.0, 1.0]
    rows = view.metrics_rows()
    assert rows[0]["final loss"] == "1.0000" and rows[0]["steps"] == "4/4"
    assert [row["final loss"] for row in rows[1:]] == ["2.0000", "1.4000", "1.5000"]


def test_a_run_whose_folder_went_away_is_said_not_a_crash(qtbot, page, three):
    import shutil

    page.refresh()
    rows = _rows(page)
    page.select([rows["alpha"], rows["beta"]])
    shutil.rmtree(three / "beta")  # deleted in a file manager after the list was read
    page.compare_button.click()
    view = page.comparison
    qtbot.waitUntil(lambda: view.comparison is not None and not view.reading, timeout=10_000)
    assert view.run_names() == ["beta", "alpha"]
    assert "beta: " in view.problems.text() and "is not a run folder" in view.problems.text()
    assert view.metrics_rows()[0]["status"] == "Not a run"
    assert list(view.charts["loss"].points("run1")[1]) == ALPHA.losses


def test_compare_needs_two_runs_and_takes_at_most_eight(page, tmp_path):
    t = time.time()
    for i in range(MAX_COMPARED + 1):
        _write(tmp_path / "runs", dataclasses.replace(ALPHA, name=f"run{i}"), t + i)
    page.refresh()
    page.select([0])
    assert not page.compare_button.isEnabled(), "one run: nothing to compare with"
    page.select([0, 1])
    assert page.compare_button.isEnabled()
    page.select(list(range(MAX_COMPARED)))
    assert page.compare_button.isEnabled()
    page.select(list(range(MAX_COMPARED + 1)))
    assert not page.compare_button.isEnabled()
    assert f"at most {MAX_COMPARED}" in page.compare_button.toolTip()
