"""Exports and settings against what computers do: a disk that fills up during an export (RLIMIT_FSIZE in a real
`hone export` process), staging folders of exports killed with SIGKILL, an export while a resume trains, HONE_*
variables with values Hone cannot use, a model that needs its own code, a cache Hone cannot write, a run folder
whose path is too long."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hone.core.errors import HoneError
from hone.core.export import ExportError, export_run
from tests.core.export.export_helpers import TINY_SHAPES, TINY_VOCAB, build_tiny_tokenizer, write_run

# A second process that takes the lock of a folder (a run folder, an export's staging folder), says "locked" and
# holds it until its stdin closes or it is killed: a training resume, or an export being written.
HOLD = (
    "import sys\nfrom hone.core.train.run_lock import RunLock\nRunLock.acquire(sys.argv[1])\n"
    "print('locked', flush=True)\nsys.stdin.read()\n"
)
MIB = 1 << 20


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run folder with a random LoRA on a tiny random-init Qwen3 base (its adapter saved at step 10)."""
    from hone.core.models.shapes import build_model

    base = tmp_path_factory.mktemp("base")
    build_model(TINY_SHAPES["tiny-dense"], seed=0, vocab_size=TINY_VOCAB).save_pretrained(base)
    build_tiny_tokenizer(base)
    return write_run(tmp_path_factory.mktemp("run") / "run", str(base))


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("exports"))
    return copy


def _hold(folder: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline() == "locked\n"
    return holder


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name) if folder.exists() else []


def _sixteen_bit_bytes(run_dir: Path) -> int:
    """The merged model's 16-bit weights, counted from the base model as transformers loads it (tied weights once)."""
    from transformers import AutoModelForCausalLM

    from hone.core.config import RunConfig

    base = RunConfig.load(run_dir / "config.toml").model.name_or_path
    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(base).parameters()) * 2


# ---- a full disk ----


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_FSIZE and SIGXFSZ")
def test_a_file_size_limit_during_merged_and_gguf_exports_names_the_folder_and_the_size_and_leaves_nothing(
    run_dir, tmp_path
):
    import resource

    from hone.core.export.staging import EXTRA_BYTES, human_size

    run = _copy(run_dir, tmp_path)
    weights = _sixteen_bit_bytes(run)
    limit = weights // 4  # tokenizer, config and card files are smaller; the weights file is not

    def limited() -> None:  # in the child: writes past the limit fail with EFBIG instead of killing it (SIGXFSZ)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    script = (
        "import sys\nfrom hone.core.cli.dispatch import main\n"
        "for fmt, out in zip(sys.argv[2::2], sys.argv[3::2]):\n"
        "    print('exit', main(['export', sys.argv[1], '--format', fmt, '--out', out]), file=sys.stderr, flush=True)\n"
    )
    outs = {fmt: tmp_path / "exports" / fmt.replace(":", "-") for fmt in ("merged:bf16", "gguf:q8_0")}
    args = [a for fmt, out in outs.items() for a in (fmt, str(out))]
    done = subprocess.run(
        [sys.executable, "-c", script, str(run), *args], capture_output=True, text=True, timeout=240, preexec_fn=limited
    )
    said = " ".join(done.stderr.split())
    assert done.returncode == 0 and said.count("exit 2") == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "SafetensorError" not in done.stderr
    for out in outs.values():
        assert f"while writing the export to {out}" in said
    # merged: the size counted before writing, weights at 16 bits plus the files beside them
    assert f"the export needs about {human_size(weights + EXTRA_BYTES)}" in said
    assert said.count("file-size limit") == 2
    assert not any(out.exists() for out in outs.values())
    assert _partials(tmp_path / "exports") == []


@pytest.mark.parametrize("fmt", ["adapter", "merged:bf16"])
def test_an_export_that_does_not_fit_the_free_space_is_refused_before_writing(run_dir, tmp_path, monkeypatch, fmt):
    from hone.core.export import staging

    run = _copy(run_dir, tmp_path)
    free = 5 * MIB
    real = shutil.disk_usage
    monkeypatch.setattr(staging.shutil, "disk_usage", lambda path: real(path)._replace(free=free))
    out = tmp_path / "out"
    with pytest.raises(ExportError) as e:
        export_run(run, fmt, out)
    if fmt == "adapter":
        needed = sum(p.stat().st_size for p in (run / "adapter").iterdir() if p.is_file())
    else:
        needed = _sixteen_bit_bytes(run)
    needed += staging.EXTRA_BYTES
    assert e.value.message == (
        f"not enough free space for the export to {out}: it needs about {staging.human_size(needed)} and the disk "
        f"holding {tmp_path} has 5.2 MB free"
    )
    assert not out.exists() and _partials(tmp_path) == []


# ---- staging folders of killed exports ----


@pytest.mark.skipif(os.name != "posix", reason="the writer is killed with SIGKILL")
def test_staging_folders_of_killed_exports_go_and_one_being_written_stays(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    exports = run / "exports"
    killed, old, live = (
        exports / name
        for name in (".merged-bf16.partial-k1ll3d00", ".gguf-q8_0.partial-0ld0ld00", ".gguf-f16.partial-l1ve0000")
    )
    for folder in (killed, old, live):
        (folder / "model").mkdir(parents=True)
        (folder / "model" / "model.safetensors").write_bytes(b"\0" * MIB)
    writer = _hold(killed)
    writer.kill()  # SIGKILL: no cleanup, the lock goes with the process
    writer.wait()
    other = _hold(live)  # an export another process writes right now
    try:
        result = export_run(run, "adapter")
    finally:
        other.stdin.close()
        other.wait()
    assert _partials(exports) == [live.name]
    assert result.notes == [f"removed 2 staging folder(s) left by exports that were cut short: {old}, {killed}"]
    assert (exports / "adapter" / "adapter_model.safetensors").is_file()


# ---- an export while a resume trains ----


def test_an_export_while_the_run_trains_names_the_step_it_holds(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    summary = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(dict(summary, status="running", step=17)))
    trainer = _hold(run)  # a process holding the run folder's lock: a resume training in it
    try:
        result = export_run(run, "adapter", tmp_path / "during")
    finally:
        trainer.stdin.close()
        trainer.wait()
    assert result.step == 10  # write_run saved the adapter at step 10
    assert result.notes == [
        "run run is still training, now at step 17: this export holds its adapter saved at step 10, not the "
        "training going on; export again once the run has finished for its newer adapter"
    ]
    manifest = json.loads((tmp_path / "during" / "export.json").read_text())
    assert (manifest["adapter_step"], manifest["run_still_training"]) == (10, True)
    assert "Exported while the run was still training" in (tmp_path / "during" / "README.md").read_text()

    after = export_run(run, "adapter", tmp_path / "after")
    manifest = json.loads((tmp_path / "after" / "export.json").read_text())
    assert (after.step, after.notes, manifest["run_still_training"]) == (10, [], False)
    assert "still training" not in (tmp_path / "after" / "README.md").read_text()


# ---- HONE_* variables ----


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "100000"])
def test_hone_data_workers_must_be_a_whole_number_in_range(monkeypatch, value):
    from hone.core.data.parallel import default_workers

    monkeypatch.setenv("HONE_DATA_WORKERS", value)
    with pytest.raises(HoneError) as e:
        default_workers([])
    assert e.value.message.startswith(f"the environment variable HONE_DATA_WORKERS={value!r} cannot be used")
    assert "a whole number from 0 to 256" in e.value.message
    monkeypatch.setenv("HONE_DATA_WORKERS", " 3 ")
    assert default_workers([]) == 3


@pytest.mark.parametrize("value", ["1.2.3", "lots", "0", "-4GiB"])
def test_hone_gpu_memory_must_be_a_size(monkeypatch, value):
    from hone.core.memory.run_plan import detect_memory

    monkeypatch.setenv("HONE_GPU_MEMORY", value)
    with pytest.raises(HoneError) as e:
        detect_memory()
    assert e.value.message.startswith(f"the environment variable HONE_GPU_MEMORY={value!r} cannot be used")
    monkeypatch.setenv("HONE_GPU_MEMORY", "1.5GiB")
    assert detect_memory().available == 1.5 * 2**30


def test_hone_fault_at_is_checked_so_a_stray_value_cannot_kill_a_run(monkeypatch):
    # HONE_MOE_BACKEND's check: tests/core/speed/moe/test_moe_choice.py
    from hone.core.train import checkpoints

    for stray in ("abc", "0", "-3"):
        monkeypatch.setenv("HONE_FAULT_AT", stray)
        with pytest.raises(HoneError, match=f"HONE_FAULT_AT='{stray}'"):
            checkpoints._fault_point()
    monkeypatch.setattr(checkpoints._fault_point, "count", 0, raising=False)
    monkeypatch.setenv("HONE_FAULT_AT", "1000")
    checkpoints._fault_point()
    assert checkpoints._fault_point.count == 1


@pytest.mark.parametrize("value", ["/", ".", "relative/pause", "/no/such/folder/pause"])
def test_pause_and_stop_files_must_be_files_hone_creates(monkeypatch, value):
    from hone.core.cli.launch import watch_stop_file
    from hone.core.control import RunControl, follow_pause_file

    control = RunControl()
    with pytest.raises(HoneError, match=re.escape(f"HONE_PAUSE_FILE={value!r}")):
        follow_pause_file(control, value)
    with pytest.raises(HoneError, match=re.escape(f"HONE_STOP_FILE={value!r}")):
        watch_stop_file(control, value)
    assert not control.paused and not control.stop_requested


def test_a_pause_file_pauses_and_resumes(tmp_path):
    from hone.core.control import PAUSE_POLL_S, RunControl, follow_pause_file

    control, pause = RunControl(), tmp_path / "pause"
    thread = follow_pause_file(control, str(pause))
    try:
        pause.touch()
        time.sleep(3 * PAUSE_POLL_S)
        assert control.paused
        pause.unlink()
        time.sleep(3 * PAUSE_POLL_S)
        assert not control.paused
    finally:
        control.stop()
        thread.join(5)


@pytest.mark.skipif(os.name != "posix", reason="a path that is a folder on POSIX")
def test_hone_train_with_a_folder_as_pause_file_says_so_instead_of_pausing_forever(tiny_model_dir, tmp_path):
    from hone.core.demo.text_data import make_dataset
    from tests.core.conftest import make_tiny_config, write_rows

    train, held_out = make_dataset(n_train=8, n_eval=2, seed=3)
    data = (write_rows(tmp_path / "train.jsonl", train), write_rows(tmp_path / "eval.jsonl", held_out))
    config = make_tiny_config(tiny_model_dir("tiny-dense"), data, tmp_path / "runs")
    config.save(tmp_path / "run.toml")
    done = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", "train", str(tmp_path / "run.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HONE_PAUSE_FILE="/"),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "hone: error: the environment variable HONE_PAUSE_FILE='/' cannot be used" in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_failure_file_never_overwrites_a_users_file(tmp_path, monkeypatch):
    from hone.core.errors import record_failure

    error = HoneError("it broke", "fix it")
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    link = tmp_path / "link.json"
    link.symlink_to(mine)
    for path in (mine, link, tmp_path):
        monkeypatch.setenv("HONE_FAILURE_FILE", str(path))
        record_failure(error)
    assert mine.read_text() == "my notes"
    fresh, empty = tmp_path / "fresh.json", tmp_path / "empty.json"
    empty.touch()
    for path in (fresh, empty):
        monkeypatch.setenv("HONE_FAILURE_FILE", str(path))
        record_failure(error)
        assert json.loads(path.read_text()) == {"message": "it broke", "advice": "fix it", "code": ""}


@pytest.mark.parametrize("value", ["relative/cache", "FILE"])
def test_hone_cache_must_be_an_absolute_folder(tmp_path, monkeypatch, value):
    from hone.core.resources import cache_root

    if value == "FILE":
        value = str(tmp_path / "a-file")
        Path(value).write_text("x")
    monkeypatch.setenv("HONE_CACHE", value)
    with pytest.raises(HoneError, match=re.escape(f"HONE_CACHE={value!r} cannot be used")):
        cache_root("models")


# ---- a model that needs its own code ----


def test_a_model_that_needs_its_own_code_is_named_by_plan_and_data_check(tmp_path, capsys):
    from hone.core.cli.dispatch import main
    from tests.core.conftest import write_rows

    model = tmp_path / "custom"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "hone-unknown-arch",
                "auto_map": {
                    "AutoConfig": "configuration_x.XConfig",
                    "AutoModelForCausalLM": "modeling_x.XForCausalLM",
                },
            }
        )
    )
    rows = write_rows(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    (tmp_path / "run.toml").write_text(f'[model]\nname_or_path = "{model}"\n[data]\ntrain = ["{rows}"]\n')
    for argv in (["plan", str(tmp_path / "run.toml")], ["data", "check", "--model", str(model), str(rows)]):
        assert main(argv) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert f"hone: error: {model} needs its own Python code to load" in said
        assert "set model.trust_remote_code = true in the run config" in said
        assert "Traceback" not in said and "ValueError" not in said


# ---- a cache Hone cannot write, a run folder path too long ----


@pytest.mark.parametrize("kind", ["read-only", "under a file"])
def test_a_cache_hone_cannot_write_fails_before_any_conversion(tmp_path, monkeypatch, kind):
    from hone.core.models.load import gguf_folder

    if kind == "read-only":
        if os.name != "posix" or os.geteuid() == 0:
            pytest.skip("permission bits do not stop root (the 'under a file' case runs everywhere)")
        cache = tmp_path / "cache"
        cache.mkdir(mode=0o555)
    else:
        (tmp_path / "file").write_text("x")
        cache = tmp_path / "file" / "cache"
    monkeypatch.setenv("HONE_CACHE", str(cache))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"not a GGUF at all")  # a conversion that ran first would fail on this, differently
    with pytest.raises(HoneError) as e:
        gguf_folder(gguf)
    assert e.value.message.startswith(f"cannot write to the cache folder {cache / 'models'} (")
    assert e.value.message.endswith(f"it comes from HONE_CACHE={cache}")


def test_a_run_folder_path_too_long_is_refused_before_anything_is_written(tiny_model_dir, tmp_path):
    from hone.core import events
    from hone.core.config import RunConfig
    from hone.core.train.run_dir import new_run_dir
    from hone.core.train.trainer import Trainer

    config = RunConfig().with_overrides([f"output.runs_dir={json.dumps(str(tmp_path / ('n' * 300)))}"])
    with pytest.raises(HoneError) as e:
        new_run_dir(config)
    assert "has a name of 300 bytes in its path" in e.value.message and "allows 255" in e.value.message
    deep = tmp_path.joinpath(*["d" * 200] * 21)  # each name allowed, the whole path over Linux's 4096
    config = config.with_overrides([f"output.runs_dir={json.dumps(str(deep))}", 'output.name="run"'])
    size = len(str(deep / "run").encode())
    with pytest.raises(HoneError, match=f"the run folder's path is {size} bytes long"):
        new_run_dir(config)
    assert list(tmp_path.iterdir()) == []
    config = config.with_overrides([f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}"])
    failed = list(Trainer(config, device="cpu").run())[-1]
    assert isinstance(failed, events.RunFailed) and "see train.log" not in failed.advice
    assert failed.reason.startswith(f"the run folder's path is {size} bytes long")
