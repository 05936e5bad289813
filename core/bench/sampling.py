"""GRPO's generation speed: Hone's static-cache sampler against `transformers`' `generate`, in one process.

`hone bench grpo-0.6b` (and `grpo-8b`, `tiny-grpo` on a CPU) builds the scenario's random-init model in bf16 with
a peft LoRA on every linear layer (its B drawn non-zero, so the adapter changes every answer), then samples the same
batch of prompts × answers, as one GRPO step does: `generate` (sampling with temperature 1 and top-p 1, its default
dynamic cache) on the plain peft model; on a GPU, Hone's sampler with the decode step captured as a CUDA graph on that
same peft model (`hone-peft`: what the static cache and the graph alone give); then, with Hone's fused kernels applied
to the model and the trainer's cast cache around each call as a GRPO run samples, Hone's sampler decoding step by step
(`hone-eager`: the decode step launched from Python) and captured (`hone`, a GPU only). The end-of-text token is
one a random model almost never draws, so every run decodes the full answer length; tokens/s counts the answer
tokens decoded (rows × positions) over the timed calls, after `warmup` untimed ones.

Then (`whole_steps`) the whole GRPO step follows (`grpo_steps`): TRL's GRPOTrainer without vLLM, then Hone's
Trainer, on the same model folder, prompts, group, answer length and reward; with `peer="unsloth"`, Unsloth's GRPO
on TRL's setup last, in a child process (`peer_unsloth_trl`).
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from hone.core.bench.grpo_steps import REWARD_SOURCE, StepRun, hone_grpo_steps, trl_grpo_steps, write_prompts
from hone.core.bench.measure import free_memory
from hone.core.bench.peer_unsloth import PEER_NAME
from hone.core.bench.peer_unsloth_trl import unsloth_grpo_steps
from hone.core.bench.report import environment
from hone.core.bench.scenarios import get_scenario
from hone.core.bench.weights import build_bench_model
from hone.core.errors import ConfigError
from hone.core.speed.fused.apply import apply_kernels
from hone.core.speed.static_sampling import StaticSampler
from hone.kernels.weight_casts import reuse_weight_casts

BASELINE = "generate"
PROMPTS = 8  # prompts per call, each sampled GROUP times: 64 rows, TRL's default group of a step
GROUP = 8


@dataclass
class SamplingRun:
    name: str
    description: str
    seconds: list[float] = field(default_factory=list)
    tokens: int = 0  # answer tokens decoded per call
    peak_gib: float | None = None
    note: str = ""
    error: str = ""
    profile: dict | None = None  # --profile: one more call under torch.profiler (`profile_tables` prints it)

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / statistics.median(self.seconds) if self.seconds and not self.error else None


@dataclass
class SamplingReport:
    scenario: str
    device: str
    dtype: str
    batch: dict
    environment: dict
    runs: list[SamplingRun] = field(default_factory=list)
    steps: list[StepRun] = field(default_factory=list)  # the whole GRPO step: TRL's, Hone's, then the peer's
    warmup: int = 0

    def step_ratio(self, against: str = "trl") -> float | None:
        """The median step time of the run named `against` (TRL's, or the peer's) over Hone's: how many times faster
        Hone's whole step is."""
        times = {r.name: r.median(self.warmup) for r in self.steps}
        if times.get(against) and times.get("hone"):
            return times[against] / times["hone"]
        return None

    def ratio(self, run: SamplingRun) -> float | None:
        base = next((r for r in self.runs if r.name == BASELINE), None)
        if base is None or base.tokens_per_s is None or run.tokens_per_s is None:
            return None
        return run.tokens_per_s / base.tokens_per_s

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario,
            "device": self.device,
            "dtype": self.dtype,
            "batch": self.batch,
            "environment": self.environment,
            "baseline": BASELINE,
            "runs": [
                {
                    "name": r.name,
                    "description": r.description,
                    "seconds": r.seconds,
                    "tokens_per_call": r.tokens,
                    "tokens_per_s": r.tokens_per_s,
                    "speed_ratio": self.ratio(r),
                    "peak_gib": r.peak_gib,
                    "note": r.note,
                    "error": r.error,
                    "profile": r.profile,
                }
                for r in self.runs
            ],
            "steps": [
                {
                    "name": r.name,
                    "description": r.description,
                    "seconds": r.times,
                    "median_s": r.median(self.warmup),
                    "peak_gib": r.peak_gib,
                    "trainable": r.trainable,
                    "error": r.error,
                    "details": r.details,
                }
                for r in self.steps
            ],
            "step_speed_ratio": self.step_ratio(),
            "peer_step_speed_ratio": self.step_ratio(PEER_NAME),
        }


def make_prompts(count: int, low: int, high: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of random token ids, lengths log-uniform in [low, high] (chat prompts' shape)."""
    rng = random.Random(seed)
    lengths = [round(math.exp(rng.uniform(math.log(low), math.log(high)))) for _ in range(count)]
    return [[rng.randrange(1, vocab - 1) for _ in range(n)] for n in lengths]


def _left_pad(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _with_adapter(model, lora_r: int):
    """peft LoRA on every linear layer, B drawn small and non-zero: the adapter takes part in every token."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, target_modules="all-linear")
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_((torch.randn(param.shape, generator=generator) * 0.01).to(param.dtype))
    return model.eval()


def run_sampling_bench(
    scenario_name: str,
    *,
    steps: int = 3,
    warmup: int = 1,
    layers: int | None = None,
    lora_r: int = 16,
    completion: int | None = None,
    whole_steps: bool = True,
    tokenizer: str | None = None,
    profile_top: int = 0,
    peer: str | None = None,
    on_result=None,
) -> SamplingReport:
    """Time the samplers on one batch, then (`whole_steps`) the whole step against TRL's (and the peer's: "unsloth");
    `completion` None = the scenario's answer length, `tokenizer` a folder (None: the bundled SmolLM2's),
    `profile_top` > 0: each sampler runs one more call under torch.profiler, this many rows per table."""
    scenario = get_scenario(scenario_name)
    if scenario.kind != "sampling":
        raise ConfigError(f"{scenario.name} is a {scenario.kind} scenario, not a sampling one", "")
    cuda = torch.cuda.is_available()
    if not cuda and not scenario.is_tiny:
        raise ConfigError(
            f"the {scenario.name} benchmark needs a CUDA GPU and there is none here", "tiny-grpo runs on a CPU"
        )
    if steps < 1 or warmup < 0:
        raise ConfigError(f"--steps {steps}, --warmup {warmup}", "give at least one timed call")
    if peer is not None and not whole_steps:
        raise ConfigError(f"--peer {peer} trains whole GRPO steps", "leave the whole steps on to compare with it")
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    answer = completion or scenario.tokens
    model = _with_adapter(build_bench_model(scenario, layers, seed=0, dtype=dtype, device=device), lora_r)
    vocab = model.config.vocab_size
    prompts = [p for p in make_prompts(PROMPTS, scenario.min_len, scenario.max_len, vocab) for _ in range(GROUP)]
    ids, mask = _left_pad(prompts, device)
    eos = vocab - 1  # never in a prompt; a random model draws it about once in `vocab` tokens
    report = SamplingReport(
        scenario=scenario.name,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        batch={
            "prompts": PROMPTS,
            "group": GROUP,
            "rows": len(prompts),
            "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
            "completion_tokens": answer,
            "layers": layers or scenario.layers,
            "shape": scenario.shape,
            "lora_r": lora_r,
        },
        environment=environment(device),
        warmup=warmup,
    )

    def generate() -> torch.Tensor:
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=answer,
            pad_token_id=0,
            eos_token_id=eos,
        )
        return out[:, ids.shape[1] :]

    def static(capture: bool, fused: bool):
        sampler = StaticSampler(capture=capture)

        def run() -> torch.Tensor:
            with reuse_weight_casts() if fused else contextlib.nullcontext():  # as the trainer's step samples
                return sampler.sample(
                    model, ids, mask, max_new_tokens=answer, temperature=1.0, top_p=1.0, pad_id=0, eos_ids=[eos]
                )

        return sampler, run

    plain = [(SamplingRun(BASELINE, "transformers' generate with the peft adapter, dynamic cache"), generate, None)]
    if cuda:
        peft_sampler, peft_captured = static(True, fused=False)
        plain.append(
            (
                SamplingRun("hone-peft", "Hone's static KV cache and CUDA graph, peft's own LoRA layers"),
                peft_captured,
                peft_sampler,
            )
        )
    fused = []
    eager_sampler, eager = static(False, fused=True)
    fused.append(
        (
            SamplingRun("hone-eager", "Hone's static KV cache and fused kernels, decode step from Python"),
            eager,
            eager_sampler,
        )
    )
    if cuda:
        captured_sampler, captured = static(True, fused=True)
        fused.append(
            (
                SamplingRun("hone", "Hone's static KV cache and fused kernels, decode step as one CUDA graph"),
                captured,
                captured_sampler,
            )
        )
    _time_runs(report, plain, steps, warmup, cuda, profile_top, model, device, on_result)
    report.batch["kernels"] = apply_kernels(model).summary()  # what a GRPO run's model samples with
    _time_runs(report, fused, steps, warmup, cuda, profile_top, model, device, on_result)
    if whole_steps:
        del model, plain, fused
        free_memory(device)
        _whole_steps(report, scenario, layers, lora_r, answer, steps, warmup, tokenizer, peer, on_result)
    return report


def _whole_steps(report, scenario, layers, lora_r, answer, steps, warmup, tokenizer, peer, on_result) -> None:
    import tempfile
    from pathlib import Path

    from hone.core.bench.preference import _load_tokenizer, _model_folder
    from hone.core.bench.vision import WORDS

    with tempfile.TemporaryDirectory(prefix="hone-grpo-bench-") as folder:
        tmp = Path(folder)
        tok = _load_tokenizer(tmp, tokenizer)
        prompt_words = (scenario.min_len + scenario.max_len) // 2
        total = PROMPTS * (warmup + steps) * 2  # no prompt is seen twice in the steps timed
        prompts, rows = write_prompts(tmp, tok, WORDS, total, prompt_words)
        text = tok.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=False)
        rendered = len(tok(text, add_special_tokens=False)["input_ids"])  # every prompt renders to this length
        batch_tokens = PROMPTS * GROUP * (rendered + answer)
        report.batch["whole_step"] = {"prompt_tokens": rendered, "batch_tokens": batch_tokens, "reward": "vowels"}
        reward_file = tmp / "rewards.py"
        reward_file.write_text(REWARD_SOURCE, encoding="utf-8")
        cuda = torch.cuda.is_available()
        model_dir = _model_folder(
            tmp, scenario, layers, torch.bfloat16 if cuda else torch.float32, "cuda" if cuda else "cpu", tok
        )
        sizes = dict(steps=warmup + steps, warmup=warmup, group=GROUP, completion=answer, lora_r=lora_r)
        runs = [
            ("trl", lambda: trl_grpo_steps(model_dir, rows, tmp / "trl", prompts_per_step=PROMPTS, **sizes)),
            (
                "hone",
                lambda: hone_grpo_steps(
                    model_dir, prompts, reward_file, tmp / "runs", batch_tokens=batch_tokens, **sizes
                ),
            ),
        ]
        if peer == PEER_NAME:
            runs.append(
                (
                    PEER_NAME,
                    lambda: unsloth_grpo_steps(
                        model_dir,
                        rows,
                        tmp / PEER_NAME,
                        max_seq_length=rendered + answer,
                        prompts_per_step=PROMPTS,
                        **sizes,
                    ),
                )
            )
        for name, call in runs:
            try:
                run = call()
            except Exception as e:  # an out-of-memory or a trainer's own failure: recorded, the next run goes on
                said = str(e).splitlines() or [""]
                run = StepRun(name, "", error=f"{type(e).__name__}: {said[0][:200]}", details="\n".join(said[1:]))
            free_memory("cuda" if cuda else "cpu")
            report.steps.append(run)
            if on_result:
                on_result(run, None)


def _time_runs(report, runs, steps, warmup, cuda, profile_top, model, device, on_result) -> None:
    for result, call, sampler in runs:
        _time(result, call, steps=steps, warmup=warmup, cuda=cuda)
        if sampler is not None and sampler.capture_problem:
            result.note = f"not captured: {sampler.capture_problem}"
        if profile_top and not result.error:
            result.profile = _profile(call, model, device, profile_top)
        report.runs.append(result)
        if on_result:
            on_result(result, report.ratio(result))


def _profile(call, model, device: str, top: int) -> dict:
    """One more sampling call under torch.profiler, summarized as `--profile` prints it."""
    from hone.core.bench.diagnostics.profile import StepProfile

    profile = StepProfile(model, device, top=top)
    profile.start()
    failed = None
    try:
        with torch.no_grad():
            call()
    except Exception as e:  # a profile that fails says so; the timings already stand
        failed = f"{type(e).__name__}: {e}"
    finally:
        profile.stop()
    return {"error": failed} if failed else profile.summary


def _time(result: SamplingRun, call, *, steps: int, warmup: int, cuda: bool) -> None:
    torch.manual_seed(0)
    try:
        for i in range(warmup + steps):
            if cuda:
                torch.cuda.synchronize()
                if i == warmup:
                    torch.cuda.reset_peak_memory_stats()
            began = time.perf_counter()
            with torch.no_grad():
                out = call()
            if cuda:
                torch.cuda.synchronize()
            if i >= warmup:
                result.seconds.append(time.perf_counter() - began)
                result.tokens = int(out.shape[0] * out.shape[1])
        if cuda:
            result.peak_gib = torch.cuda.max_memory_allocated() / 2**30
    except torch.OutOfMemoryError as e:
        result.error = f"out of memory: {str(e).splitlines()[0][:160]}"
    finally:
        if cuda:
            torch.cuda.empty_cache()
