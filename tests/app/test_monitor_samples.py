"""The Monitor's Samples panel on a real run's samples.jsonl (a tiny random-init model trained 3 CPU steps with
train.sample_prompts): a past run shows each prompt's answer at each evaluation; a followed run's panel grows after
each evaluation event; the file is read off the GUI thread; runs without samples show no panel."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest

from hone.core.events import EvalMetrics, RunStarted

PROMPTS = ["What is 2 + 2?", "Name a colour."]


@pytest.fixture(scope="module")
def sampled_run(tiny_model_dir, tmp_path_factory):
    """A finished run folder with samples at steps 1, 2 and 3."""
    from hone.core import events
    from hone.core.config import RunConfig
    from hone.core.demo.text_data import make_dataset
    from hone.core.train.trainer import Trainer

    folder = tmp_path_factory.mktemp("samples-run")
    train, eval_rows = make_dataset(n_train=24, n_eval=4, seed=3)
    files = {}
    for name, rows in (("train", train), ("eval", eval_rows)):
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(files['train']))}]",
            f"data.eval=[{json.dumps(str(files['eval']))}]",
            f"output.runs_dir={json.dumps(str(folder / 'runs'))}",
            "output.name=sampled",
            "data.max_length=256",
            "train.batch_tokens=256",
            "train.max_steps=3",
            "train.eval_every=1",
            "train.lr=5e-2",
            "train.warmup_steps=1",
            f"train.sample_prompts={json.dumps(PROMPTS)}",
            "train.sample_max_new_tokens=5",
        ]
    )
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return folder / "runs" / "sampled"


def _lines(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text(encoding="utf-8").splitlines()]


def _expected_text(lines: list[dict], index: int) -> str:
    """The panel's text for prompt `index`, built from the file's lines."""
    out, previous = [f"Prompt: {PROMPTS[index]}", ""], None
    for line in lines:
        answer = line["samples"][index]["answer"]
        same = " (unchanged)" if answer == previous else ""
        out += [f"Step {line['step']}{same}", answer if answer.strip() else "(empty answer)", ""]
        previous = answer
    return "\n".join(out).rstrip()


@pytest.fixture
def monitor(make_window):
    window = make_window()
    window.show_page("monitor")
    return window.monitor


def test_a_past_run_shows_each_prompts_answers_step_by_step(monitor, sampled_run, qtbot):
    lines = _lines(sampled_run)
    assert [line["step"] for line in lines] == [1, 2, 3]
    panel = monitor.samples_panel
    monitor.show_run(sampled_run)
    qtbot.waitUntil(lambda: len(panel.steps) == 3 and panel.isVisible(), timeout=10_000)
    assert [panel.prompt_box.itemData(i) for i in range(panel.prompt_box.count())] == PROMPTS
    assert panel.text.toPlainText() == _expected_text(lines, 0)
    panel.prompt_box.setCurrentIndex(1)
    assert panel.text.toPlainText() == _expected_text(lines, 1)
    assert panel.answers_of(PROMPTS[1]) == [(line["step"], line["samples"][1]["answer"]) for line in lines]


def test_a_followed_run_shows_each_evaluation_as_its_event_comes(monitor, sampled_run, tmp_path, qtbot):
    lines = (sampled_run / "samples.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    (run_dir / "samples.jsonl").write_text(lines[0], encoding="utf-8")
    panel = monitor.samples_panel
    t0 = time.time()
    monitor.handle(
        RunStarted(
            run_dir=str(run_dir), model="tiny", device="cpu", dtype="float32", params_total=10, params_trainable=1,
            total_steps=3, tokens_per_epoch=100, config={"train": {"method": "sft"}}, time=t0,
        )
    )  # fmt: skip
    qtbot.waitUntil(lambda: [s.step for s in panel.steps] == [1], timeout=10_000)
    for step in (2, 3):
        with open(run_dir / "samples.jsonl", "a", encoding="utf-8") as f:
            f.write(lines[step - 1])  # the trainer writes the line, then the evaluation's event follows
        monitor.handle(EvalMetrics(step=step, loss=1.0, tokens=10, time=t0 + step))
        qtbot.waitUntil(lambda step=step: [s.step for s in panel.steps] == list(range(1, step + 1)), timeout=10_000)
    assert panel.text.toPlainText() == _expected_text(_lines(sampled_run), 0)


def test_samples_are_read_off_the_gui_thread(monitor, sampled_run, qtbot, monkeypatch):
    import hone.core.api.runs as runs

    threads = []
    real = runs.read_samples

    def recording(run_dir, *args):
        threads.append(threading.current_thread())
        return real(run_dir, *args)

    monkeypatch.setattr(runs, "read_samples", recording)
    monitor.samples_panel.set_run(sampled_run)
    qtbot.waitUntil(lambda: len(monitor.samples_panel.steps) == 3, timeout=10_000)
    assert threads and all(t is not threading.main_thread() for t in threads)


def test_a_run_without_samples_shows_no_panel_and_a_new_run_clears_it(monitor, sampled_run, tmp_path, qtbot):
    panel = monitor.samples_panel
    monitor.show_run(sampled_run)
    qtbot.waitUntil(lambda: panel.isVisible(), timeout=10_000)
    plain = tmp_path / "plain"
    shutil.copytree(sampled_run, plain, ignore=shutil.ignore_patterns("samples.jsonl", "run.lock"))
    monitor.show_run(plain)
    qtbot.waitUntil(lambda: not panel.busy, timeout=10_000)
    assert not panel.isVisible() and panel.steps == [] and panel.prompt_box.count() == 0
    assert panel.text.toPlainText() == ""
