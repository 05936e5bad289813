"""Every saved checkpoint of a run scored on held-out rows, beside the base model; the scores stored in the run folder.

The run's base model is loaded once and given the LoRA the run trained, built as the trainer builds it (the same
seed, `hone.core.train.lora.apply_lora`); each checkpoint's trainable weights are then copied in turn into that one
model, and the base is the same model with its adapter switched off. Per model, on the same rows:

    held-out loss    mean cross-entropy per reference token, the tokens the run trains on (data.train_on) of the
                     row rendered through the chat template with its reference reply; perplexity = exp(loss)
    answers          greedy, up to the longest reference and a few tokens more, scored by
                     hone.core.inference.answer_scores (exact, normalized, word F1, contains, JSON validity)

A model already scored on the same rows of the same file (sha256) with the same weights is not scored again: its
entry in RUN_DIR/scores.json (hone.core.inference.score_store) is reused. Each model's entry is stored as soon as it
is scored, so stopping a long evaluation keeps what was done.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.errors import HoneError
from hone.core.inference.answer_scores import answer_metrics
from hone.core.inference.evaluate import with_references
from hone.core.inference.prompts import Prompt, read_prompts
from hone.core.inference.score_store import (
    DEFAULT_METRIC,
    DataKey,
    ScoreEntry,
    best_entry,
    file_sha256,
    now,
    read_scores,
    store_scores,
)

# Rows `hone eval` scores unless told (its --rows), and train.eval_checkpoints at the end of a run.
DEFAULT_ROWS = 20
# Tokens generated past the longest reference: a longer answer cannot turn a wrong one right (as in `hone eval`).
ANSWER_SLACK = 8
ALL, BEST = "all", "best"
# A checkpoint's manifest lists four files; one of over a megabyte is not Hone's.
_MAX_MANIFEST_BYTES = 1 << 20

Progress = Callable[[str, int, int], None]  # (what is being scored, rows done, rows in all)


@dataclass(frozen=True)
class SavedCheckpoint:
    """A complete checkpoint of the run: its step, folder and the sha256 its manifest gives trainable.safetensors."""

    step: int
    folder: Path
    weights_sha256: str


def saved_checkpoints(run_dir: Path) -> tuple[list[SavedCheckpoint], dict[int, str]]:
    """The run's complete checkpoints, oldest first, and {step: why not} for its step folders that are not."""
    from hone.core.train import checkpoints as ckpt
    from hone.core.train import json_checks

    complete, broken = ckpt.checkpoint_report(run_dir, hashes=False)
    found = []
    for folder in complete:
        step = int(folder.name.rsplit("-", 1)[1])
        try:  # `checkpoint_report` read it a moment ago; it may have changed since
            manifest = json_checks.read_object(folder / ckpt.MANIFEST_FILE, _MAX_MANIFEST_BYTES) or {}
        except json_checks.Damaged as e:
            broken[step] = f"damaged ({ckpt.MANIFEST_FILE} {e})"
            continue
        files = manifest.get("files")
        entry = files.get(ckpt.WEIGHTS_FILE) if isinstance(files, dict) else None
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha, str):
            broken[step] = f"damaged ({ckpt.MANIFEST_FILE} gives {ckpt.WEIGHTS_FILE} no sha256)"
            continue
        found.append(SavedCheckpoint(step, folder, sha))
    return found, dict(sorted(broken.items()))


def select_checkpoints(run_dir: Path, which: str) -> tuple[list[SavedCheckpoint], list[str]]:
    """The checkpoints `which` names ("all", "best": every one; "20,40": those steps) and a sentence for each step
    folder left out as incomplete or damaged.

    Raises:
        HoneError: the run has no complete checkpoint, `which` is not a list of steps, or names a step that has none
            (the message lists the steps there are).
    """
    found, broken = saved_checkpoints(run_dir)
    notes = [f"checkpoint step-{step:06d} is {why}: left out" for step, why in broken.items()]
    if not found:
        raise HoneError(
            f"run {run_dir.name} has no complete checkpoint in {run_dir / 'checkpoints'}",
            "train with output.checkpoint_every = N to save one every N steps (a run saves one at its end too)",
        )
    text = which.strip().lower()
    if text in (ALL, BEST):
        return found, notes
    by_step = {c.step: c for c in found}
    steps: list[int] = []
    for part in text.split(","):
        if not part.strip().isdigit():
            raise HoneError(
                f"--checkpoints {which!r}: {part.strip()!r} is not a step",
                f"give all, best, or steps separated by commas, from: {_steps(found)}",
            )
        steps.append(int(part))
    missing = [s for s in steps if s not in by_step]
    if missing:
        raise HoneError(
            f"run {run_dir.name} has no checkpoint of step {', '.join(map(str, missing))}",
            f"its checkpoints are of steps {_steps(found)} (output.keep_checkpoints keeps the newest); "
            "choose from those, or all",
        )
    return [by_step[s] for s in sorted(set(steps))], notes


def _steps(found: list[SavedCheckpoint]) -> str:
    return ", ".join(str(c.step) for c in found)


@dataclass
class ScoreTable:
    """The result of one `score_checkpoints`: the base's entry and each selected checkpoint's, in step order.

    Attributes:
        reused: labels ("base", "step 20") of the entries taken from scores.json instead of scored now.
        notes: sentences to show: rows skipped, checkpoints left out, a damaged scores.json rescored.
        skipped: "file:row: why" for each row of the data file that is no prompt.
    """

    data: DataKey
    base: ScoreEntry | None
    checkpoints: list[ScoreEntry]
    reused: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def best(self, by: str = DEFAULT_METRIC) -> ScoreEntry | None:
        return best_entry(self.checkpoints, by)


class CheckpointModel:
    """The run's base model with its LoRA, each checkpoint's weights loaded in turn (`load`); eval mode.

    Args:
        run_dir: the run folder.
        config: its RunConfig.
        device: where to run; None = CUDA when there is one.
    """

    def __init__(self, run_dir: Path, config, device: str | None = None):
        import torch

        from hone.core.data.template import apply_template_setting
        from hone.core.models.load import load_model, load_tokenizer, pick_device
        from hone.core.train.lora import apply_lora
        from hone.core.train.run_dir import ADAPTER_DIR

        self.device = device or pick_device()
        loaded = load_model(config.model, device=self.device, for_training=False)
        adapter_dir = Path(run_dir) / ADAPTER_DIR
        # The tokenizer saved with the adapter carries the template the run trained with; before the run's end there
        # is none, and the base's gets the template setting, as the trainer gave it.
        if (adapter_dir / "tokenizer_config.json").is_file() and not hasattr(loaded.tokenizer, "tokenizer"):
            self.tokenizer = load_tokenizer(str(adapter_dir), None, config.model)
        else:
            self.tokenizer = loaded.tokenizer
            apply_template_setting(self.tokenizer, config.data.chat_template)
        torch.manual_seed(config.train.seed)  # as the trainer does: the LoRA's shape does not depend on it, but no
        model, _ = apply_lora(loaded.model, config.lora, loaded.info)  # freshly initialized weight goes unreplaced
        self.model = model.eval()
        self.params = dict(model.named_parameters())
        self.step: int | None = None

    @classmethod
    def from_trained(cls, model, tokenizer, device) -> CheckpointModel:
        """The model a run has just trained (its LoRA on, its speed paths' own tables back in place), not a second
        copy: each checkpoint's weights are copied into it in turn, so it ends holding the last one scored."""
        self = cls.__new__(cls)
        self.device, self.tokenizer = device, tokenizer
        self.model = model.eval()
        self.params = dict(model.named_parameters())
        self.step = None
        return self

    def load(self, checkpoint: SavedCheckpoint) -> None:
        """Copy the checkpoint's trainable tensors into the model, after checking the file against its manifest's
        sha256 and each tensor against the model's parameter of that name.

        Raises:
            HoneError: the file is damaged, or holds a tensor this model lacks or of another shape.
        """
        import torch
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from hone.core.train.checkpoints import WEIGHTS_FILE

        path = checkpoint.folder / WEIGHTS_FILE
        if file_sha256(path) != checkpoint.weights_sha256:
            raise HoneError(
                f"{path} does not match the sha256 its manifest gives it: the checkpoint is damaged",
                f"score the other checkpoints (--checkpoints STEP,...), or move {checkpoint.folder} away",
            )
        try:
            weights = load_file(path)
        except (SafetensorError, OSError) as e:
            raise HoneError(
                f"{path} cannot be read: {e}", f"move {checkpoint.folder} away and score the others"
            ) from None
        lacking = sorted(set(weights) - set(self.params))
        other = [n for n, t in weights.items() if n in self.params and t.shape != self.params[n].shape]
        if lacking or other:
            what = f"tensors this model lacks: {lacking[:3]}" if lacking else f"{other[0]} of another shape"
            raise HoneError(
                f"{path} holds {what}",
                "the run's config.toml (model, lora) no longer matches the checkpoint: score a run as it was trained",
            )
        with torch.no_grad():
            for name, tensor in weights.items():
                self.params[name].copy_(tensor.to(self.params[name].device))
        self.step = checkpoint.step


@dataclass(frozen=True)
class HeldOutRow:
    """One held-out row ready to score: the prompt, its reference and its tokens with the trained ones marked."""

    prompt: Prompt
    ids: Any  # int64 (1, L)
    trained: Any  # bool (L,): token t is a target (its prediction, at t - 1, is in the loss)


def held_out_rows(prompts: list[Prompt], tokenizer, config, source: Path) -> tuple[list[HeldOutRow], list[str]]:
    """Each prompt rendered with its reference reply through the chat template and tokenized as the run's data is
    (data.max_length, data.train_on); a row that cannot be is named, with why, and left out of the loss."""
    import torch

    from hone.core.data.labels import RowEncoder
    from hone.core.data.rows import Row, RowProblem

    encoder = RowEncoder(tokenizer, max_length=config.data.max_length, train_on=config.data.train_on)
    rows = [
        Row(
            source=f"{source}:{p.row}",
            messages=[*p.messages, {"role": "assistant", "content": p.reference or ""}],
            format="messages",
        )
        for p in prompts
    ]
    out, left_out = [], []
    for prompt, encoded in zip(prompts, encoder.encode(rows), strict=True):
        if isinstance(encoded, RowProblem):
            left_out.append(f"{encoded.source}: {encoded.detail} (left out of the held-out loss)")
            continue
        ids = torch.as_tensor(encoded.ids, dtype=torch.long).unsqueeze(0)
        trained = torch.as_tensor(encoded.trained, dtype=torch.bool)
        if trained[1:].any():
            out.append(HeldOutRow(prompt, ids, trained))
    return out, left_out


def held_out_loss(model, rows: list[HeldOutRow], device) -> float:
    """Mean cross-entropy per trained token over `rows` (each token weighs the same, whatever its row)."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.inference_mode():
        for row in rows:
            logits = model(input_ids=row.ids.to(device)).logits[0, :-1].float()  # (L-1, vocab) float32
            targets = row.ids[0, 1:].to(device)
            keep = row.trained[1:].to(device)
            total += float(F.cross_entropy(logits[keep], targets[keep], reduction="sum"))
            count += int(keep.sum())
    return total / max(count, 1)


def _answers(model: CheckpointModel, prompts: list[Prompt], adapter: bool, tick: Callable[[], None]) -> list[str]:
    from hone.core.inference.chat import GenerationSettings, stream_reply

    tokenizer = getattr(model.tokenizer, "tokenizer", model.tokenizer)
    longest = max(len(tokenizer(p.reference or "", add_special_tokens=False)["input_ids"]) for p in prompts)
    settings = GenerationSettings(max_new_tokens=longest + ANSWER_SLACK)
    answers = []
    for prompt in prompts:
        pieces = stream_reply(model.model, model.tokenizer, prompt.messages, settings, adapter_enabled=adapter)
        answers.append("".join(pieces))
        tick()
    return answers


def _score_one(
    model: CheckpointModel,
    checkpoint: SavedCheckpoint | None,
    rows: list[HeldOutRow],
    prompts: list[Prompt],
    progress: Progress | None,
) -> dict[str, float | None]:
    """The metrics of one checkpoint (its weights loaded into `model`), or of the base (None: the adapter off)."""
    label = "the base model" if checkpoint is None else f"checkpoint step {checkpoint.step}"
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(label, done, len(prompts))

    if progress is not None:
        progress(label, 0, len(prompts))
    if checkpoint is not None:
        model.load(checkpoint)
    with nullcontext() if checkpoint is not None else model.model.disable_adapter():
        loss = held_out_loss(model.model, rows, model.device) if rows else math.nan
    answers = _answers(model, prompts, checkpoint is not None, tick)
    metrics: dict[str, float | None] = {
        "loss": loss if math.isfinite(loss) else None,
        "perplexity": math.exp(loss) if math.isfinite(loss) and loss < 700 else None,  # exp(700) ~ float's limit
    }
    metrics.update(answer_metrics(answers, [p.reference or "" for p in prompts]))
    return metrics


def score_checkpoints(
    run_dir: str | Path,
    config,
    checkpoints: list[SavedCheckpoint],
    data: Path,
    rows: int | None = None,
    *,
    device: str | None = None,
    progress: Progress | None = None,
    loading: Callable[[], Any] | None = None,
    model: CheckpointModel | None = None,
) -> ScoreTable:
    """Score the base and each of `checkpoints` on the first `rows` rows with a reference of `data` (None: all),
    reusing the stored entries of the same weights on the same rows; store the new ones in RUN_DIR/scores.json.

    Args:
        loading: a context manager factory entered while the model loads (the CLI's progress line); only called when
            something is scored.
        model: the model to score with (`CheckpointModel.from_trained`: the run's own, at its end); None = load it.

    Raises:
        HoneError: the data file cannot be read or has no row with a reference; a checkpoint is damaged.
    """
    run_dir = Path(run_dir)
    prompts, skipped = read_prompts(data)
    prompts = with_references(prompts, rows)
    key = DataKey(str(data.resolve()), file_sha256(data), len(prompts))
    stored = read_scores(run_dir)
    table = ScoreTable(data=key, base=None, checkpoints=[], skipped=skipped)
    if stored.damage:
        table.notes.append(f"{stored.damage}; what cannot be read is scored again")
    todo: list[SavedCheckpoint | None] = []
    for checkpoint in [None, *checkpoints]:
        found = stored.find(_step(checkpoint), _weights(checkpoint, config), key)
        if found is None:
            todo.append(checkpoint)
        else:
            table.reused.append(found.label)
            _add(table, found)
    if todo:
        if model is None:
            with loading() if loading is not None else nullcontext():
                model = CheckpointModel(run_dir, config, device)
        held, left_out = held_out_rows(prompts, model.tokenizer, config, data)
        table.notes += left_out
        for checkpoint in todo:
            metrics = _score_one(model, checkpoint, held, prompts, progress)
            entry = ScoreEntry(_step(checkpoint), _weights(checkpoint, config), key, metrics, now())
            store_scores(run_dir, [entry])  # at once: a stop later keeps what was scored
            _add(table, entry)
    table.checkpoints.sort(key=lambda e: e.checkpoint or 0)
    return table


def _step(checkpoint: SavedCheckpoint | None) -> int | None:
    return None if checkpoint is None else checkpoint.step


def _weights(checkpoint: SavedCheckpoint | None, config) -> str:
    """What an entry's weights are known by: the checkpoint's weights file's sha256, or the base model's name."""
    return f"base:{config.model.name_or_path}" if checkpoint is None else checkpoint.weights_sha256


def _add(table: ScoreTable, entry: ScoreEntry) -> None:
    if entry.checkpoint is None:
        table.base = entry
    else:
        table.checkpoints.append(entry)


def score_after_training(run_dir: str | Path, config, model, tokenizer, device, progress: Progress | None = None):
    """train.eval_checkpoints: every saved checkpoint of a run that has just ended, and the base, scored as
    `hone eval RUN --checkpoints all` scores them (the first DEFAULT_ROWS rows with a reference of the run's first
    data.eval file, stored in scores.json), with the model the run trained: no second copy is loaded.

    Returns:
        The ScoreTable; its notes start with the checkpoint folders left out.
    """
    from hone.core.inference.evaluate import held_out_file

    checkpoints, notes = select_checkpoints(Path(run_dir), ALL)
    trained = CheckpointModel.from_trained(model, tokenizer, device)
    table = score_checkpoints(
        run_dir, config, checkpoints, held_out_file(config), DEFAULT_ROWS, progress=progress, model=trained
    )
    table.notes[:0] = notes
    return table
