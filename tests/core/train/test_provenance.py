"""provenance.json: what a run was made from, read cheaply and never failing the run."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata

from hone.core.config import RunConfig
from hone.core.train import provenance
from hone.core.train.provenance import (
    PROVENANCE_FILE,
    build_provenance,
    model_revision,
    read_provenance,
    rerun_differences,
    rerun_report,
    write_provenance,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _stat_digest(folder, names):
    """The fingerprint written out by hand: sha256 over "name\\0size\\0mtime_ns\\n" of each file, sorted by name."""
    digest = hashlib.sha256()
    for name in sorted(names):
        st = (folder / name).stat()
        digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def test_a_hub_model_is_named_by_the_commit_its_cache_ref_points_at(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    storage = tmp_path / "models--acme--tiny"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(COMMIT + "\n")
    snapshot = storage / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"x" * 10)
    (snapshot / "config.json").write_text("{}")
    facts, why = model_revision("acme/tiny")
    assert why == ""
    assert facts["source"] == "hub" and facts["revision"] == COMMIT and facts["files"] == 2
    assert facts["fingerprint"] == _stat_digest(snapshot, ["model.safetensors", "config.json"])
    # a branch that was never downloaded: null, with the file it looked for
    facts, why = model_revision("acme/tiny", revision="dev")
    assert facts["revision"] is None and str(storage / "refs" / "dev") in why
    # a revision given as a commit is that commit, downloaded or not
    other = "f" * 40
    assert model_revision("acme/other", revision=other)[0]["revision"] == other


def test_a_folder_fingerprint_changes_with_a_replaced_weight_file_and_never_reads_it(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 100)
    (tmp_path / "notes.txt").write_text("not a weight file")
    facts, why = model_revision(str(tmp_path))
    assert why == "" and facts["source"] == "folder" and facts["revision"] is None and facts["files"] == 1
    assert facts["fingerprint"] == _stat_digest(tmp_path, ["model.safetensors"])
    weights.write_bytes(b"b" * 100)  # same size, other bytes, a later mtime
    os.utime(weights, ns=(10**18, 10**18))
    assert model_revision(str(tmp_path))[0]["fingerprint"] != facts["fingerprint"]
    weights.chmod(0)  # unreadable bytes: the fingerprint needs only the stat
    try:
        assert model_revision(str(tmp_path))[0]["fingerprint"] == _stat_digest(tmp_path, ["model.safetensors"])
    finally:
        weights.chmod(0o644)


def test_a_gguf_file_and_a_hub_snapshot_folder(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 20)
    facts, why = model_revision(str(gguf))
    assert why == "" and facts["source"] == "file" and facts["files"] == 1
    assert facts["fingerprint"] == _stat_digest(tmp_path, ["m.gguf"])
    snapshot = tmp_path / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"w")
    assert model_revision(str(snapshot))[0]["revision"] == COMMIT
    empty = tmp_path / "empty"
    empty.mkdir()
    facts, why = model_revision(str(empty))
    assert facts["fingerprint"] is None and "holds no weight files" in why


def test_build_records_versions_seed_and_says_why_for_what_it_cannot_read(tmp_path, monkeypatch):
    (tmp_path / "model.safetensors").write_bytes(b"w")
    config = RunConfig().with_overrides([f"model.name_or_path={json.dumps(str(tmp_path))}", "train.seed=1234"])
    real_version = metadata.version

    def version(name):
        if name == "bitsandbytes":
            raise metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(provenance.metadata, "version", version)
    data = build_provenance(config, "cpu")
    assert data["seed"] == 1234
    assert data["versions"]["torch"] == real_version("torch")
    assert data["versions"]["transformers"] == real_version("transformers")
    assert data["versions"]["python"] == platform.python_version()
    assert data["versions"]["bitsandbytes"] is None and data["unknown"]["versions.bitsandbytes"] == "not installed"
    assert data["gpu"] is None and "cpu" in data["unknown"]["gpu"]
    assert data["os"] == platform.platform()
    json.dumps(data, allow_nan=False)  # strict JSON as it is


def test_gpu_facts_come_from_torch_and_nvml_and_a_missing_one_is_null_with_why(monkeypatch):
    import sys
    import types

    fake_cuda = types.SimpleNamespace(current_device=lambda: 0, get_device_name=lambda i: f"Fake GPU {i}")
    monkeypatch.setitem(
        sys.modules, "torch", types.SimpleNamespace(cuda=fake_cuda, version=types.SimpleNamespace(cuda="13.0"))
    )
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: b"580.65"
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpu, unknown = provenance._gpu("cuda:1")
    assert gpu == {"name": "Fake GPU 1", "driver": "580.65", "cuda": "13.0"} and unknown == {}

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    gpu, unknown = provenance._gpu("cuda")
    assert gpu["name"] == "Fake GPU 0" and gpu["driver"] is None
    assert "NVML Shared Library Not Found" in unknown["gpu.driver"]


def test_written_once_a_failure_only_logged_and_a_damaged_file_named(tmp_path, monkeypatch):
    (tmp_path / "model.safetensors").write_bytes(b"w")
    config = RunConfig().with_overrides([f"model.name_or_path={json.dumps(str(tmp_path))}"])
    run = tmp_path / "run"
    run.mkdir()
    path, why = write_provenance(run, config, "cpu")
    assert why == "" and path == run / PROVENANCE_FILE
    first = path.read_bytes()
    write_provenance(run, config.with_overrides(["train.seed=7"]), "cpu")  # a resume keeps what the run began with
    assert path.read_bytes() == first
    assert read_provenance(run)[0]["seed"] == config.train.seed

    full = tmp_path / "full"
    full.mkdir()

    def no_space(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("hone.core.train.safe_writes.replace_with", no_space)
    logged = []
    path, why = write_provenance(full, config, "cpu", log=logged.append)
    assert path is None and "No space left on device" in why and logged == [why]
    assert not (full / PROVENANCE_FILE).exists()

    (run / PROVENANCE_FILE).write_text("{not json")
    data, why = read_provenance(run)
    assert data is None and str(run / PROVENANCE_FILE) in why and "damaged" in why
    data, why = read_provenance(full)
    assert data is None and "missing" in why


def test_rerun_differences_name_each_changed_fact_and_ignore_when(tmp_path):
    before = {"format": 1, "recorded": 1.0, "seed": 3, "versions": {"torch": "2.11.0", "peft": "0.21"}, "unknown": {}}
    after = {
        "format": 1,
        "recorded": 2.0,
        "seed": 3,
        "versions": {"torch": "2.13.0", "peft": "0.21"},
        "unknown": {"x": "y"},
    }
    assert rerun_differences(before, after) == ["versions.torch: 2.11.0 → 2.13.0"]
    assert rerun_differences(before, before) == []

    old, new = tmp_path / "old", tmp_path / "new"
    for folder, data in ((old, before), (new, after)):
        folder.mkdir()
        (folder / PROVENANCE_FILE).write_text(json.dumps(data))
    matches, lines = rerun_report(old, 2.5, "", new, 2.5)
    assert matches and "matches" in lines[0] and lines[1].endswith("versions.torch: 2.11.0 → 2.13.0")
    matches, lines = rerun_report(old, 2.5, "", new, 2.75)
    assert not matches and "differs" in lines[0] and "0.25" in lines[0] and "1.00e-01 relative" in lines[0]
    matches, lines = rerun_report(old, None, "old/metrics.jsonl holds no step 1", new, 2.75)
    assert not matches and "not compared, old/metrics.jsonl holds no step 1" in lines[0]
