"""`adapter`: the run's PEFT folder, copied with its tokenizer and model card, and proven by reloading it.

Check: peft loads the copy onto the base model and its logits equal those of the run's own adapter folder (bit for
bit: the same weights through the same code); the copied tokenizer has the same chat template and encodes the
probe conversation to the same ids. How much the adapter changes the base model's logits is recorded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hone.core.export.card import CARD_FILE, write_model_card
from hone.core.export.checks import CheckLog, compare_logits, logits_of, probe_ids, quiet_transformers
from hone.core.export.formats import ExportResult, ExportSpec
from hone.core.export.source import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    Progress,
    RunSource,
    Steps,
    check_space,
    finish,
    open_run,
    output_folder,
    staged,
)
from hone.core.train.adapter_dir import base_model


def copy_adapter(run: RunSource, folder: Path, tokenizer) -> None:
    """Copy the adapter folder's files into `folder`; add tokenizer files and a model card where missing."""
    for path in run.adapter_dir.iterdir():
        if path.is_file():
            shutil.copy2(path, folder / path.name)
    if not (folder / "tokenizer_config.json").is_file():
        tokenizer.save_pretrained(folder)
    if not (folder / CARD_FILE).is_file():
        write_model_card(folder, "adapter", base_model(run.config.model).name, run.name)


def check_tokenizer_copy(log: CheckLog, name: str, original, folder: Path, **kwargs) -> None:
    """The tokenizer in `folder` has the original's chat template and encodes the probe the same way."""
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(folder, **kwargs)
    log.require(
        f"{name}.chat_template",
        copy.chat_template == original.chat_template,
        f"the tokenizer in {folder} lost or changed the chat template",
    )
    same = probe_ids(copy).tolist() == probe_ids(original).tolist()
    log.require(f"{name}.encoding", same, f"the tokenizer in {folder} encodes the probe conversation differently")


def export_adapter(run_dir, out=None, *, force: bool = False, progress: Progress | None = None) -> ExportResult:
    """Write the PEFT adapter folder (adapter weights and config, tokenizer with chat template, model card).

    Args:
        run_dir: a run folder with an adapter.
        out: output folder; default RUN_DIR/exports/adapter.
        force: replace an existing output folder written by an earlier export.
        progress: called as progress(stage, fraction done).
    """
    from peft import PeftModel

    spec = ExportSpec("adapter")
    run = open_run(run_dir)
    out = output_folder(run, spec, out, force)
    steps = Steps(progress, {"loading the base model": 2, "copying the adapter": 1, "checking the copy": 2})
    log = CheckLog()
    with staged(out, run.run_dir) as folder, quiet_transformers():
        check_space(folder, sum(p.stat().st_size for p in run.adapter_dir.iterdir() if p.is_file()))
        steps.start("loading the base model")
        loaded = run.load_base()
        tokenizer = run.tokenizer(fallback=loaded.tokenizer)
        ids = probe_ids(tokenizer)
        base_logits = logits_of(loaded.model, ids)
        steps.start("copying the adapter")
        copy_adapter(run, folder, tokenizer)
        steps.start("checking the copy")
        original = PeftModel.from_pretrained(loaded.model, run.adapter_dir)
        reference = logits_of(original.eval(), ids)
        base = original.unload()
        copy = PeftModel.from_pretrained(base, folder).eval()
        compare_logits(
            log,
            "adapter.reload.logits",
            logits_of(copy, ids),
            reference,
            0.0,
            "reloaded adapter vs the run's adapter logits",
        )
        effect = (reference - base_logits).abs().max().item()
        log.note("adapter.effect.max_abs_diff", effect)
        if effect == 0.0:
            log.note("adapter.warning", "the adapter does not change the logits at all (were its B matrices trained?)")
        log.require(
            "adapter.files",
            (folder / ADAPTER_WEIGHTS).is_file() and (folder / ADAPTER_CONFIG).is_file(),
            f"{ADAPTER_WEIGHTS} or {ADAPTER_CONFIG} is missing from the export",
        )
        steps.within(0.7)
        check_tokenizer_copy(log, "adapter.tokenizer", tokenizer, folder)
        result = finish(folder, out, run, spec, log)
    steps.done()
    return result
