"""Vision-language training speed: Hone's Trainer against plain transformers + peft, in one process, on one GPU.

`hone bench vision-qwen2.5-vl` builds a Qwen2.5-VL-3B-shaped model (random init, bf16) and mixed rows (text-only,
and a 448 px image with text), then trains LoRA on its language model twice: through Hone's Trainer (packed rows,
chunked loss, its own speed choices) and as a plain transformers + peft script does (the same batches of rows,
padded; the model's own loss; transformers' gradient checkpointing); `--peer unsloth` adds Unsloth's vision path on
those padded batches (`peer_unsloth_vision`). `hone bench vision-smolvlm` does the same with a SmolVLM-shaped
model. Each run becomes a `RunResult` that `report.compare` and `report.ratio_table` treat like a text scenario's.
Needs a CUDA GPU.
"""

from __future__ import annotations

import fnmatch
import json
import random
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from hone.core.bench.measure import GIB, RunResult, allocated_gib, free_memory, record_failure
from hone.core.bench.peer_unsloth import PEER_NAME
from hone.core.bench.report import compare, environment
from hone.core.bench.scenarios import Scenario, check_sizes, get_scenario
from hone.core.bench.vision_steps import IMAGE_SIDE, RunSteps, padded_batches, padded_steps
from hone.core.errors import ConfigError, HoneError
from hone.core.models.hub_kernels import from_pretrained_options

# Rows per kind in the generated data: enough for several batches of 8K tokens.
IMAGE_ROWS = 96
TEXT_ROWS = 96
BASELINE = "reference"
WORDS = (
    "the",
    "model",
    "reads",
    "a",
    "picture",
    "and",
    "a",
    "question",
    "then",
    "answers",
    "in",
    "a",
    "few",
    "words",
    "about",
    "colors",
    "shapes",
    "and",
    "places",
    "people",
    "like",
    "to",
    "train",
    "small",
    "models",
    "on",
    "their",
    "own",
    "data",
    "because",
    "it",
    "is",
    "fast",
    "and",
    "cheap",
)
# The reference's LoRA targets: every linear layer of the language model (`language_model` in Qwen-VL, `text_model`
# in Idefics3), none in the vision encoder.
REFERENCE_TARGETS = r".*(language_model|text_model).*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
# Hone's Trainer runs: its own choices, and with the memory-saving paths its `auto` takes turned off one at a time
# and all together (`--only`), to see what each costs a vision step when the GPU has memory to spare.
HONE_RUNS = {
    "hone": ("Hone's Trainer: packed rows, chunked loss, its own speed choices", ()),
    "hone-ckpt-gpu": (
        "Hone's Trainer, checkpoints recomputed from layer inputs kept on the GPU (not offloaded)",
        ('speed.checkpoint="gpu"',),
    ),
    "hone-untiled": ("Hone's Trainer, each MLP back-propagated whole (not in tiles)", ("speed.tiled_mlp=false",)),
    "hone-head-gpu": (
        "Hone's Trainer, the LM head kept in GPU memory (not copied from the host)",
        ("speed.host_lm_head=false",),
    ),
    "hone-spare": (
        "Hone's Trainer with none of the three above: checkpoints on the GPU, whole MLPs, the LM head on the GPU",
        ('speed.checkpoint="gpu"', "speed.tiled_mlp=false", "speed.host_lm_head=false"),
    ),
}


@dataclass
class VisionOptions:
    """What `hone bench vision-...` was asked to do (CLI flags, one to one).

    Attributes:
        scenario: a scenario of kind "vision".
        tokens: tokens per micro-batch (None: the scenario's).
        layers: text layers to build (None: the scenario's).
        lora_r: LoRA rank, alpha = 2 x rank, in both runs.
        steps, warmup: timed optimizer steps per run, and untimed ones before them.
        tokenizer: a folder with SmolLM2's tokenizer (None: read it from the bundled GGUF).
        only: Hone runs to make (names of HONE_RUNS, shell patterns allowed; None: "hone"); the reference always
            runs.
        profile_top: > 0: each Hone run trains one more step under torch.profiler (`--profile`).
    """

    scenario: str
    tokens: int | None = None
    layers: int | None = None
    lora_r: int = 16
    steps: int = 5
    warmup: int = 2
    tokenizer: str | None = None
    peer: str | None = None  # "unsloth": also train the same padded batches through Unsloth, in a child process
    only: list[str] | None = None
    profile_top: int = 0  # > 0: Hone's runs profile one more step, this many rows per table (`--profile`)


@dataclass
class VisionReport:
    """Both runs, compared against the reference; `to_dict` is the JSON record."""

    options: VisionOptions
    scenario: Scenario
    batch: dict
    device: str
    dtype: str
    environment: dict
    runs: list[RunResult]
    losses: dict[str, list[float]] = field(default_factory=dict)  # every step's loss per run, warm-up included
    notices: dict[str, list[str]] = field(default_factory=dict)  # what Hone's Trainer said while it ran
    data_wait: dict[str, list[float]] = field(default_factory=dict)  # seconds each step waited for its batches
    elapsed_s: float = 0.0

    def run(self, name: str) -> RunResult:
        return next(r for r in self.runs if r.name == name)

    def to_dict(self) -> dict:
        return {
            "schema": 1,
            "scenario": asdict(self.scenario),
            "options": asdict(self.options),
            "device": self.device,
            "dtype": self.dtype,
            "batch": self.batch,
            "environment": self.environment,
            "baseline": BASELINE,
            "runs": [r.to_dict() for r in self.runs],
            "losses": self.losses,
            "notices": self.notices,
            "data_wait_s": self.data_wait,
            "elapsed_s": self.elapsed_s,
        }


def make_data(folder: Path, seed: int = 0) -> Path:
    """A JSONL of mixed rows (random sentences; noise images) under `folder`."""
    import numpy as np
    from PIL import Image

    rng = random.Random(seed)
    noise = np.random.default_rng(seed)
    rows = []
    for n in range(IMAGE_ROWS):
        path = folder / f"img{n}.png"
        Image.fromarray(noise.integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)).save(path)
        rows.append(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "image": path.name},
                            {"type": "text", "text": " ".join(rng.choices(WORDS, k=40))},
                        ],
                    },
                    {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(60, 200)))},
                ]
            }
        )
    for _ in range(TEXT_ROWS):
        question, answer = (" ".join(rng.choices(WORDS, k=rng.randint(50, n))) for n in (300, 400))
        rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    rng.shuffle(rows)
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return data


def model_folder(folder: Path, family: str, layers: int, tokenizer_dir: Path | None = None) -> Path:
    """The random-init model at its real shape, with SmolLM2's tokenizer (from `tokenizer_dir`, else read from the
    bundled GGUF), saved under `folder` as a downloaded model would be."""
    from transformers import AutoTokenizer

    from hone.core.resources import smollm2_gguf
    from hone.core.vision import tiny

    if tokenizer_dir is None:
        gguf = smollm2_gguf()
        tokenizer_dir = folder / "tokenizer"
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tokenizer_dir)
    tokenizer = tiny.vision_tokenizer(family, tokenizer_dir)
    # random init of billions of weights takes minutes on the CPU and seconds on the GPU
    model = tiny.build_vision_model(
        family,
        tokenizer,
        shape="real",
        layers=layers,
        dtype=torch.bfloat16,
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    out = folder / "model"
    model.save_pretrained(out)
    del model
    free_memory("cuda")
    tiny.build_processor(family, tokenizer, shape="real").save_pretrained(out)
    return out


def hone_steps(
    model_dir: Path,
    data: Path,
    runs_dir: Path,
    *,
    steps: int,
    warmup: int,
    batch_tokens: int,
    lora_r: int,
    overrides: tuple[str, ...] = (),
    profile_top: int = 0,
) -> RunSteps:
    """Hone's Trainer for `steps` optimizer steps (`warmup` of them untimed), as `hone train` runs it, with
    `overrides` (config settings, "speed.checkpoint=\"gpu\"") on top. `profile_top` > 0: one more step under
    torch.profiler (hone.core.bench.diagnostics.profile), left out of the step times."""
    from hone.core import events
    from hone.core.bench.diagnostics.profile import StepProfile
    from hone.core.config import RunConfig
    from hone.core.train.trainer import Trainer

    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(model_dir))}",
            f"data.train=[{json.dumps(str(data))}]",
            f"output.runs_dir={json.dumps(str(runs_dir))}",
            "model.dtype=bfloat16",
            f"data.max_length={batch_tokens}",
            f"data.image_max_side={IMAGE_SIDE}",
            f"train.batch_tokens={batch_tokens}",
            f"train.max_steps={steps + (1 if profile_top else 0)}",
            "train.lr=1e-4",
            f"lora.r={lora_r}",
            f"lora.alpha={2 * lora_r}",
            "output.checkpoint_every=0",
            *overrides,
        ]
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    out = RunSteps()
    metrics = []
    trainer = Trainer(config)
    profile = None
    for event in trainer.run():
        if isinstance(event, events.StepMetrics):
            if profile is not None:  # the extra step ran under the profiler
                profile.stop()
                out.profile = profile.summary
                continue
            metrics.append(event)
            if profile_top and event.step == steps:
                profile = StepProfile(trainer.model, trainer.device, top=profile_top)
                profile.start()
        elif isinstance(event, events.RunStarted):
            out.speed_paths = dict(event.speed_paths)
            out.trainable_params = event.params_trainable
        elif isinstance(event, events.Notice):
            out.notices.append(event.message)
        elif isinstance(event, events.RunFailed):
            if profile is not None and profile.summary is None:  # the profiled step failed: take the profiler off
                profile.stop()
            raise RuntimeError(f"Hone's Trainer failed: {event.reason}\n{(event.details or '')[-3000:]}")
    out.times = [m.step_time for m in metrics]
    out.tokens = [m.tokens for m in metrics]
    out.losses = [m.loss for m in metrics]
    out.data_wait = [round(m.data_wait_s, 4) for m in metrics]
    out.first_grad_norm = metrics[0].grad_norm if metrics else None
    timed = metrics[warmup:]
    if timed:
        out.peak_allocated = max(m.mem_allocated for m in timed)
        out.peak_reserved = max(m.mem_reserved for m in timed)
    return out


def reference_steps(
    model_dir: Path, data: Path, family: str, *, steps: int, warmup: int, batch_tokens: int, lora_r: int
) -> RunSteps:
    """Plain transformers + peft: padded batches, the model's own loss, transformers' gradient checkpointing."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(
        model_dir, dtype=torch.bfloat16, **from_pretrained_options()
    ).cuda()
    batches = padded_batches(model_dir, data, family, model.config, batch_tokens=batch_tokens)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    peft_model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules=REFERENCE_TARGETS))
    attention = str(getattr(model.config, "_attn_implementation", None) or "transformers' default")
    out = RunSteps(
        speed_paths={
            "attention": attention,
            "loss": "the model's own (full logits)",
            "checkpoint": "transformers' gradient checkpointing",
            "batch": "padded",
        }
    )
    return padded_steps(peft_model, batches, out, steps=steps, warmup=warmup)


def _fill(result: RunResult, steps: RunSteps, warmup: int) -> None:
    """Copy a run's steps into its RunResult: tokens/s over the timed steps (real tokens / their summed time, as the
    batches differ in size), the median step, the first step's loss."""
    if len(steps.times) <= warmup:
        raise RuntimeError(f"{len(steps.times)} steps ran, {warmup} of them warm-up: nothing left to time")
    timed_times, timed_tokens = steps.times[warmup:], steps.tokens[warmup:]
    result.step_times_s = timed_times
    result.median_step_s = statistics.median(timed_times)
    result.tokens = round(sum(timed_tokens) / len(timed_tokens))
    result.tokens_per_s = sum(timed_tokens) / sum(timed_times)
    result.first_step_s = steps.times[0]
    result.first_loss, result.last_loss = steps.losses[0], steps.losses[-1]
    result.first_grad_norm = steps.first_grad_norm
    result.trainable_params = steps.trainable_params
    result.speed_paths = steps.speed_paths
    result.profile = steps.profile
    if steps.peak_allocated:
        result.peak_allocated_gib = steps.peak_allocated / GIB
        result.peak_reserved_gib = steps.peak_reserved / GIB


def _measure(
    name: str,
    kind: str,
    description: str,
    run: Callable[[], RunSteps],
    options: VisionOptions,
    report: VisionReport,
    device: str = "cuda",
) -> RunResult:
    """One run, its failure recorded rather than raised (as `measure.measure_run` does for text runs)."""
    result = RunResult(
        name=name,
        kind=kind,
        description=description,
        warmup_steps=options.warmup,
        steps=options.steps,
        memory_before_gib=allocated_gib(device),
    )
    try:
        steps = run()
        _fill(result, steps, options.warmup)
        report.losses[name] = [round(loss, 4) for loss in steps.losses]
        if steps.notices:
            report.notices[name] = steps.notices
        if steps.data_wait:
            report.data_wait[name] = steps.data_wait
    except Exception as e:
        record_failure(result, e, device)
        # the traceback's frames hold the failed step's tensors: drop them before the next run (see measure_run)
        traceback.clear_frames(e.__traceback__)
        e.__traceback__ = None
    free_memory(device)
    return result


def hone_runs(only: list[str] | None) -> list[str]:
    """The HONE_RUNS names `--only` picks (shell patterns allowed); "hone" alone without it."""
    if not only:
        return ["hone"]
    picked = [name for name in HONE_RUNS if any(fnmatch.fnmatchcase(name, pattern) for pattern in only)]
    unknown = [p for p in only if p != BASELINE and not any(fnmatch.fnmatchcase(n, p) for n in HONE_RUNS)]
    if unknown or not picked:
        raise ConfigError(
            f"--only {','.join(only)}: {', '.join(unknown) or 'no run'} is not a run of the vision scenarios",
            f"pick from {', '.join(HONE_RUNS)} (the reference always runs)",
        )
    return picked


def _check(options: VisionOptions, scenario: Scenario) -> None:
    if scenario.kind != "vision":
        raise ConfigError(
            f"{scenario.name} is a {scenario.kind} scenario, not a vision one",
            "run it with hone.core.bench.run.run_bench",
        )
    check_sizes(options.steps, options.warmup, options.lora_r, options.layers)
    hone_runs(options.only)
    if options.tokens is not None and options.tokens < 1:
        raise ConfigError(f"--tokens is {options.tokens}", f"give the tokens per batch, e.g. {scenario.tokens}")
    if options.tokenizer is not None and not Path(options.tokenizer).is_dir():
        raise ConfigError(
            f"--tokenizer {options.tokenizer} is not a folder",
            "give a folder holding SmolLM2's tokenizer, or leave --tokenizer out to read it from the bundled GGUF",
        )


def run_vision_bench(
    options: VisionOptions,
    *,
    on_result: Callable[[RunResult], None] | None = None,
    on_start: Callable[[str], None] | None = None,
) -> VisionReport:
    """Run the vision benchmark `options` describes: Hone's Trainer, then the transformers + peft reference, then
    the peer if asked (in a process of its own); `free_memory` between them, and each run's `memory_before_gib` shows
    what the one before left allocated.

    Args:
        options: the command's options.
        on_result: called with each RunResult as soon as it is measured (for progress output).
        on_start: called with each run's name (and the setup's) before it starts.

    Raises:
        ConfigError: not a vision scenario, a bad size, no CUDA GPU here, no tokenizer to build the model with.
    """
    from hone.core.bench.peer_unsloth_vision import unsloth_vision_steps

    started = time.perf_counter()
    scenario = get_scenario(options.scenario)
    _check(options, scenario)
    if not torch.cuda.is_available():
        raise ConfigError(
            f"the {scenario.name} benchmark needs a CUDA GPU and there is none here",
            "run it on a machine with one; the tiny-* scenarios run on a CPU",
        )
    tokenizer = Path(options.tokenizer) if options.tokenizer else None
    if tokenizer is None:
        from hone.core.resources import smollm2_gguf

        try:
            smollm2_gguf()
        except HoneError as e:
            raise ConfigError(e.message, f"{e.advice}, or give --tokenizer a folder with SmolLM2's tokenizer") from None
    layers = options.layers or scenario.layers
    batch_tokens = options.tokens or scenario.tokens
    report = VisionReport(
        options=options,
        scenario=scenario,
        device="cuda",
        dtype="bfloat16",
        environment=environment("cuda"),
        runs=[],
        batch={
            "tokens_per_batch": batch_tokens,
            "image_rows": IMAGE_ROWS,
            "text_rows": TEXT_ROWS,
            "image_side": IMAGE_SIDE,
            "layers": layers,
            "family": scenario.shape,
        },
    )
    steps = options.warmup + options.steps
    with tempfile.TemporaryDirectory(prefix="hone-vision-bench-") as folder:
        tmp = Path(folder)
        if on_start:
            on_start("generated rows and model")
        data = make_data(tmp)
        model_dir = model_folder(tmp, scenario.shape, layers, tokenizer)
        free_memory("cuda")
        runs = tuple(
            (
                name,
                "hone",
                description,
                lambda overrides=overrides: hone_steps(
                    model_dir,
                    data,
                    tmp / "runs",
                    steps=steps,
                    warmup=options.warmup,
                    batch_tokens=batch_tokens,
                    lora_r=options.lora_r,
                    overrides=overrides,
                    profile_top=options.profile_top,
                ),
            )
            for name, (description, overrides) in HONE_RUNS.items()
            if name in hone_runs(options.only)
        )
        runs += (
            (
                BASELINE,
                "reference",
                "transformers + peft: the same batches padded, the model's own loss, HF gradient checkpointing",
                lambda: reference_steps(
                    model_dir,
                    data,
                    scenario.shape,
                    steps=steps,
                    warmup=options.warmup,
                    batch_tokens=batch_tokens,
                    lora_r=options.lora_r,
                ),
            ),
        )
        if options.peer == PEER_NAME:
            runs += (
                (
                    PEER_NAME,
                    "peer",
                    "Unsloth's FastVisionModel: the reference's padded batches, its own "
                    "gradient checkpointing and loss",
                    lambda: unsloth_vision_steps(
                        model_dir,
                        data,
                        scenario.shape,
                        steps=steps,
                        warmup=options.warmup,
                        batch_tokens=batch_tokens,
                        lora_r=options.lora_r,
                    ),
                ),
            )
        for name, kind, description, run in runs:
            if on_start:
                on_start(name)
            result = _measure(name, kind, description, run, options, report)
            report.runs.append(result)
            if on_result:
                on_result(result)
    # The runs batch the same rows differently (packed vs padded), so their losses are no parity check.
    compare(report.runs, BASELINE, report.dtype, parity=False)
    report.elapsed_s = time.perf_counter() - started
    return report
