"""An adapter names the base it belongs to in a form plain transformers + peft understand: the Hub id for the
bundled model (whose GGUF was made from it), the absolute folder otherwise, with a warning in its card. Export
folders are created with the user's umask."""

from __future__ import annotations

import json
import os
import stat

import pytest
from export_helpers import write_run

from hone.core.resources import BUNDLED_MODELS


def _adapter_config(run_dir):
    return json.loads((run_dir / "adapter" / "adapter_config.json").read_text(encoding="utf-8"))


def test_bundled_base_is_named_by_its_hub_id_and_loads_with_plain_peft(tmp_path, base_model_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder = base_model_dir("tiny-dense")
    model = AutoModelForCausalLM.from_pretrained(folder)
    from transformers import AutoTokenizer

    run = write_run(
        tmp_path / "run", "bundled:smollm2-135m-instruct", model=model, tokenizer=AutoTokenizer.from_pretrained(folder)
    )
    assert _adapter_config(run)["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    card = (run / "adapter" / "README.md").read_text(encoding="utf-8")
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    assert 'AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")' in card
    assert "GGUF" in card and "bundled:" not in card.split("---")[1]
    # The Hub can't be reached in tests: load the same architecture from a folder, as the card's code would.
    base = AutoModelForCausalLM.from_pretrained(folder)
    tuned = PeftModel.from_pretrained(base, run / "adapter").eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert not torch.equal(tuned(ids).logits, AutoModelForCausalLM.from_pretrained(folder)(ids).logits)


def test_local_folder_base_is_its_absolute_path_with_a_warning(tmp_path, base_model_dir, monkeypatch):
    import torch
    from peft import AutoPeftModelForCausalLM

    folder = base_model_dir("tiny-dense")
    monkeypatch.chdir(folder.parent)
    run = write_run(tmp_path / "run", folder.name)  # a relative path, as a user types it
    assert _adapter_config(run)["base_model_name_or_path"] == str(folder.resolve())
    card = (run / "adapter" / "README.md").read_text(encoding="utf-8")
    assert "only on this machine" in card
    monkeypatch.chdir(tmp_path)  # somewhere else: the adapter still finds its base
    model = AutoPeftModelForCausalLM.from_pretrained(run / "adapter")
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size


def test_bundled_models_table_names_hub_ids():
    assert all("/" in hub_id for hub_id in BUNDLED_MODELS.values())


@pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")
def test_staged_export_folder_follows_the_umask(tmp_path):
    from hone.core.export.source import staged

    previous = os.umask(0o022)
    try:
        with staged(tmp_path / "out") as folder:
            (folder / "f.txt").write_text("x")
            os.chmod(folder / "f.txt", 0o600)  # as tempfile.mkstemp makes them
            (folder / "sub").mkdir(mode=0o700)
    finally:
        os.umask(previous)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "f.txt").stat().st_mode) == 0o644
