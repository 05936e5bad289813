"""Helpers for the checkpointing tests: LoRA models with non-zero adapters, packed batches, one forward/backward."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hone.core.data.collate import collate_packed
from hone.core.train.loss import loss_sum


def lora_model(base, *, dropout: float = 0.0, rank: int = 4, seed: int = 1):
    """`base` wrapped in peft LoRA on every linear layer, with B initialised randomly (peft starts B at zero, which
    would leave every A gradient zero and the test blind to them)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=dropout)
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def packed_batch(lengths, seed: int = 0, vocab: int = 1000):
    """A packed batch of random rows (every token trained), with the cu_seq_lens / max_length kwargs."""
    generator = torch.Generator().manual_seed(seed)
    rows = [
        SimpleNamespace(
            input_ids=torch.randint(0, vocab, (n,), generator=generator).tolist(),
            labels=torch.randint(0, vocab, (n,), generator=generator).tolist(),
        )
        for n in lengths
    ]
    return collate_packed(rows)


def loss_and_grads(model, batch, *, seed: int = 7, autocast_dtype=None):
    """Summed token loss and a copy of every trainable gradient after one forward/backward (grads zeroed after)."""
    model.train()
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
    device = next(model.parameters()).device
    context = (
        torch.autocast(device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else torch.autocast(device.type, enabled=False)
    )
    with context:
        loss = loss_sum(model, batch.to(device))
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.detach().float(), grads


def layer_call_counter(model):
    """(counts, remove): counts[0] grows by one each time a decoder layer's body runs, recomputes included (the hook
    sits on the layer's first child: transformers may run a layer's hooks outside the checkpoint)."""
    from hone.core.speed.checkpointing.checkpointer import decoder_layers

    counts = [0]

    def hook(module, args, output):
        counts[0] += 1

    handles = [next(layer.children()).register_forward_hook(hook) for layer in decoder_layers(model)]
    return counts, lambda: [h.remove() for h in handles]


class ToyLayer(torch.nn.Module):
    """h + tanh(W h) (+ scale): a residual block with trainable weights."""

    def __init__(self, width: int, seed: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(width, width, generator=torch.Generator().manual_seed(seed)) * 0.05)

    def forward(self, h, scale=None):
        out = h + torch.tanh(self.linear(h))
        return out if scale is None else out * scale


def chain_grads(layers, x, checkpointer=None, scale=None, after_forward=None):
    """Loss and gradients of the toy chain (input x does not require grad, like a frozen embedding's output).
    `after_forward(inputs)` is called with every layer's input between forward and backward."""
    h, inputs = x, []
    for layer in layers:
        inputs.append(h)
        kwargs = {} if scale is None else {"scale": scale}
        h = checkpointer(layer, h, **kwargs) if checkpointer is not None else layer(h, **kwargs)
    if after_forward is not None:
        after_forward(inputs)
    del inputs
    loss = (h * torch.linspace(-1, 1, h.shape[-1], device=h.device)).sum()
    loss.backward()
    params = [p for layer in layers for p in layer.parameters()] + ([scale] if scale is not None else [])
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return loss.detach(), grads


def toy_chain(n=4, width=256, device="cpu"):
    return [ToyLayer(width, seed).to(device) for seed in range(n)]
