"""The memory plan of a run: its model's shape (config only), its settings, the memory it can use, and auto-fit.

What `hone plan` prints and the Train page shows before Start.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from hone.core.config import PREFERENCE_METHODS, RunConfig
from hone.core.control import env_error, env_text
from hone.core.errors import ConfigError
from hone.core.memory.estimate import GIB, MemoryEstimate, MemorySettings, estimate_peak
from hone.core.memory.fit import FitResult, auto_fit, usable
from hone.core.memory.shape import ModelShape, load_model_config

# Plan for this much GPU memory instead of the free memory NVML reports (a GPU shared with other work, or a
# smaller card emulated with torch.cuda.set_per_process_memory_fraction).
MEMORY_ENV = "HONE_GPU_MEMORY"
# Tiles of the MLP's backward save one layer's (tokens x intermediate) activations and gradients but cost time: on an
# H200, Qwen2.5-VL-3B at 8K tokens trained 14-24 % faster with whole MLPs, at the same peak memory. So a run whose
# step, with whole MLPs, still takes at most this share of the free memory does not tile them.
WHOLE_MLP_SHARE = 0.5


@dataclass(frozen=True)
class Memory:
    """Memory a run can use: `available` bytes on `device` ("NVIDIA H200", "8 GiB as given"), `unified` when
    the GPU allocates from system memory (DGX Spark), `gpu` False when there is no NVIDIA GPU at all. `host`: the
    system memory offloaded parts may take (None: read from this computer when planning a GPU run)."""

    available: float
    device: str
    unified: bool = False
    gpu: bool = True
    host: float | None = None


@dataclass(frozen=True)
class SpareUse:
    """What a run that fits as set does with the memory left over (`spare_use`): whole MLPs instead of tiles, and
    the last `kept_layers` of `layers` keeping their activations instead of being recomputed; `estimate` is the
    step's peak with both."""

    estimate: MemoryEstimate
    whole_mlp: bool
    kept_layers: int
    layers: int

    def overrides(self) -> list[str]:
        """The run-config assignments that apply it."""
        return (["speed.tiled_mlp=false"] if self.whole_mlp else []) + (
            [f"speed.keep_layer_activations={self.kept_layers}"] if self.kept_layers else []
        )

    def words(self) -> str:
        """What it changes, as clauses of a sentence."""
        said = ["each MLP is back-propagated whole, not in tiles"] if self.whole_mlp else []
        if self.kept_layers:
            which = "all" if self.kept_layers >= self.layers else f"the last {self.kept_layers} of"
            said.append(f"{which} {self.layers} layers keep their activations instead of running their forward again")
        return " and ".join(said)


@dataclass(frozen=True)
class RunPlan:
    """The plan: `estimate` for the run's own `settings`; `fit` against `memory` when given; `spare`, when the run
    fits as set with memory to spare, what the run then does with it (faster paths that take memory) and its
    estimate."""

    shape: ModelShape
    settings: MemorySettings
    estimate: MemoryEstimate
    memory: Memory | None
    fit: FitResult | None
    mean_row_tokens: float
    spare: SpareUse | None = None


def parse_size(text: str) -> float:
    """ "8GiB", "12 GB", "24g", "16384MiB" -> bytes (GB and G are read as GiB, as GPU makers' labels mean)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b?)\s*", text.lower())
    if not found or float(found.group(1)) <= 0:
        raise ConfigError(f"cannot read the memory size {text!r}", "write it like 8GiB, 24GB or 16384MiB")
    scale = {"": GIB, "k": 1024, "m": 1024**2, "g": GIB, "t": 1024**4}[found.group(2)]
    return float(found.group(1)) * scale


def detect_memory() -> Memory | None:
    """Free memory of the first visible NVIDIA GPU (system memory on unified-memory GPUs); None without a GPU."""
    from hone.core.machine.telemetry import GPU, UNIFIED, Telemetry

    given = env_text(MEMORY_ENV)
    if given is not None:
        try:
            limit = parse_size(given)
        except ConfigError:
            raise env_error(MEMORY_ENV, given, "a memory size like 8GiB, 24GB or 16384MiB") from None
        return Memory(limit, f"the GPU ({MEMORY_ENV}={given})")
    telemetry = Telemetry()
    try:
        if not telemetry.has_gpu:
            return None
        sample = telemetry.sample()
        free = sample.memory_total - sample.memory_used
        return Memory(
            float(free),
            sample.device,  # every message about it says how much is free
            unified=sample.memory_source == UNIFIED,
            gpu=sample.memory_source in (GPU, UNIFIED),
        )
    finally:
        telemetry.close()


def detect_system_memory() -> Memory:
    """System memory available now, for a run on the CPU (what the kernel could hand out without swapping)."""
    from hone.core.machine.telemetry import system_memory

    used, total = system_memory()
    available = float(total - used)
    return Memory(available, "this computer (system memory)", gpu=False)


def resolve_checkpoint(
    requested: str, mean_row_tokens: float, hf_config, *, cuda: bool, integrated: bool = False
) -> str:
    """The checkpoint mode `auto` (or the user) picks, as the trainer would (speed.checkpointing.policy)."""
    from hone.core.speed.checkpointing.policy import choose_mode

    return choose_mode(requested, "cuda" if cuda else "cpu", mean_row_tokens, hf_config, integrated=integrated).mode


def settings_from_config(
    config: RunConfig, hf_config, *, cuda: bool = True, unified: bool = False, mean_row_tokens: float | None = None
) -> tuple[MemorySettings, float]:
    """The planner's settings for a run config, with `auto` resolved the way the trainer resolves it; and the mean
    row length assumed (half of data.max_length unless given: the planner reads no data)."""
    speed, train = config.speed, config.train
    mean_row = mean_row_tokens or max(min(config.data.max_length, train.batch_tokens) / 2, 1)
    dtype = config.model.dtype
    weight_bytes = 4 if dtype == "float32" or (dtype == "auto" and not cuda) else 2
    checkpoint = resolve_checkpoint(speed.checkpoint, mean_row, hf_config, cuda=cuda, integrated=unified)
    # as the trainer does (hone.core.speed.paths): auto keeps the layer inputs on the GPU where that lets the steps
    # be recorded as CUDA graphs, and recorded steps read the vocabulary tables on the GPU
    if cuda and speed.checkpoint == "auto" and checkpoint.startswith("offload"):
        checkpoint = "gpu" if _graphs_planned(config, hf_config, "gpu") else checkpoint
    graphs = cuda and _graphs_planned(config, hf_config, checkpoint)
    tables_on_host = cuda and not graphs
    return MemorySettings(
        batch_tokens=train.batch_tokens,
        lora_rank=config.lora.r,
        lora_experts=config.lora.experts,
        qlora=config.lora.qlora,
        optimizer=train.optimizer,
        weight_bytes=weight_bytes,
        checkpoint=checkpoint,
        host_embeddings=speed.host_embeddings and tables_on_host,
        host_lm_head=speed.host_lm_head and tables_on_host,
        cuda_graphs=graphs,
        tiled_mlp=speed.tiled_mlp and speed.kernels and cuda,
        projection_recompute=not speed.compile,
        chunked_loss=speed.loss == "chunked",
        kernels=speed.kernels and cuda,
        cpu=not cuda,
        generation_completion=config.grpo.max_completion_length if train.method == "grpo" else 0,
        kept_layers=max(0, speed.keep_layer_activations),  # auto (-1) is resolved against memory: `spare_use`
    ), mean_row


def _graphs_planned(config: RunConfig, hf_config, checkpoint: str) -> bool:
    """Whether the trainer would record this run's steps as CUDA graphs on a GPU (speed.cuda_graphs)."""
    from hone.core.speed.graph_choice import model_choice, settings_blocker

    shape = ModelShape.from_config(hf_config)
    on, _ = model_choice(
        config.speed.cuda_graphs,
        "cuda",
        params=shape.linear_params + shape.table_params,
        is_moe=bool(shape.experts),
        is_vision=getattr(hf_config, "vision_config", None) is not None,
        cfg=dataclasses.replace(config.speed, checkpoint=checkpoint),
    )
    return on and settings_blocker(config) is None


def plan_run(config: RunConfig, memory: Memory | None, *, allow_qlora: bool = False) -> RunPlan:
    """Predict the run's peak, and fit it into `memory` when given."""
    model = config.model
    from hone.core.models.load import custom_code_errors

    with custom_code_errors(model.name_or_path):
        hf_config = load_model_config(model.name_or_path, model.gguf_file, model.revision, model.trust_remote_code)
    shape = ModelShape.from_config(hf_config, model.name_or_path)
    cuda = memory is not None and memory.gpu
    settings, mean_row = settings_from_config(
        config, hf_config, cuda=cuda or memory is None, unified=bool(memory and memory.unified)
    )
    estimate = estimate_peak(shape, settings)
    fit = spare = None
    if memory is not None:
        fit = auto_fit(
            shape,
            settings,
            memory.available,
            longest_unit(config),
            allow_qlora=allow_qlora,
            unified=memory.unified,
            host_available=_host_memory(memory),
        )
        if fit.fits and not fit.changes:  # fit.settings: with the inputs the host cannot hold counted on the GPU
            spare = spare_use(shape, fit.settings, memory, auto_kept=config.speed.keep_layer_activations < 0)
    return RunPlan(shape, settings, estimate, memory, fit, mean_row, spare)


def longest_unit(config: RunConfig) -> int:
    """The most tokens that must share one micro-batch: the longest row, or for a preference run a pair of them."""
    return config.data.max_length * (2 if config.train.method in PREFERENCE_METHODS else 1)


def _host_memory(memory: Memory) -> float | None:
    """System memory a GPU run may offload into (None where nothing is offloaded: a CPU run, unified memory)."""
    if not memory.gpu or memory.unified:
        return None
    return memory.host if memory.host is not None else detect_system_memory().available


def spare_use(shape: ModelShape, settings: MemorySettings, memory: Memory, *, auto_kept: bool) -> SpareUse | None:
    """What a run that fits as set does with the memory left: whole (untiled) MLPs when that step takes at most
    WHOLE_MLP_SHARE of the free memory; then, with `auto_kept` (speed.keep_layer_activations = auto) on a GPU, as
    many of the last layers keep their activations as auto-fit's share of the free memory holds beside the step
    (WHOLE_MLP_SHARE of unified memory). None when neither applies."""
    current = settings
    whole = settings.tiled_mlp and not shape.experts  # MoE layers are not tiled (estimate.py)
    if whole:
        untiled = dataclasses.replace(settings, tiled_mlp=False)
        whole = estimate_peak(shape, untiled).peak_bytes <= WHOLE_MLP_SHARE * memory.available
        current = untiled if whole else current
    kept = 0
    if auto_kept and memory.gpu and not settings.cpu and settings.checkpoint != "off":
        # unified memory is the system's too: what the run keeps there, the desktop and the data loader cannot use
        budget = WHOLE_MLP_SHARE * memory.available if memory.unified else usable(memory.available)
        kept = kept_layers_fitting(shape, current, budget)
        current = dataclasses.replace(current, kept_layers=kept)
    if not whole and not kept:
        return None
    return SpareUse(estimate_peak(shape, current), whole, kept, shape.layers)


def spare_for_loaded_run(
    config: RunConfig, hf_config, available_bytes: float, mean_row_tokens: float, name: str = ""
) -> SpareUse | None:
    """`spare_use` for a GPU run whose model is already built (a benchmark's): its settings as `config` sets them,
    `available_bytes` what the process could use before the model was built. None when the step does not fit as
    set or there is nothing to spare."""
    shape = ModelShape.from_config(hf_config, name)
    settings, _ = settings_from_config(config, hf_config, cuda=True, mean_row_tokens=mean_row_tokens)
    if estimate_peak(shape, settings).peak_bytes > usable(available_bytes):
        return None
    memory = Memory(available_bytes, "this GPU")
    return spare_use(shape, settings, memory, auto_kept=config.speed.keep_layer_activations < 0)


def kept_layers_fitting(shape: ModelShape, settings: MemorySettings, budget: float) -> int:
    """The most layers that may keep their activations with the step's peak still within `budget` bytes."""
    kept = 0
    for count in range(1, shape.layers + 1):  # the peak grows with every layer kept
        if estimate_peak(shape, dataclasses.replace(settings, kept_layers=count)).peak_bytes > budget:
            break
        kept = count
    return kept


@dataclass(frozen=True)
class FittedRun:
    """What auto-fit makes of a run: the config to train with, Notice events saying what was predicted and changed,
    and the predicted peak of a step of that config in bytes."""

    config: RunConfig
    notices: list
    predicted: float
    fits: bool = True  # whether a step is predicted to fit (with the whole model on the device)


def fit_run_config(config: RunConfig, memory: Memory, *, processes: int = 1) -> FittedRun:
    """The run config auto-fit makes of `config` for `memory` (the same when it fits, or with what the memory to
    spare allows: `spare_use`). QLoRA is never switched on here: it changes what is trained. Several `processes`
    (one per GPU) keep every layer recomputed under `speed.keep_layer_activations = auto`: untested sharded."""
    from hone.core.events import Notice

    if processes > 1 and config.speed.keep_layer_activations < 0:
        config = config.with_overrides(["speed.keep_layer_activations=0"])
    plan = plan_run(config, memory)
    fit, available = plan.fit, memory.available / GIB
    assert fit is not None  # plan_run fits whenever it is given memory
    said = f"a step needs ≈ {plan.estimate.peak_gib:.1f} GiB; {available:.1f} GiB free on {memory.device}"
    if fit.fits and not fit.changes:
        spare = plan.spare
        if spare is not None:
            message = f"{said}: it fits. With the memory to spare {spare.words()} (faster)"
            message += f": ≈ {spare.estimate.peak_gib:.1f} GiB"
            return FittedRun(
                config.with_overrides(spare.overrides()),
                [Notice(topic="memory", message=message)],
                spare.estimate.peak_bytes,
            )
        if fit.notes:  # inputs the host cannot hold stay on the GPU, which the plan's own estimate leaves out
            said = f"a step needs ≈ {fit.estimate.peak_gib:.1f} GiB; {available:.1f} GiB free on {memory.device}"
            said += "".join(f" ({note})" for note in fit.notes)
        return FittedRun(config, [Notice(topic="memory", message=f"{said}: it fits")], fit.estimate.peak_bytes)
    if fit.fits:
        fitted = config.with_overrides(fit.assignments(plan.settings))
        return FittedRun(
            fitted,
            [
                Notice(
                    topic="memory",
                    level="warning",
                    step=0,
                    message=(
                        f"{said}: it does not fit as set, so the run uses "
                        + "; ".join(fit.changes)
                        + f" (≈ {fit.estimate.peak_gib:.1f} GiB; "
                        "train.fit_memory = false keeps the settings as they are)"
                    ),
                )
            ],
            fit.estimate.peak_bytes,
        )
    return FittedRun(
        config,
        [
            Notice(
                topic="memory",
                level="warning",
                message=(
                    f"{said}: it may not fit ({fit.reason}). The run starts as set; a step that runs out of memory "
                    "is run "
                    "again on smaller micro-batches"
                ),
            )
        ],
        plan.estimate.peak_bytes,
        fits=False,
    )
