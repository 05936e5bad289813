"""The reference: what a careful user runs with plain transformers + peft (`ReferenceRunner`).

The model with transformers' SDPA attention (grouped_mm or eager experts for MoE models), transformers' gradient
checkpointing, peft LoRA on all linear layers (and on the stacked experts), one packed row as
`DataCollatorWithFlattening` makes it with the model's own loss, autocast and fused AdamW as the HF Trainer uses
them with `bf16=True`. Every choice is listed on `ReferenceRunner`.
"""

from __future__ import annotations

import contextlib

import torch

from hone.core.bench.batch import TokenBatch
from hone.core.bench.measure import StepOutcome, loss_scaler, optimizer_step
from hone.core.bench.packed_masks import block_mask_mapping, packed_sequences_cross
from hone.core.bench.scenarios import Scenario
from hone.core.bench.weights import (
    active_params,
    adapted_names,
    architecture_facts,
    build_bench_model,
    decoder_linear_names,
    default_attention,
    expert_target_parameters,
)
from hone.core.models.hub_kernels import from_pretrained_options

# The HF Trainer's defaults a careful user keeps: learning rate and gradient clipping.
LEARNING_RATE = 2e-4
MAX_GRAD_NORM = 1.0


def enable_checkpointing(model) -> None:
    """transformers' own activation checkpointing of every decoder layer, non-reentrant (the method's name
    changed in transformers 5.2x; the old one still works there but warns)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class ReferenceRunner:
    """One reference run:

    - the model in bf16 (fp32 on a CPU) with `attn_implementation="sdpa"` (eager where transformers has no SDPA
      path for the architecture), MoE experts with `experts_implementation="grouped_mm"` (or "eager" for the second
      MoE reference); QLoRA: `from_pretrained` with bitsandbytes nf4 + double quantization, bf16 compute;
    - `gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})` (its new name
      `activation_checkpointing_enable` where transformers has it);
    - peft LoRA r (alpha 2r, no dropout) on all linear layers, and on the stacked expert weights through
      `target_parameters` for MoE models;
    - one packed row as `DataCollatorWithFlattening` makes it (position ids restarting per sequence, labels -100 at
      each sequence start), moved to the device once; the model's own loss from `labels`; where the model's own
      masks let the sequences attend to one another (gpt-oss builds them without the position ids), per-sequence
      masks built once (`packed_masks.block_mask_mapping`), so the reference's loss is the sequences' loss;
    - autocast in the weights' dtype on CUDA and fused AdamW, as the HF Trainer does with `bf16=True` (with `fp16=True`
      also its loss scaler); gradient clipping at 1.0 (the Trainer's default).
    """

    kind = "reference"

    def __init__(
        self,
        name: str,
        scenario: Scenario,
        layers: int | None,
        batch: TokenBatch,
        *,
        lora_r: int,
        seed: int,
        dtype: torch.dtype,
        device: str,
        qlora: bool = False,
        experts_implementation: str | None = None,
        model_folder=None,
        lora_experts: bool = True,
    ):
        self.name, self.scenario, self.layers, self.batch = name, scenario, layers, batch
        self.lora_r, self.seed, self.dtype, self.device, self.qlora = lora_r, seed, dtype, device, qlora
        self.experts_implementation = experts_implementation
        self.model_folder = model_folder
        self.lora_experts = lora_experts
        self.model = self.optimizer = self.scaler = self.inputs = None
        self.params: list = []
        self.own_masks_cross = False

    # ---- building ----
    def _load(self):
        if not self.qlora:
            return build_bench_model(
                self.scenario,
                self.layers,
                seed=self.seed,
                dtype=self.dtype,
                device=self.device,
                experts_implementation=self.experts_implementation,
            )
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=self.dtype,
        )
        extra = {"experts_implementation": self.experts_implementation} if self.experts_implementation else {}
        model = AutoModelForCausalLM.from_pretrained(
            self.model_folder,
            quantization_config=quantization,
            device_map={"": self.device},
            dtype=self.dtype,
            attn_implementation=default_attention(self.scenario),
            **extra,
            **from_pretrained_options(),
        )
        model.config.use_cache = False
        model.train()
        return model

    def setup(self) -> None:
        from peft import LoraConfig, get_peft_model

        model = self._load()
        # A model whose own masks let packed sequences attend to one another (gpt-oss) gets per-sequence masks:
        # what a careful user passes once they see it, and what every other run computes.
        self.own_masks_cross = packed_sequences_cross(model)
        enable_checkpointing(model)
        torch.manual_seed(self.seed)  # LoRA init independent of what building consumed, as Hone's trainer does
        if self.lora_experts:
            targets = dict(target_modules="all-linear", target_parameters=expert_target_parameters(model) or None)
        else:  # peft's "all-linear" also takes MoE routers and experts: name the linear layers instead
            targets = dict(target_modules=decoder_linear_names(model))
        config = LoraConfig(
            r=self.lora_r, lora_alpha=2 * self.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM", **targets
        )
        self.model = get_peft_model(model, config)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        cuda = str(self.device).startswith("cuda")
        self.optimizer = torch.optim.AdamW(self.params, lr=LEARNING_RATE, fused=True if cuda else None)
        self.scaler = loss_scaler(self.dtype, self.device)
        self.inputs = {k: torch.from_numpy(v).to(self.device) for k, v in self.batch.flattened().items()}
        if self.own_masks_cross:
            self.inputs["attention_mask"] = block_mask_mapping(model, self.inputs["position_ids"])

    def _autocast(self):
        if str(self.device).startswith("cuda") and self.dtype != torch.float32:
            return torch.autocast("cuda", dtype=self.dtype)
        return contextlib.nullcontext()

    # ---- steps ----
    def _loss(self) -> torch.Tensor:
        with self._autocast():
            return self.model(**self.inputs, use_cache=False).loss

    def step(self) -> StepOutcome:
        loss = self._loss()
        grad_norm = optimizer_step(loss, self.params, self.optimizer, self.scaler, MAX_GRAD_NORM)
        return StepOutcome(loss=loss.item(), grad_norm=grad_norm)

    def forward_backward(self) -> None:
        self._loss().backward()
        self.optimizer.zero_grad(set_to_none=True)

    def teardown(self) -> None:
        self.model = self.optimizer = self.scaler = self.inputs = None
        self.params = []

    def describe(self) -> dict:
        config = self.model.get_base_model().config
        facts = architecture_facts(self.scenario, self.layers)
        paths = {
            "attention": f"{config._attn_implementation} (transformers)"
            + (
                ", per-sequence masks given (the model's own let packed sequences attend across)"
                if self.own_masks_cross
                else ""
            ),
            "checkpoint": "transformers gradient_checkpointing_enable, non-reentrant",
            "loss": "the model's own loss from labels (full logits)",
            "lora": "peft, all linear layers"
            + (" + expert target_parameters" if facts["experts"] and self.lora_experts else ""),
        }
        paths["adapted"] = ", ".join(adapted_names(self.model))
        if facts["experts"]:
            paths["moe"] = f"{getattr(config, '_experts_implementation', None)} (transformers)"
        if self.qlora:
            paths["quantization"] = "bitsandbytes nf4, double quantization"
        return {
            "speed_paths": paths,
            "trainable_params": sum(p.numel() for p in self.params),
            "active_params": active_params(self.model, facts["experts"], facts["experts_per_token"]),
        }
