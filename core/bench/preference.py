"""Preference training speed: Hone's DPO against TRL's DPOTrainer with peft, in one process.

`hone bench dpo-8b` builds a Qwen3-8B-shaped model (random init, bf16) and generated prompt / chosen / rejected
rows, then trains LoRA with DPO twice: through Hone's Trainer (`train.method = "dpo"`: both sides of each pair in one
packed batch, log-probabilities from the chunked loss path, the reference as the adapter switched off) and through
TRL's DPOTrainer set up as its documentation does with peft (`peft_config`: the reference is the same weights with
the adapter disabled; padded batches of pairs, since TRL's padding-free DPO is unavailable in the versions tested;
gradient checkpointing). `hone bench tiny-dpo` does the same on a tiny model, on the CPU too. Both runs train the
same trainable parameters; TRL's batch holds as many pairs as Hone's packed batch holds tokens, on average.
`--peer unsloth` adds a third run: the TRL run's pairs and sizes through Unsloth's DPO (`peer_unsloth_trl`).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hone.core.bench.dpo_trl_steps import BETA, trl_steps
from hone.core.bench.measure import RunResult, free_memory
from hone.core.bench.peer_unsloth import PEER_NAME
from hone.core.bench.report import environment
from hone.core.bench.scenarios import Scenario, check_sizes, get_scenario
from hone.core.bench.vision import WORDS, VisionOptions, VisionReport, _measure, hone_steps
from hone.core.bench.vision_steps import RunSteps
from hone.core.bench.weights import build_bench_model
from hone.core.errors import ConfigError, HoneError

BASELINE = "trl"
PREFERENCE_BASELINE = BASELINE  # as hone.core.api.bench offers it (its BASELINE is the other scenarios')
# Pairs generated per step of the batch, so that no run sees a pair twice in the steps it is timed on.
PAIRS_PER_STEP_MARGIN = 3
# Parity: both runs start from a zero LoRA B, so their first loss is DPO's log 2, up to the precision of the dtype.
FIRST_LOSS_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}


@dataclass
class PreferenceReport(VisionReport):
    """The runs, compared against TRL's; `to_dict` is the JSON record (the vision report's fields)."""

    pairs: dict = field(default_factory=dict)  # what the generated pairs are: count, lengths, TRL's batch size

    def to_dict(self) -> dict:
        return {**super().to_dict(), "baseline": BASELINE, "pairs": self.pairs}


def make_pairs(count: int, min_words: int, max_words: int, seed: int = 0) -> list[dict]:
    """`count` plain-text pairs of random sentences, each part's length drawn log-uniform in [min_words, max_words]
    (chat data's shape: many short parts, a few long ones)."""
    rng = random.Random(seed)
    low, high = math.log(min_words), math.log(max_words)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(round(math.exp(rng.uniform(low, high)))))

    return [{"prompt": sentence(), "chosen": " " + sentence(), "rejected": " " + sentence()} for _ in range(count)]


def part_tokens(pairs: list[dict], tokenizer) -> list[tuple[int, int, int]]:
    """(prompt, chosen, rejected) tokens of each pair."""

    def lengths(part: str) -> list[int]:
        return [len(ids) for ids in tokenizer([p[part] for p in pairs], add_special_tokens=False)["input_ids"]]

    return list(zip(lengths("prompt"), lengths("chosen"), lengths("rejected")))


def pair_tokens(pairs: list[dict], tokenizer) -> list[int]:
    """Tokens each pair trains on: the prompt twice (once per side) and both answers."""
    return [2 * p + c + r for p, c, r in part_tokens(pairs, tokenizer)]


def _model_folder(folder: Path, scenario: Scenario, layers: int | None, dtype: torch.dtype, device: str, tokenizer):
    """The scenario's random-init model with SmolLM2's tokenizer, saved as a downloaded model would be."""
    model = build_bench_model(scenario, layers, seed=0, dtype=dtype, device=device)
    out = folder / "model"
    model.save_pretrained(out)
    del model
    free_memory(device)
    tokenizer.save_pretrained(out)
    return out


def _load_tokenizer(folder: Path, given: str | None):
    from transformers import AutoTokenizer

    if given:
        return AutoTokenizer.from_pretrained(given)
    from hone.core.resources import smollm2_gguf

    gguf = smollm2_gguf()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder / "tokenizer")
    return AutoTokenizer.from_pretrained(folder / "tokenizer")


def _check(options: VisionOptions, scenario: Scenario) -> str:
    """The device the runs train on, after checking the options."""
    if scenario.kind != "preference":
        raise ConfigError(f"{scenario.name} is a {scenario.kind} scenario, not a preference one", "")
    check_sizes(options.steps, options.warmup, options.lora_r, options.layers)
    if options.only or options.profile_top:
        raise ConfigError(
            f"{scenario.name} makes Hone's DPO run and TRL's (and the peer's with --peer) and takes no --only or "
            "--profile",
            "leave them out",
        )
    if options.tokens is not None and options.tokens < 64:
        raise ConfigError(f"--tokens is {options.tokens}", f"give the tokens per step, e.g. {scenario.tokens}")
    if torch.cuda.is_available():
        return "cuda"
    if not scenario.is_tiny:
        raise ConfigError(
            f"the {scenario.name} benchmark needs a CUDA GPU and there is none here", "tiny-dpo runs on a CPU"
        )
    return "cpu"


def _parity(runs: list[RunResult], dtype: str) -> None:
    """Like for like: the same trainable parameters and the same first loss (log 2 from a zero LoRA B). The runs
    batch different pairs (packed by tokens vs a count of pairs), so later losses are no check."""
    reference = next((r for r in runs if r.name == BASELINE and r.ok), None)
    for run in runs:
        if reference is None or not run.ok or run.first_loss is None or reference.first_loss is None:
            continue
        run.loss_diff = run.first_loss - reference.first_loss
        run.loss_rel_diff = abs(run.loss_diff) / max(abs(reference.first_loss), 1e-12)
        if run.trainable_params != reference.trainable_params:
            run.parity = False
            run.parity_reason = f"{run.trainable_params:,} trainable parameters vs {reference.trainable_params:,}"
        else:
            run.parity = (
                abs(run.first_loss - math.log(2)) < FIRST_LOSS_TOLERANCE[dtype]
                and abs(reference.first_loss - math.log(2)) < FIRST_LOSS_TOLERANCE[dtype]
            )
            if not run.parity:
                run.parity_reason = f"first losses {run.first_loss:.5f} and {reference.first_loss:.5f}, not log 2"
        if run.tokens_per_s and reference.tokens_per_s:
            run.speed_ratio = run.tokens_per_s / reference.tokens_per_s
        if run.peak_allocated_gib and reference.peak_allocated_gib:
            run.memory_ratio = run.peak_allocated_gib / reference.peak_allocated_gib
    peer = next((r for r in runs if r.name == PEER_NAME and r.ok and r.tokens_per_s), None)
    for run in runs:
        if peer is not None and run.ok and run.tokens_per_s and run is not peer:
            run.speed_ratios[PEER_NAME] = run.tokens_per_s / peer.tokens_per_s


def run_preference_bench(options: VisionOptions, *, on_result=None, on_start=None) -> PreferenceReport:
    """Run the preference benchmark `options` describes: TRL's DPOTrainer first (the baseline), then Hone's Trainer
    on the same model folder and pairs.

    Raises:
        ConfigError: not a preference scenario, a bad size, a real scenario without a CUDA GPU, no tokenizer.
    """
    started = time.perf_counter()
    scenario = get_scenario(options.scenario)
    device = _check(options, scenario)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    dtype_name = str(dtype).removeprefix("torch.")
    step_tokens = options.tokens or scenario.tokens
    steps = options.warmup + options.steps
    with tempfile.TemporaryDirectory(prefix="hone-preference-bench-") as folder:
        tmp = Path(folder)
        if on_start:
            on_start("generated pairs and model")
        try:
            tokenizer = _load_tokenizer(tmp, options.tokenizer)
        except HoneError as e:
            raise ConfigError(e.message, f"{e.advice}, or give --tokenizer a folder with SmolLM2's tokenizer") from None
        sample = make_pairs(256, scenario.min_len, scenario.max_len, seed=1)
        mean_pair = statistics.mean(pair_tokens(sample, tokenizer))
        pairs_per_step = max(1, round(step_tokens / mean_pair))
        pairs = make_pairs(pairs_per_step * steps * PAIRS_PER_STEP_MARGIN, scenario.min_len, scenario.max_len)
        # the longest sequence (a prompt and one answer), with room for the special tokens either trainer adds
        max_length = max(p + max(c, r) for p, c, r in part_tokens(pairs, tokenizer)) + 8
        if 2 * max_length > step_tokens:
            raise ConfigError(
                f"--tokens {step_tokens}: a pair of the longest generated rows takes {2 * max_length} tokens",
                f"give at least {2 * max_length}",
            )
        data = tmp / "pairs.jsonl"
        data.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
        layers = options.layers or scenario.layers
        model_dir = _model_folder(tmp, scenario, layers, dtype, device, tokenizer)
        report = PreferenceReport(
            options=options,
            scenario=scenario,
            device=device,
            dtype=dtype_name,
            environment=environment(device),
            runs=[],
            batch={"tokens_per_step": step_tokens, "layers": layers, "shape": scenario.shape, "beta": BETA},
            pairs={"count": len(pairs), "mean_tokens": round(mean_pair, 1), "trl_pairs_per_step": pairs_per_step},
        )

        # what TRL's run and the peer's (on TRL's trainer) share: the pairs and batch sizes
        sizes = dict(
            steps=steps,
            warmup=options.warmup,
            pairs_per_step=pairs_per_step,
            max_length=max_length,
            lora_r=options.lora_r,
            device=device,
        )

        def trl_run() -> RunSteps:
            return trl_steps(model_dir, pairs, tmp / "trl", **sizes)

        def hone_run() -> RunSteps:
            overrides = (
                'train.method="dpo"',
                f"preference.beta={BETA}",
                "data.eval_fraction=0",
                f"data.max_length={max_length}",
                f"model.dtype={dtype_name}",
                'train.schedule="constant"',
                "train.warmup_steps=0",
            )
            return hone_steps(
                model_dir,
                data,
                tmp / "runs",
                steps=steps,
                warmup=options.warmup,
                batch_tokens=step_tokens,
                lora_r=options.lora_r,
                overrides=overrides,
            )

        def peer_run() -> RunSteps:
            from hone.core.bench.peer_unsloth_trl import unsloth_dpo_steps

            return unsloth_dpo_steps(model_dir, pairs, tmp / PEER_NAME, **sizes)

        runs = (
            (
                BASELINE,
                "reference",
                f"TRL's DPOTrainer with peft: {pairs_per_step} padded pairs a step, the adapter disabled as reference",
                trl_run,
            ),
            (
                "hone",
                "hone",
                "Hone's Trainer, train.method = dpo: both sides packed, chunked log-probs, its own speed paths",
                hone_run,
            ),
        )
        if options.peer == PEER_NAME:
            runs += (
                (
                    PEER_NAME,
                    "peer",
                    f"Unsloth's DPO (its patched DPOTrainer and FastLanguageModel): TRL's {pairs_per_step} padded "
                    "pairs a step",
                    peer_run,
                ),
            )
        for name, kind, description, run in runs:
            if on_start:
                on_start(name)
            result = _measure(name, kind, description, run, options, report, device)
            report.runs.append(result)
            if on_result:
                on_result(result)
    _parity(report.runs, dtype_name)
    report.elapsed_s = time.perf_counter() - started
    return report
