"""Batched sampling with a static KV cache and, on a GPU, the decode step captured as one CUDA graph.

`transformers`' `generate` grows its cache by concatenation, asks the GPU each token whether every row has ended
(a host sync), runs its logits processors one by one and launches every kernel of every layer from Python; for a
small model the GPU waits on the host most of the time. Here the keys and values of every layer live in buffers
allocated once for B rows × (prompt + completion) positions, the decode step's inputs (token, position, mask
column, write position) are buffers updated in place, so the step has the same shapes and addresses every time
and runs as one graph replay; sampling (temperature, top-p, an exponential race that equals multinomial sampling)
is a handful of kernels with no host sync, and the host asks whether every row has ended once per `CHECK_EVERY`
tokens. The model is the training model itself (LoRA applied, weights shared, nothing copied).

Masks are given to the model as a boolean (B, 1, q, L) tensor (one per layer type where layers differ), so
transformers builds none; the
cache is a small object with the one method the attention layers call (`update`). The prompts are left-padded to
a multiple of `PROMPT_BUCKET`, so steps with prompts of different lengths reuse the same shapes. A model whose
decode step cannot be captured (a host sync inside it, e.g. an eager MoE that asks which experts got tokens)
decodes eagerly with the same buffers; `StaticSampler.capture_problem` says why.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hone.core.speed.attention.choice import apply_attention, revert_attention
from hone.core.speed.attention.sdpa_fallback import dense_sink_attention
from hone.core.speed.host_tables import tables_on_device
from hone.kernels.weight_casts import forget_casts

PROMPT_BUCKET = 64  # prompts are left-padded to a multiple of this, so later steps reuse the captured shapes
CHECK_EVERY = 16  # decode steps between the host's checks whether every row has ended


class StaticKV:
    """The keys and values of every layer for B rows × `length` positions, written at `positions` (a device
    tensor the caller updates in place): the one part of transformers' cache interface attention layers use."""

    is_compileable = True

    def __init__(self, length: int):
        self.length = length
        self.positions: torch.Tensor | None = None
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys = self.keys.get(layer_idx)
        if keys is None:  # allocated on first use with the layer's own heads, head size and dtype
            b, h, _, d = key.shape
            keys = self.keys[layer_idx] = key.new_zeros(b, h, self.length, d)
            self.values[layer_idx] = value.new_zeros(b, value.shape[1], self.length, value.shape[-1])
        values = self.values[layer_idx]
        keys.index_copy_(2, self.positions, key)
        values.index_copy_(2, self.positions, value)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:  # never needed: positions are always given
        raise RuntimeError("static sampling passes position ids; the cache length is not asked for")


DECODE_ATTENTION = "hone_static_decode"  # the attention the model uses while this sampler runs


class Unsupported(Exception):
    """The model computes attention in a way this sampler does not (soft-capped scores): use `generate`."""


def decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention over the static cache under the sampler's boolean mask: SDPA with grouped heads read in place
    (transformers' SDPA repeats every key and value head when given a mask: most of a small model's decode step),
    or the dense form with gpt-oss' sink logits. Shapes as transformers' `AttentionInterface`; (B, T, H, D) out."""
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        return dense_sink_attention(query, key, value, attention_mask, sinks, scaling), None
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


@dataclass
class Layout:
    """The text model's facts the masks need: each layer type's sliding window (None: full attention)."""

    windows: dict[str, int | None]
    cache_argument: str  # "cache" (transformers >= 5.25) or "past_key_values"


def layout(model) -> Layout:
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = hf.config.get_text_config(decoder=True) if hasattr(hf.config, "get_text_config") else hf.config
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    windows = {t: (window if "sliding" in t else None) for t in types}
    params = inspect.signature(type(hf).forward).parameters
    if getattr(config, "attn_logit_softcapping", None):
        raise Unsupported("its attention soft-caps the scores")
    return Layout(windows, "cache" if "cache" in params else "past_key_values")


def sample_next(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(B,) tokens drawn from (B, V) logits at `temperature`, only from the smallest set of most likely tokens
    whose probability reaches `top_p`. Exponential race: argmax(p / E) with E ~ Exp(1) draws index i with
    probability p_i, like multinomial, without a host sync."""
    logits = logits.float() / temperature
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # mass before a token already reaches top_p: the first stays
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return (probs / torch.empty_like(probs).exponential_()).argmax(-1)


class StaticSampler:
    """Samples completions for left-padded prompts; holds what it learned about the model between calls."""

    def __init__(self, *, capture: bool | None = None, adapters_in_compute_dtype: bool = True):
        self.capture = capture  # None: capture on a GPU
        self.adapters_in_compute_dtype = adapters_in_compute_dtype
        self.capture_problem: str | None = None  # why the decode step runs eagerly, once it was tried
        self.captured_steps = 0
        self.eager_steps = 0

    @torch.no_grad()
    def sample(
        self,
        model,
        ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        pad_id: int,
        eos_ids,
    ) -> torch.Tensor:
        """(B, T ≤ max_new_tokens) completion ids for the (B, P) left-padded `ids` / `mask`: pad after a row's first
        end-of-text token, and T is cut where every row has ended. The model is left in the mode it was in."""
        from transformers import AttentionInterface

        AttentionInterface.register(DECODE_ATTENTION, decode_attention)
        was_training = model.training
        model.eval()
        previous = apply_attention(model, DECODE_ATTENTION)
        cast = adapters_in_compute_dtype(model) if self.adapters_in_compute_dtype else contextlib.nullcontext()
        try:
            with tables_on_device(model), cast:
                return self._sample(model, ids, mask, max_new_tokens, temperature, top_p, pad_id, eos_ids)
        finally:
            revert_attention(model, previous)
            if was_training:
                model.train()

    def _sample(self, model, ids, mask, max_new_tokens, temperature, top_p, pad_id, eos_ids) -> torch.Tensor:
        device = ids.device
        ids, mask = _pad_left_to(ids, mask, -(-ids.shape[1] // PROMPT_BUCKET) * PROMPT_BUCKET, pad_id)
        rows, width = ids.shape
        plan = layout(model)
        cache = StaticKV(width + max_new_tokens)
        keys = torch.arange(cache.length, device=device)
        valid = torch.zeros(rows, cache.length, dtype=torch.bool, device=device)  # which cache positions hold tokens
        valid[:, :width] = mask.bool()
        lengths = mask.sum(1, keepdim=True)  # (B, 1) each prompt's tokens: the first completion token's position

        def forward(input_ids, position_ids, masks):
            kwargs = {plan.cache_argument: cache}
            out = model(
                input_ids=input_ids,
                position_ids=position_ids,
                # one layer type: the 4D mask itself (models without sliding layers take no per-type mapping)
                attention_mask=masks if len(masks) > 1 else next(iter(masks.values())),
                use_cache=True,
                logits_to_keep=1,
                **kwargs,
            )
            return out.logits[:, -1]

        # prefill: causal over the prompt's own tokens; a padding position attends to itself only (never an empty
        # row, whose softmax would be NaN and spread through the next layers' keys)
        cache.positions = torch.arange(width, device=device)
        query = cache.positions[:, None]
        causal = (keys[None, :] <= query) & valid[:, None, :]
        causal |= keys[None, :] == query
        logits = forward(ids, (mask.cumsum(1) - 1).clamp(min=0), self._masks(plan, causal[:, None], query, keys))

        eos = torch.tensor(sorted(set(eos_ids)), device=device)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        out = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
        # the decode step's inputs, updated in place so a captured graph reads them at replay
        token = torch.empty(rows, 1, dtype=torch.long, device=device)
        position = lengths.clone()
        cache.positions = torch.full((1,), width, dtype=torch.long, device=device)
        mask_dtype = torch.bool
        decode_masks = {
            name: torch.empty(rows, 1, 1, cache.length, dtype=mask_dtype, device=device) for name in plan.windows
        }
        step = DecodeStep(forward, token, position, decode_masks, self._use_capture(device))

        produced = 0
        for t in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_p)
            nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
            out[:, t] = nxt
            finished |= torch.isin(nxt, eos)
            produced = t + 1
            if produced == max_new_tokens or (produced % CHECK_EVERY == 0 and bool(finished.all())):
                break
            # the new token goes to cache position width + t
            if t > 0:
                cache.positions.add_(1)
                position.add_(1)
            valid.index_fill_(1, cache.positions, True)
            token.copy_(nxt[:, None])
            query = cache.positions[:, None]
            for name, window in plan.windows.items():
                allowed = valid if window is None else valid & (keys[None, :] > query - window)
                decode_masks[name].copy_(allowed[:, None, None, :])
            logits = step.run()
        self.capture_problem = step.problem or self.capture_problem
        self.captured_steps += step.replays
        self.eager_steps += step.eager
        return out[:, :produced]

    def _use_capture(self, device) -> bool:
        if device.type != "cuda" or self.capture is False:
            return False
        return self.capture_problem is None  # a model that failed once decodes eagerly from then on

    @staticmethod
    def _masks(plan: Layout, full: torch.Tensor, query: torch.Tensor, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        masks = {}
        for name, window in plan.windows.items():
            allowed = full if window is None else full & (keys[None, None, None, :] > query[None, None] - window)
            masks[name] = allowed
        return masks


@contextlib.contextmanager
def adapters_in_compute_dtype(model) -> Iterator[int]:
    """LoRA factors kept in float32 on a bf16 (or 4-bit) model, as peft keeps them for training, run in the base
    layer's compute dtype while the block runs: peft would otherwise cast every input to float32 and back around
    two float32 matmuls, for each adapted layer and each decoded token (Hone's fused LoRA layers cast once per step
    already; this serves peft's own path). The float32 tensors themselves are put back afterwards (the same
    tensors, so the optimizer's state and the trained values are untouched), and casts the trainer's
    `reuse_weight_casts` block made of the copies are dropped; the copies are the adapter's size. Yields how many
    factors were cast."""
    swapped: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    try:
        for module in model.modules():
            base = getattr(module, "base_layer", None)
            dtype = _compute_dtype(base) if base is not None else None
            if dtype is None:
                continue
            for factors in (getattr(module, "lora_A", None), getattr(module, "lora_B", None)):
                for factor in factors.values() if isinstance(factors, torch.nn.ModuleDict) else ():
                    weight = getattr(factor, "weight", None)
                    if isinstance(weight, torch.nn.Parameter) and weight.dtype != dtype:
                        swapped.append((weight, weight.data))
                        weight.data = weight.data.to(dtype)
        yield len(swapped)
    finally:
        for weight, data in swapped:
            weight.data = data
        forget_casts(weight for weight, _ in swapped)  # a scaled cast of a copy is not the trainer's cast


def _compute_dtype(layer) -> torch.dtype | None:
    """The dtype `layer` computes in: a 4-bit layer's compute dtype, else its floating-point weight's."""
    dtype = getattr(layer, "compute_dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    weight = getattr(layer, "weight", None)
    return weight.dtype if isinstance(weight, torch.Tensor) and weight.is_floating_point() else None


class DecodeStep:
    """One decode forward over the step buffers: eager the first time (it warms up lazy allocations and kernel
    autotuning), then captured once and replayed; eager for good if the capture fails."""

    def __init__(self, forward, token, position, masks, capture: bool):
        self.forward, self.token, self.position, self.masks = forward, token, position, masks
        self.capture = capture
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.problem: str | None = None
        self.replays = 0
        self.eager = 0

    def _eager(self) -> torch.Tensor:
        self.eager += 1
        return self.forward(self.token, self.position, self.masks)

    def run(self) -> torch.Tensor:
        if not self.capture or self.problem is not None:
            return self._eager()
        if self.graph is None:
            if self.eager == 0:  # warm-up on a side stream, as CUDA graph capture asks
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    logits = self._eager()
                torch.cuda.current_stream().wait_stream(stream)
                return logits
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.logits = self.forward(self.token, self.position, self.masks)
            except Exception as error:  # a host sync or an unsupported op inside the model's forward
                self.problem = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                torch.cuda.synchronize()
                return self._eager()
            # The first replay is checked against the eager step on the same inputs (writing the same keys and
            # values again): work launched outside the capture stream leaves a graph that computes nothing.
            graph.replay()
            captured = self.logits.float()
            eager = self._eager().float()
            # bf16 logits of the same step differ by a few units in their last place between kernels picked under
            # capture and eagerly; a graph that computed nothing differs by whole logits
            if not torch.allclose(captured, eager, rtol=0.05, atol=0.25):
                self.problem = (
                    f"the captured step differs from the eager one by {float((captured - eager).abs().max()):.3g}"
                )
                return eager
            self.graph = graph
            self.replays += 1
            return self.logits
        self.graph.replay()
        self.replays += 1
        return self.logits


def _pad_left_to(ids: torch.Tensor, mask: torch.Tensor, width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    extra = width - ids.shape[1]
    if extra <= 0:
        return ids, mask
    return (
        torch.cat([ids.new_full((ids.shape[0], extra), pad_id), ids], dim=1),
        torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], dim=1),
    )
