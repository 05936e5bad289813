"""A Hone run: the same model, then the very code the trainer runs, with one variant's speed settings.

Setup follows `Trainer._run` step for step: `install_attention_and_experts`, seed, `apply_lora`,
`install_memory_and_kernels`, `build_optimizer` / `build_scheduler`, and a
`StepRunner`; each timed step is one `StepRunner.step` over the batch's rows as a `TokenizedSet` and one pack,
exactly what the trainer feeds it. QLoRA runs load the saved random-init folder through `load_model`, as the
trainer does.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from hone.core.bench.batch import TokenBatch
from hone.core.bench.measure import SkipRun, StepOutcome
from hone.core.bench.packed_masks import packed_sequences_cross
from hone.core.bench.scenarios import Scenario
from hone.core.bench.variants import Variant, speed_config
from hone.core.bench.weights import (
    active_params,
    adapted_names,
    architecture_facts,
    bench_model_info,
    build_bench_model,
)
from hone.core.config import DataConfig, LoraConfig, ModelConfig, RunConfig, TrainConfig
from hone.core.speed.graph_choice import settings_blocker
from hone.core.speed.paths import install_attention_and_experts, install_memory_and_kernels
from hone.core.train import distributed
from hone.core.train.distributed import SINGLE, World
from hone.core.train.lora import apply_lora
from hone.core.train.loss import describe as describe_loss
from hone.core.train.loss import loss_sum
from hone.core.train.optim import build_optimizer, build_scheduler
from hone.core.train.step import StepRunner
from hone.kernels.weight_casts import reuse_weight_casts

# The reference's learning rate and clipping (HF Trainer defaults), so both runs take the same optimizer step.
LEARNING_RATE = 2e-4
MAX_GRAD_NORM = 1.0


class _PadToken:
    """What StepRunner reads from a tokenizer: the pad id (used only by padded batches; these are packed)."""

    pad_token_id = 0


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _switched_off(path: str, choices: dict[str, str]) -> str | None:
    """The run's own words when it reports `path` off ("off: Hone's fused kernels need an NVIDIA GPU"), or None."""
    choice = choices.get(path, "")
    if not choice.startswith("off"):
        return None
    return choice.removeprefix("off").lstrip(" :") or "off"


def _path_reported(path: str, choices: dict[str, str], model) -> bool:
    """Whether the run shows `path` ("kernels" / "compile") switched on: a speed-path entry naming it that does not
    say "off", or the model itself carrying it (Hone's kernel patches; blocks compiled with `nn.Module.compile`)."""
    word = "kernel" if path == "kernels" else "compil"
    if any(word in key.lower() and not choice.startswith("off") for key, choice in choices.items()):
        return True
    if model is None:
        return False
    if path == "kernels":
        try:
            from hone.core.speed.fused.apply import kernels_applied
        except ImportError:
            return False
        return kernels_applied(model) is not None
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def not_wired(variant: Variant, choices: dict[str, str], model=None) -> str | None:
    """Why a single-path variant measures nothing new: its path did not show up in the run's setup."""
    settings = variant.overrides
    for path in variant.focus:
        if path in ("kernels", "compile") and settings.get(path) and not _path_reported(path, choices, model):
            off = _switched_off(path, choices)
            if off:
                return f"speed.{path} is off in this run: {off}"
            return f"speed.{path} is not wired into hone.core.speed in this build (the run shows no {path} path)"
        grouped = "groups" in choices.get("checkpoint", "")
        if path == "checkpoint" and settings.get("layer_group_tokens") and not grouped:
            return (
                f"speed.layer_group_tokens = {settings['layer_group_tokens']} is not in effect in this run "
                f"(it reports checkpoint: {choices.get('checkpoint', 'nothing')})"
            )
        if (
            path == "checkpoint"
            and str(settings.get("checkpoint", "")).startswith("offload")
            and "offload" not in choices.get("checkpoint", "")
        ):
            return (
                f"speed.checkpoint = {settings['checkpoint']} is not wired into hone.core.speed in this build "
                f"(the run reports checkpoint: {choices.get('checkpoint', 'nothing')})"
            )
    return None


def use_per_layer_metadata(model, setup) -> None:
    """Switch Hone's packed attention to its benchmark-only variant that rebuilds metadata in every layer."""
    from hone.core.speed import attention

    choice = setup.attention
    if choice is None or choice.name == "hf":
        current = attention.current_implementation(model)
        raise SkipRun(f"the run's attention is {current!r}, which has no per-layer-metadata variant")
    setup.attention = attention.use_per_layer_metadata(model, choice)
    setup.choices["attention"] = f"{setup.attention.name}: {setup.attention.reason}"


def bench_run_config(
    variant: Variant,
    batch_tokens: int,
    *,
    lora_r: int,
    dtype_name: str,
    qlora: bool = False,
    lora_experts: bool = True,
    model_folder=None,
) -> RunConfig:
    """The run config a Hone bench run trains with: one variant's speed settings on a given packed batch (also what
    the memory planner's prediction of the run starts from: core/bench/memory_prediction.py)."""
    model = ModelConfig(dtype=dtype_name)
    if model_folder is not None:
        model = ModelConfig(name_or_path=str(model_folder), dtype=dtype_name)
    tokens = max(batch_tokens, 16)
    return RunConfig(
        model=model,
        # the packed batch is given; its longest row is at most the batch (RunConfig checks max_length fits it)
        data=DataConfig(max_length=tokens),
        lora=LoraConfig(r=lora_r, alpha=2.0 * lora_r, qlora=qlora, experts=lora_experts),
        train=TrainConfig(
            lr=LEARNING_RATE,
            schedule="constant",
            warmup_steps=0,
            warmup_ratio=0.0,
            max_grad_norm=MAX_GRAD_NORM,
            batch_tokens=tokens,
            **variant.train,
        ),
        speed=speed_config(variant),
    )


def _usable_gpu_bytes(device: str) -> float | None:
    """What this process may still allocate on a CUDA `device`: its free memory, within a per-process cap
    (`hone bench --memory-cap`); None off CUDA."""
    if not str(device).startswith("cuda"):
        return None
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    cached = torch.cuda.memory_reserved(device) - allocated  # reserved by this process, reusable
    capped = torch.cuda.get_per_process_memory_fraction(torch.device(device).index) * total - allocated
    return float(max(0.0, min(free + cached, capped)))


class HoneRunner:
    """One Hone run of `variant`."""

    kind = "hone"

    def __init__(
        self,
        variant: Variant,
        scenario: Scenario,
        layers: int | None,
        batch: TokenBatch,
        *,
        lora_r: int,
        seed: int,
        dtype: torch.dtype,
        device: str,
        qlora: bool = False,
        model_folder=None,
        lora_experts: bool = True,
        world: World = SINGLE,
    ):
        self.name, self.variant, self.scenario, self.layers, self.batch = variant.name, variant, scenario, layers, batch
        self.lora_r, self.seed, self.dtype, self.device, self.qlora = lora_r, seed, dtype, device, qlora
        self.model_folder = model_folder
        self.lora_experts = lora_experts
        self.world = world  # several processes (hone bench --gpus N): gradients summed over them
        self.counts: tuple[int, int] | None = None  # the step's tokens and trained tokens over every process
        self.model = self.runner = self.setup_state = None
        self.spare: list[str] = []  # the config overrides all-spare took from the GPU's free memory
        self.active_params: int | None = None
        self.dataset = self.packs = None
        self.step_index = 0
        # The schedule is constant; this only has to exceed the steps a benchmark takes.
        self.total_steps = 1_000_000

    def run_config(self) -> RunConfig:
        return bench_run_config(
            self.variant,
            self.batch.tokens,
            lora_r=self.lora_r,
            dtype_name=_dtype_name(self.dtype),
            qlora=self.qlora,
            lora_experts=self.lora_experts,
            model_folder=self.model_folder,
        )

    def _load(self, config: RunConfig):
        if self.qlora:
            from hone.core.models.load import load_model

            loaded = load_model(config.model, device=self.device, qlora=True)
            return loaded.model, loaded.tokenizer, loaded.info
        model = build_bench_model(self.scenario, self.layers, seed=self.seed, dtype=self.dtype, device=self.device)
        return model, _PadToken(), bench_model_info(model, self.scenario)

    def setup(self) -> None:
        config = self.run_config()
        device = self.device
        available = _usable_gpu_bytes(device)  # before the model is built, as the Trainer's memory plan sees it
        model, tokenizer, info = self._load(config)
        config = self._spare(config, model, available)
        crossing = config.speed.attention == "hf" and packed_sequences_cross(model)
        if crossing:  # as the reference does for such a model (packed_masks): each sequence attends to itself alone
            config = dataclasses.replace(config, speed=dataclasses.replace(config.speed, attention="sdpa"))
        setup = install_attention_and_experts(model, config.speed, info, device)
        if crossing:
            setup.choices["attention"] += (
                " (speed.attention = hf asked: the model's own masks let packed sequences attend across, so the "
                "shared per-sequence block mask, as the reference's)"
            )
        if self.variant.per_layer_metadata:
            use_per_layer_metadata(model, setup)
        torch.manual_seed(self.seed)  # LoRA init must not depend on what loading consumed (as in Trainer._run)
        model, lora_report = apply_lora(model, config.lora, info)
        # Counted before the speed paths run: a vocabulary table moved to host memory is still computed with.
        facts = architecture_facts(self.scenario, self.layers)
        self.active_params = active_params(model, facts["experts"], facts["experts_per_token"])
        self.model, self.setup_state = model, setup
        mean_row_tokens = sum(self.batch.lengths) / len(self.batch.lengths)
        install_memory_and_kernels(
            model,
            config.speed,
            info,
            device,
            setup,
            mean_row_tokens=float(mean_row_tokens),
            graphs_blocker=settings_blocker(config, self.world.size),
        )
        setup.choices["lora"] = lora_report.summary()
        fused_loss = config.speed.kernels and str(device).startswith("cuda")
        setup.choices.setdefault("loss", describe_loss(model, config.speed.loss, fused=fused_loss))
        reason = not_wired(self.variant, setup.choices, model)
        if reason:
            raise SkipRun(reason)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, config.train, device)
        scheduler = build_scheduler(optimizer, config.train, self.total_steps)
        scaler = torch.amp.GradScaler("cuda") if self.dtype == torch.float16 else None
        self.runner = StepRunner(
            model, tokenizer, optimizer, scheduler, scaler, params, config, device, self.dtype, setup, world=self.world
        )
        self.dataset, self.packs = self.batch.tokenized_set(), self.batch.packs()
        if self.world.launched:  # each process its own batch: the loss is normalized by the tokens of them all
            mine = [float(self.dataset.lengths.sum()), float(self.dataset.trained_lengths.sum())]
            self.counts = tuple(int(v) for v in distributed.sum_values(mine, self.world))

    def step(self) -> StepOutcome:
        # The next step's batches are the same packs: collated on the trainer's background thread while this step
        # computes, as `Trainer` does for every step but the last.
        metrics = self.runner.step(
            self.dataset, self.packs, self.step_index, self.total_steps, next_packs=self.packs, counts=self.counts
        )
        self.step_index += 1
        # the step's peak as the trainer reports it: a replayed CUDA graph allocates nothing the allocator's peak
        # would see (StepRunner counts the peak its recorded pass reached)
        peak = metrics.get("mem_allocated")
        return StepOutcome(
            loss=metrics["loss"],
            grad_norm=metrics["grad_norm"],
            peak_bytes=peak,
            offload_bytes=metrics.get("offload_bytes"),
        )

    def forward_backward(self) -> None:
        """The micro-batch part of `StepRunner.step`: collate, copy to the device, loss, backward."""
        runner = self.runner
        batch = runner.collate([self.dataset[i] for i in self.packs[0]]).to(self.device)
        autocast = (
            torch.autocast("cuda", dtype=runner.autocast_dtype)
            if runner.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        if not self.model.training:
            self.model.train()
        with reuse_weight_casts():
            with autocast:
                summed = loss_sum(self.model, batch, mode=runner.config.speed.loss, fused=runner.config.speed.kernels)
            (summed / max(batch.num_trained, 1)).backward()
        runner.optimizer.zero_grad(set_to_none=True)

    def teardown(self) -> None:
        if self.runner is not None:
            self.runner.close()
        if self.variant.overrides.get("compile"):
            torch._dynamo.reset()  # compiled graphs hold on to this run's modules
        self.model = self.runner = self.setup_state = self.dataset = self.packs = None

    def _spare(self, config: RunConfig, model, available: float | None) -> RunConfig:
        """`speed.keep_layer_activations = auto` resolved as the Trainer's memory plan resolves it for this GPU's
        free memory (or --memory-cap): with whole MLPs and kept layers where memory is to spare, else none kept."""
        if config.speed.keep_layer_activations >= 0:
            return config
        spare = None
        if available is not None:
            from hone.core.memory.run_plan import spare_for_loaded_run

            mean_row = sum(self.batch.lengths) / len(self.batch.lengths)
            spare = spare_for_loaded_run(config, model.config, available, mean_row, self.scenario.shape)
        self.spare = spare.overrides() if spare else []
        return config.with_overrides(self.spare or ["speed.keep_layer_activations=0"])

    def describe(self) -> dict:
        params = self.runner.params
        paths = dict(self.setup_state.choices, adapted=", ".join(adapted_names(self.model)))
        offload = self.setup_state.offload
        return {
            "speed_paths": paths,
            "kept_layers": offload.kept_layers if offload is not None else 0,
            "spare": self.spare,
            "trainable_params": sum(p.numel() for p in params),
            "active_params": self.active_params,
        }
