"""Does a Hub model fit this machine? The memory planner's answer (hone.core.memory) for one search result, from
its config.json alone: one small download, no weights.

Asked for the model the user picks, not for every search result: each answer reads a config from the Hub and loads
transformers to parse it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hone.core.config import RunConfig
from hone.core.hub.connection import HubError, cache_dir, check_online, endpoint, hub_errors
from hone.core.hub.token import hub_token


@dataclass(frozen=True)
class FitVerdict:
    """The planner's answer in words.

    Attributes:
        fits: True when the run's settings fit as they are or after auto-fit's changes, False when nothing fits,
            None when it could not be told (then `text` says why).
        text: one line, e.g. "fits: a step needs ≈ 3.1 GiB of 22.0 GiB free on NVIDIA RTX 4090".
        peak_bytes: the predicted peak of a step as the run would train (after auto-fit), 0 when unknown.
    """

    fits: bool | None
    text: str
    peak_bytes: float = 0.0


def fits_this_machine(repo_id: str, config: RunConfig, memory=None, revision: str = "") -> FitVerdict:
    """Whether training `repo_id` with `config`'s settings fits the memory here.

    Args:
        repo_id: the Hub model.
        config: the run's settings (batch, LoRA, QLoRA, speed paths); its model is replaced by `repo_id`.
        memory: a hone.core.memory.run_plan.Memory to plan against; None reads the first GPU's free memory (the
            system's on a computer without an NVIDIA GPU).
        revision: the model's branch, tag or commit ("" for main).
    """
    from hone.core.memory.estimate import GIB
    from hone.core.memory.run_plan import detect_memory, detect_system_memory, plan_run

    try:
        folder = _config_folder(repo_id, revision)
    except HubError as e:
        return FitVerdict(None, f"not known: its config cannot be read ({e.message})")
    model = dataclasses.replace(config.model, name_or_path=folder, gguf_file="", revision="")
    planned = dataclasses.replace(config, model=model)
    memory = memory or detect_memory() or detect_system_memory()
    try:
        plan = plan_run(planned, memory, allow_qlora=True)
    except Exception as e:  # a model type this transformers does not know, a config the planner cannot read
        return FitVerdict(None, f"not known: the memory planner cannot read its config ({type(e).__name__})")
    fit = plan.fit
    where = (
        f"{memory.available / GIB:.1f} GiB free on {memory.device}"
        if memory.gpu
        else f"{memory.available / GIB:.1f} GiB of system memory (no NVIDIA GPU)"
    )
    if fit.fits and not fit.changes:
        return FitVerdict(
            True, f"fits: a step needs ≈ {plan.estimate.peak_gib:.1f} GiB of {where}", plan.estimate.peak_bytes
        )
    if fit.fits:
        return FitVerdict(
            True,
            f"fits with {'; '.join(fit.changes)}: ≈ {fit.estimate.peak_gib:.1f} GiB of {where}",
            fit.estimate.peak_bytes,
        )
    return FitVerdict(False, f"does not fit {where}: {fit.reason}", fit.estimate.peak_bytes)


def _config_folder(repo_id: str, revision: str) -> str:
    """The cached folder holding `repo_id`'s config.json (downloaded once)."""
    from pathlib import Path

    from huggingface_hub import hf_hub_download

    check_online()
    token, _ = hub_token()
    with hub_errors(repo_id, revision, with_token=bool(token)):
        path = hf_hub_download(
            repo_id,
            "config.json",
            revision=revision or None,
            endpoint=endpoint(),
            cache_dir=cache_dir(),
            token=token or False,
        )
    return str(Path(path).parent)
