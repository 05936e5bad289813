"""Auto-fit of a whole run config, as the trainer applies it before the model loads; the memory override."""

from __future__ import annotations

from hone.core.config import RunConfig
from hone.core.memory.estimate import GIB
from hone.core.memory.run_plan import MEMORY_ENV, Memory, detect_memory, fit_run_config, parse_size


def qwen3_8b(batch_tokens=16384, max_length=2048) -> RunConfig:
    return RunConfig().with_overrides(
        ['model.name_or_path="dense-8b"', f"train.batch_tokens={batch_tokens}", f"data.max_length={max_length}"]
    )


def test_a_run_that_fits_is_kept_and_said_to_fit():
    config = qwen3_8b()
    run = fit_run_config(config, Memory(22 * GIB, "NVIDIA GeForce RTX 4090"))
    fitted, [notice] = run.config, run.notices
    assert 16 * GIB < run.predicted < 20 * GIB  # Qwen3-8B LoRA at a 16K batch: ≈ 17 GiB (the calibration table)
    assert fitted == config and notice.level == "info" and notice.message.endswith("it fits")


def test_with_memory_to_spare_the_mlps_are_not_tiled():
    """Whole MLPs are faster; a step that takes under half the free memory with them does not tile."""
    config = qwen3_8b().with_overrides(["speed.keep_layer_activations=0"])
    tiled = fit_run_config(config, Memory(32 * GIB, "NVIDIA GeForce RTX 5090"))
    run = fit_run_config(config, Memory(80 * GIB, "NVIDIA H100"))
    [notice] = run.notices
    assert config.speed.tiled_mlp and run.config == config.with_overrides(["speed.tiled_mlp=false"])
    assert tiled.predicted < run.predicted <= 40 * GIB  # the whole MLP's activations are in the prediction
    assert notice.level == "info" and "each MLP is back-propagated whole" in notice.message
    never = config.with_overrides(["speed.tiled_mlp=false"])  # false stays false, and is nothing to say
    assert fit_run_config(never, Memory(80 * GIB, "NVIDIA H100")).notices[0].message.endswith("it fits")


def test_with_memory_to_spare_the_last_layers_keep_their_activations():
    """speed.keep_layer_activations = auto: as many of the last layers as auto-fit's share of the free memory holds
    beside the step skip their recompute; the more memory, the more layers, never past the model's."""
    config = qwen3_8b()
    assert config.speed.keep_layer_activations == -1  # auto unless set
    runs = {size: fit_run_config(config, Memory(size * GIB, "a GPU")) for size in (32, 48, 80, 141)}
    kept = {size: run.config.speed.keep_layer_activations for size, run in runs.items()}
    assert 0 < kept[32] < kept[48] < kept[80] < kept[141] == 36
    for size, run in runs.items():
        assert run.predicted <= 0.85 * size * GIB
        which = "all 36" if kept[size] == 36 else f"the last {kept[size]} of 36"
        assert f"{which} layers keep their activations instead of running their forward again" in run.notices[0].message
    # Qwen3-8B at a 16K batch: each kept layer adds its whole activations, about 2.3 GiB
    assert 1.5 * GIB < (runs[80].predicted - runs[32].predicted) / (kept[80] - kept[32]) < 3 * GIB
    # a count given is kept as given; several processes keep every layer recomputed under auto
    assert (
        fit_run_config(
            config.with_overrides(["speed.keep_layer_activations=3"]), Memory(80 * GIB, "a GPU")
        ).config.speed.keep_layer_activations
        == 3
    )
    assert fit_run_config(config, Memory(80 * GIB, "a GPU"), processes=2).config.speed.keep_layer_activations == 0
    # on unified memory the system shares the pool: auto keeps layers within half of it, not auto-fit's share
    unified = fit_run_config(config, Memory(80 * GIB, "NVIDIA GB10", unified=True))
    assert 0 < unified.config.speed.keep_layer_activations < kept[80] and unified.predicted <= 0.5 * 80 * GIB


def test_kept_layers_that_do_not_fit_are_the_first_thing_given_up():
    """A count the user set that the GPU cannot hold: auto-fit recomputes every layer before any other lever."""
    config = qwen3_8b().with_overrides(["speed.keep_layer_activations=20"])
    run = fit_run_config(config, Memory(32 * GIB, "NVIDIA GeForce RTX 5090"))
    assert run.config.speed.keep_layer_activations == 0 and run.config.speed.checkpoint == config.speed.checkpoint
    assert "every layer recomputed" in run.notices[0].message


def test_a_run_too_big_gets_the_cheapest_changes_and_says_them():
    config = qwen3_8b().with_overrides(['speed.checkpoint="gpu"'])
    run = fit_run_config(config, Memory(22 * GIB, "NVIDIA GeForce RTX 4090"))
    fitted, [notice] = run.config, run.notices
    assert run.predicted <= 22 * GIB * 0.85 and notice.step == 0  # a changed plan is marked on the memory chart
    assert fitted.speed.checkpoint == "offload-double" and not fitted.lora.qlora
    assert notice.level == "warning" and "does not fit as set" in notice.message
    assert "train.fit_memory = false" in notice.message


def test_nothing_fits_starts_as_set_with_a_warning():
    config = qwen3_8b()
    run = fit_run_config(config, Memory(8 * GIB, "NVIDIA GeForce RTX 4060 Laptop GPU"))
    fitted, [notice] = run.config, run.notices
    assert fitted == config and "may not fit" in notice.message and "smaller micro-batches" in notice.message


def test_memory_override(monkeypatch):
    monkeypatch.setenv(MEMORY_ENV, "12GiB")
    memory = detect_memory()
    assert memory.available == 12 * GIB and MEMORY_ENV in memory.device
    assert parse_size("16384MiB") == 16 * GIB and parse_size("24 GB") == 24 * GIB


def test_the_gpu_is_named_once_with_its_free_memory(monkeypatch):
    """The fit line reads "… 139.2 GiB free on NVIDIA H200: it fits", not "… free on NVIDIA H200 (139.2 GiB free)"."""
    from types import SimpleNamespace

    from hone.core.machine import telemetry

    class OneGpu:
        has_gpu = True

        def sample(self):
            return SimpleNamespace(
                device="NVIDIA H200", memory_total=140 * GIB, memory_used=0.8 * GIB, memory_source=telemetry.GPU
            )

        def close(self):
            pass

    monkeypatch.delenv(MEMORY_ENV, raising=False)
    monkeypatch.setattr(telemetry, "Telemetry", OneGpu)
    memory = detect_memory()
    assert memory.device == "NVIDIA H200" and memory.available == 139.2 * GIB and memory.gpu
    [notice] = fit_run_config(qwen3_8b(), memory).notices
    assert "GiB; 139.2 GiB free on NVIDIA H200: it fits." in notice.message, notice.message


def test_a_grpo_run_s_plan_holds_sampling_s_kv_cache():
    """GRPO samples before it trains: the KV cache of every sequence of the micro-batch (keys and values of every
    layer: 144 KiB a token for Qwen3-8B in bf16) and one position's logits per sequence, with no checkpoints alive."""
    from hone.core.memory.run_plan import plan_run

    def plan(method: str, batch_tokens: int):
        config = qwen3_8b(batch_tokens=batch_tokens, max_length=1024).with_overrides(
            [f'train.method="{method}"', 'grpo.rewards=[{kind = "numeric", column = "answer"}]',
             "grpo.max_completion_length=512"]
        )  # fmt: skip
        return plan_run(config, None)

    sft, grpo = plan("sft", 65536), plan("grpo", 65536)
    kv = 65536 * 36 * 2 * 8 * 128 * 2
    logits = (65536 // 512) * 151936 * (2 + 4)
    assert grpo.settings.generation_completion == 512 and sft.settings.generation_completion == 0
    assert grpo.estimate.phase == "generation"
    checkpoints = grpo.estimate.part("checkpoints")
    assert grpo.estimate.part("step") == kv + logits - checkpoints
    assert grpo.estimate.peak_bytes > sft.estimate.peak_bytes
    assert "KV cache" in next(p.note for p in grpo.estimate.parts if p.name == "step")
    small = plan("grpo", 2048)  # a short micro-batch: training's own transient is the larger
    assert small.estimate.phase != "generation"
