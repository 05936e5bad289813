"""LoRA adapters through peft: rank, alpha, dropout, targets (all linear layers of the decoder by default), rsLoRA,
per-expert LoRA on MoE experts (peft `target_parameters`), and the trainable / total parameter report."""

from __future__ import annotations

from dataclasses import dataclass, field

from hone.core.config import LoraConfig
from hone.core.errors import ConfigError
from hone.core.model_info import ModelInfo


@dataclass(frozen=True)
class LoraReport:
    trainable: int
    total: int
    targets: list[str]  # module names adapted (suffixes), e.g. ["q_proj", "k_proj", ...]
    target_parameters: list[str]  # MoE expert parameters adapted, peft format
    notes: list[str] = field(default_factory=list)  # where peft adapted other than asked (a run's warnings)

    def summary(self) -> str:
        share = 100 * self.trainable / max(self.total, 1)
        return f"{self.trainable:,} trainable of {self.total:,} parameters ({share:.3f}%)"


def _expert_targets(model) -> list[str]:
    """peft `target_parameters` for MoE experts (saved in peft's own format)."""
    from hone.core.speed import moe

    return list(moe.expert_lora_targets(model))


def _linear_layer_names(model) -> list[str]:
    """The names (last path part) of the model's linear layers, the LM head left out: "all-linear" spelled out."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear_types = ("Linear", "Linear4bit", "Linear8bitLt")
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if module is not head and (isinstance(module, torch.nn.Linear) or type(module).__name__ in linear_types)
    }
    return sorted(names)


def _module_names(model, names) -> list[str]:
    """Full names of the modules called any of `names` (the children of a ModuleList / ModuleDict, which peft
    cannot wrap as one module)."""
    import torch

    found = []
    for full, module in model.named_modules():
        if full.rsplit(".", 1)[-1] not in names:
            continue
        if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            found += [f"{full}.{child}" for child, _ in module.named_children()]
        else:
            found.append(full)
    # a projector nested in the vision tower (Qwen's visual.merger) must not be listed twice
    return [n for n in found if not any(n.startswith(other + ".") for other in found if other != n)]


def _exclusion_regex(names) -> str | None:
    """A peft `exclude_modules` pattern matching the modules called any of `names` and everything inside them."""
    import re

    names = sorted(set(names))
    if not names:
        return None
    return r"^(.*\.)?(" + "|".join(re.escape(n) for n in names) + r")(\..*)?$"


def vision_plan(model, lora_cfg: LoraConfig) -> tuple[str | None, list[str]]:
    """(peft exclude_modules pattern, peft modules_to_save) for a vision-language model.

    LoRA stays on the language model: the vision encoder is excluded unless `lora.train_vision_tower`, and the
    projector always (with `lora.train_projector` it is trained in full instead, and saved with the adapter).
    Modules named in `lora.modules_to_save` are trained in full too and kept out of LoRA.
    """
    from hone.core.vision import family_of

    family = family_of(model)
    excluded = set(family.projector_modules) | set(lora_cfg.modules_to_save)
    if not lora_cfg.train_vision_tower:
        excluded |= set(family.vision_modules)
    full = list(family.projector_modules if lora_cfg.train_projector else ()) + list(lora_cfg.modules_to_save)
    return _exclusion_regex(excluded), _module_names(model, set(full))


def build_peft_config(model, lora_cfg: LoraConfig, info: ModelInfo):
    """The peft LoraConfig for this model; vision parts are left alone unless the config asks for them.

    Raises:
        ConfigError: a name in lora.modules_to_save is not a module of this model.
    """
    from peft import LoraConfig as PeftLoraConfig

    targets: str | list[str] = lora_cfg.targets
    if targets == ["all-linear"]:
        targets = "all-linear"
    if targets == "all-linear" and info.is_moe and not lora_cfg.experts:
        # peft's own "all-linear" on transformers 5 maps some families' old expert names (Qwen3-MoE's gate_proj /
        # up_proj / down_proj) onto the 3-D expert weights: name the linear layers instead, so none is adapted.
        targets = _linear_layer_names(model)
    exclude, modules_to_save = None, []
    if info.is_vision:
        exclude, modules_to_save = vision_plan(model, lora_cfg)
    elif lora_cfg.modules_to_save:
        exclude = _exclusion_regex(lora_cfg.modules_to_save)
        modules_to_save = _module_names(model, set(lora_cfg.modules_to_save))
    missing = [n for n in lora_cfg.modules_to_save if not _module_names(model, {n})]
    if missing:
        raise ConfigError(
            f"lora.modules_to_save names {missing}, which this model does not have",
            "use module names as they appear in the model, e.g. vision_tower or lm_head",
        )
    target_parameters = _expert_targets(model) if (info.is_moe and lora_cfg.experts) else []
    # peft refuses dropout together with target_parameters (and adds expert parameters to "all-linear" on MoE
    # models by itself), so on MoE models the dropout is applied by Hone's split-LoRA path instead; the saved
    # adapter then says lora_dropout = 0, which changes nothing at inference.
    dropout = 0.0 if info.is_moe else lora_cfg.dropout
    return PeftLoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=dropout,
        target_modules=targets,
        exclude_modules=exclude,
        use_rslora=lora_cfg.rslora,
        target_parameters=target_parameters or None,
        modules_to_save=modules_to_save or None,
        task_type="CAUSAL_LM",
    )


def apply_lora(model, lora_cfg: LoraConfig, info: ModelInfo):
    """Wrap `model` in a peft LoRA model. Returns (peft_model, LoraReport)."""
    from peft import get_peft_model

    config = build_peft_config(model, lora_cfg, info)
    asked = _linear_modules(model, config.target_modules)
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as e:
        raise ConfigError(
            f"lora.targets {lora_cfg.targets} do not fit this model: {e}",
            "use 'all-linear' or module names the model has (e.g. q_proj, v_proj)",
        ) from None
    if info.is_moe:
        from hone.core.speed import moe

        moe.install_split_lora(peft_model, dropout=lora_cfg.dropout)
    trainable, total = peft_model.get_nb_trainable_parameters()
    adapted = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in peft_model.named_modules()
            if hasattr(module, "lora_A") and not name.endswith(("lora_A", "lora_B"))
        }
    )
    adapted_parameters = list(peft_model.peft_config["default"].target_parameters or [])
    report = LoraReport(
        trainable=int(trainable),
        total=int(total),
        targets=adapted,
        target_parameters=adapted_parameters,
        notes=_remap_notes(peft_model, asked, lora_cfg, info, adapted_parameters),
    )
    return peft_model, report


def _linear_modules(model, targets) -> list[str]:
    """Full names of the linear layers `targets` (peft's target_modules: "all-linear" or names) asks to adapt."""
    if isinstance(targets, str):  # "all-linear", or a pattern Hone does not spell out
        names = set(_linear_layer_names(model)) if targets == "all-linear" else set()
    else:
        names = set(targets or ())
    return [
        full
        for full in _module_names(model, names)
        if full.rsplit(".", 1)[-1] in names
        and type(model.get_submodule(full)).__name__ in ("Linear", "Linear4bit", "Linear8bitLt")
    ]


def _remap_notes(
    peft_model, asked: list[str], lora_cfg: LoraConfig, info: ModelInfo, adapted_parameters: list[str]
) -> list[str]:
    """What peft adapted other than asked. peft on transformers 5 reads transformers 4's expert names (gate_proj,
    up_proj, down_proj) as the fused experts of some MoE families (DeepSeek-V3, GLM-4.x): the linear layers of
    those names (shared experts, first dense layers) are left without LoRA, and the experts get it. An adapter
    that plain peft loads back can only be made that way, so Hone says so rather than working around it."""
    import peft

    wrapped = {
        name.removeprefix("base_model.model.")
        for name, module in peft_model.named_modules()
        if hasattr(module, "lora_A")
    }
    excluded = peft_model.peft_config["default"].exclude_modules  # a vision model's encoder, modules_to_save
    left = [name for name in asked if name not in wrapped and not _excluded(name, excluded)]
    notes = []
    if left and info.is_moe:
        kinds = sorted({_without_layer_index(name) for name in left})
        notes.append(
            f"{len(left)} linear layers train without LoRA ({', '.join(kinds)}): peft {peft.__version__} "
            "reads their names as this model's experts (transformers 4's names for them) and adapts the "
            "experts instead"
        )
    if info.is_moe and not lora_cfg.experts and adapted_parameters:
        notes.append(
            f"the experts ({', '.join(adapted_parameters)}) train with LoRA although lora.experts = false: "
            f"peft {peft.__version__} maps the names gate_proj / up_proj / down_proj onto them on this "
            "model family"
        )
    return notes


def _excluded(name: str, exclude) -> bool:
    """Whether peft's `exclude_modules` (a regex matched whole, or names matched as suffixes) leaves `name` out."""
    import re

    if not exclude:
        return False
    if isinstance(exclude, str):
        return re.fullmatch(exclude, name) is not None
    return any(name == key or name.endswith("." + key) for key in exclude)


def _without_layer_index(name: str) -> str:
    """ "model.layers.3.mlp.shared_experts.up_proj" -> "mlp.shared_experts.up_proj"."""
    import re

    return re.split(r"(?:^|\.)\d+\.", name)[-1]
