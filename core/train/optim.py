"""Optimizer and learning-rate schedule: `build_optimizer` (`train.optimizer`), `build_scheduler` (`train.schedule`).

`adamw` is torch's AdamW, `adamw-bf16` Hone's `FlatAdamW` (flat buffers, bf16 gradients and moments), `adamw8bit`
bitsandbytes'. Under `FlatAdamW` `param.grad` stays None (gradients go straight into its flat buffer): clip with
its own `clip_grad_norm_`, not torch's.
"""

from __future__ import annotations

import math
import weakref

import torch

from hone.core.config import TrainConfig
from hone.core.errors import INSTALL_BITSANDBYTES, ConfigError


def build_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig, device: str) -> torch.optim.Optimizer:
    """The optimizer `cfg.optimizer` names:

    - adamw: torch's AdamW (fused on CUDA: one kernel for all parameters), float32 moments and gradients.
    - adamw-bf16: `FlatAdamW`: every trainable weight lives in one flat float32 buffer, gradients in one flat bf16
      buffer (each parameter's float32 gradient is folded in and freed as soon as autograd has it), bf16 moments
      with stochastic rounding, and one kernel for the update; clipping reads the flat buffer, on the device. For
      LoRA on MoE experts (166M trainable values on a Qwen3-30B-A3B shape) that is 10 bytes per value instead of 16.
    - adamw8bit: bitsandbytes' 8-bit AdamW (NVIDIA GPUs only).

    Raises:
        ConfigError: adamw8bit on the CPU, or without bitsandbytes.
    """
    if cfg.optimizer == "adamw-bf16":
        return FlatAdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, state_dtype=torch.bfloat16, seed=cfg.seed)
    if cfg.optimizer == "adamw8bit":
        if not str(device).startswith("cuda"):
            raise ConfigError(
                "train.optimizer = adamw8bit needs an NVIDIA GPU; this run is on the CPU", "use train.optimizer = adamw"
            )
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise ConfigError(
                "train.optimizer = adamw8bit needs the bitsandbytes package",
                f"{INSTALL_BITSANDBYTES}, or use train.optimizer = adamw",
            ) from None
        return bnb.optim.AdamW8bit(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    fused = str(device).startswith("cuda")
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)


def warmup_steps(cfg: TrainConfig, total_steps: int) -> int:
    return cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total_steps)


def lr_factor(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Multiplier of the peak lr for 0-based optimizer step `step`: linear warmup (the first step already
    moves), then cosine / linear decay towards 0 or constant."""
    warmup = warmup_steps(cfg, total_steps)
    if step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total_steps - warmup)
    if cfg.schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))


# Each parameter's slice of the flat buffers starts on a multiple of this many elements (256 bytes in float32), so
# the views keep the alignment vectorized kernels and grouped GEMMs expect of a fresh tensor.
_ALIGN_ELEMENTS = 64


class FlatAdamW(torch.optim.Optimizer):
    """AdamW over flat buffers: one kernel per step, 16-bit gradients and moments (`train.optimizer = adamw-bf16`).

    Construction moves every parameter's values into `flat_params` and points the parameter at its slice (the
    model computes with the same values; `load_state_dict` on the model writes into the slices). A hook folds each
    gradient into `flat_grads` when autograd has accumulated it and frees it, so `param.grad` stays None: use
    `clip_grad_norm_` (which also takes the norm) instead of torch's. Gradient accumulation over micro-batches adds
    into the flat buffer; `zero_grad` clears it. A float16 model's GradScaler reads `param.grad`, so this optimizer
    is for bf16 and float32 models.

    Args:
        params: trainable parameters, all of one dtype and device.
        lr, betas, eps, weight_decay: as torch.optim.AdamW.
        state_dtype: dtype of the gradient and moment buffers (bfloat16: stochastic rounding of the moments;
            float32: the same update as torch's AdamW).
        seed: seed of the stochastic rounding (each step uses seed and step number).
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        state_dtype: torch.dtype = torch.bfloat16,
        seed: int = 0,
    ):
        params = [p for p in params if p.requires_grad]
        if not params:
            raise ValueError("FlatAdamW got no trainable parameters")
        dtypes, devices = {p.dtype for p in params}, {p.device for p in params}
        if len(dtypes) != 1 or len(devices) != 1:
            raise ValueError(f"FlatAdamW needs parameters of one dtype and device, got {dtypes} on {devices}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        device, dtype = devices.pop(), dtypes.pop()
        self.offsets: list[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += -(-p.numel() // _ALIGN_ELEMENTS) * _ALIGN_ELEMENTS
        self.numel = total
        self.flat_params = torch.zeros(total, dtype=dtype, device=device)
        with torch.no_grad():
            for p, offset in zip(params, self.offsets, strict=True):
                view = self.flat_params[offset : offset + p.numel()]
                view.copy_(p.detach().reshape(-1))
                p.data = view.view_as(p)
        self.flat_grads = torch.zeros(total, dtype=state_dtype, device=device)
        self.exp_avg = torch.zeros(total, dtype=state_dtype, device=device)
        self.exp_avg_sq = torch.zeros(total, dtype=state_dtype, device=device)
        self.step_count = 0
        self.seed = int(seed)
        self._coef: torch.Tensor | None = None
        self._handles = [
            p.register_post_accumulate_grad_hook(self._folder(offset))
            for p, offset in zip(params, self.offsets, strict=True)
        ]

    def _folder(self, offset: int):
        # The hook lives on the parameter: a strong reference back to the optimizer would make a cycle through
        # tensors that keeps the flat buffers alive after the optimizer is dropped (seen as memory left over
        # between benchmark runs).
        optimizer = weakref.ref(self)

        def fold(param: torch.Tensor) -> None:
            owner = optimizer()
            if owner is None:  # the optimizer is gone: leave the gradient where autograd put it
                return
            owner.flat_grads[offset : offset + param.numel()].add_(param.grad.reshape(-1))
            param.grad = None

        return fold

    def grad_views(self) -> list[torch.Tensor]:
        """Each parameter's gradient as a view of the flat buffer (its shape, the buffer's dtype)."""
        return [
            self.flat_grads[o : o + p.numel()].view_as(p)
            for p, o in zip(self.param_groups[0]["params"], self.offsets, strict=True)
        ]

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The gradients' global L2 norm (a float32 device tensor); the next `step` scales them by
        min(1, max_norm / (norm + 1e-6)) inside its kernel. No host sync."""
        from hone.kernels.adamw import sum_squares

        norm = sum_squares(self.flat_grads).sqrt()
        if math.isfinite(max_norm):
            self._coef = (max_norm / (norm + 1e-6)).clamp(max=1.0).reshape(1)
        return norm

    @torch.no_grad()
    def step(self, closure=None):
        from hone.kernels.adamw import adamw_step_

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group = self.param_groups[0]
        self.step_count += 1
        coef = self._coef if self._coef is not None else torch.ones(1, device=self.flat_params.device)
        beta1, beta2 = group["betas"]
        adamw_step_(
            self.flat_params,
            self.flat_grads,
            self.exp_avg,
            self.exp_avg_sq,
            coef,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            step=self.step_count,
            seed=self.seed * 1_000_003 + self.step_count,
        )
        self._coef = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the flat gradient buffer (parameters' own `.grad` is always None)."""
        self.flat_grads.zero_()
        for p in self.param_groups[0]["params"]:
            p.grad = None

    def state_dict(self) -> dict:
        groups = [{k: v for k, v in group.items() if k != "params"} for group in self.param_groups]
        return {
            "flat_adamw": 1,
            "numel": self.numel,
            "step": self.step_count,
            "seed": self.seed,
            "exp_avg": self.exp_avg,
            "exp_avg_sq": self.exp_avg_sq,
            "param_groups": groups,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("flat_adamw") != 1:
            raise ConfigError(
                "the checkpoint's optimizer state is not FlatAdamW's (train.optimizer changed?)",
                "resume with the train.optimizer the run was started with",
            )
        if state_dict["numel"] != self.numel:
            raise ConfigError(
                f"the checkpoint's optimizer holds {state_dict['numel']} values, this run {self.numel}",
                "resume with the same model and LoRA settings",
            )
        self.step_count, self.seed = int(state_dict["step"]), int(state_dict["seed"])
        self.exp_avg.copy_(state_dict["exp_avg"])
        self.exp_avg_sq.copy_(state_dict["exp_avg_sq"])
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update(saved)
