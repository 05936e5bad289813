"""LoRA adapters through peft: rank, alpha, dropout, targets (all linear layers of the decoder by default), rsLoRA,
per-expert LoRA on MoE experts (peft `target_parameters`), and the trainable / total parameter report."""

from __future__ import annotations

from dataclasses import dataclass

from hone.core.config import LoraConfig
from hone.core.errors import ConfigError
from hone.core.model_info import ModelInfo


@dataclass(frozen=True)
class LoraReport:
    trainable: int
    total: int
    targets: list[str]  # module names adapted (suffixes), e.g. ["q_proj", "k_proj", ...]
    target_parameters: list[str]  # MoE expert parameters adapted, peft format

    def summary(self) -> str:
        share = 100 * self.trainable / max(self.total, 1)
        return f"{self.trainable:,} trainable of {self.total:,} parameters ({share:.3f}%)"


def _expert_targets(model) -> list[str]:
    """peft `target_parameters` for MoE experts (saved in peft's own format)."""
    from hone.core import moe

    return list(moe.expert_lora_targets(model))


def _vision_exclusions(model) -> list[str]:
    """Module name regex parts that keep LoRA off the vision tower / projector unless asked for."""
    names = {name.split(".")[0] for name, _ in model.named_modules() if name}
    inner = {name.split(".")[1] for name, _ in model.named_modules() if name.count(".") >= 1}
    return sorted(n for n in names | inner if any(k in n for k in ("vision", "visual", "multi_modal_projector",
                                                                      "connector", "vision_tower")))


def build_peft_config(model, lora_cfg: LoraConfig, info: ModelInfo):
    """The peft LoraConfig for this model; vision parts are left alone unless the config asks for them."""
    from peft import LoraConfig as PeftLoraConfig

    targets: str | list[str] = lora_cfg.targets
    if targets == ["all-linear"]:
        targets = "all-linear"
    exclude = None
    if info.is_vision and not lora_cfg.train_vision_tower:
        exclude = _vision_exclusions(model) or None
    target_parameters = _expert_targets(model) if (info.is_moe and lora_cfg.experts) else []
    # peft refuses dropout together with target_parameters (and adds expert parameters to "all-linear" on MoE
    # models by itself), so on MoE models the dropout is applied by Hone's split-LoRA path instead; the saved
    # adapter then says lora_dropout = 0, which changes nothing at inference.
    dropout = 0.0 if info.is_moe else lora_cfg.dropout
    return PeftLoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=dropout,
                          target_modules=targets, exclude_modules=exclude, use_rslora=lora_cfg.rslora,
                          target_parameters=target_parameters or None, task_type="CAUSAL_LM")


def apply_lora(model, lora_cfg: LoraConfig, info: ModelInfo):
    """Wrap `model` in a peft LoRA model. Returns (peft_model, LoraReport)."""
    from peft import get_peft_model

    config = build_peft_config(model, lora_cfg, info)
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as e:
        raise ConfigError(f"lora.targets {lora_cfg.targets} do not fit this model: {e}",
                          "use 'all-linear' or module names the model has (e.g. q_proj, v_proj)") from None
    if info.is_moe:
        from hone.core import moe

        moe.install_split_lora(peft_model, dropout=lora_cfg.dropout)
    if lora_cfg.train_projector and info.is_vision:
        for name, param in peft_model.named_parameters():
            if any(k in name for k in ("multi_modal_projector", "connector", "merger")):
                param.requires_grad_(True)
    trainable, total = peft_model.get_nb_trainable_parameters()
    adapted = sorted({name.rsplit(".", 1)[-1] for name, module in peft_model.named_modules()
                      if hasattr(module, "lora_A") and not name.endswith(("lora_A", "lora_B"))})
    report = LoraReport(trainable=int(trainable), total=int(total), targets=adapted,
                        target_parameters=list(config.target_parameters or []))
    return peft_model, report
