"""Base + adapter -> one merged float32 model, checked against the unmerged base + adapter.

Shared by the merged, gguf and ollama exports. A QLoRA run trained its adapter on 4-bit nf4 weights, so its base
is put through the same nf4 round trip (`qlora_round_trip`) before merging: the merged model then computes what
the trained model computed, not what an adapter on the full-precision weights would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hone.core.errors import INSTALL_BITSANDBYTES
from hone.core.export.checks import CheckLog, compare_logits, logits_of, probe_ids
from hone.core.export.formats import ExportError
from hone.core.export.source import RunSource

# fp32 merge: (W + s·BA)x and Wx + s·B(Ax) differ only by float32 reassociation, ~1e-6 of the logits; a wrong
# merge (missing module, wrong scale) is off by the adapter's whole effect.
MERGE_TOLERANCE = 1e-4


@dataclass
class Merged:
    """A merged model and what it was checked against.

    Attributes:
        model: the merged transformers model, float32, CPU, eval mode.
        tokenizer: the run's tokenizer (from the adapter folder).
        loaded: hone.core.models.load.LoadedModel of the base (folder, source; its model is `model` now).
        ids: probe token ids, (1, T) int64.
        reference_logits: base + adapter (unmerged peft forward), (T, V) float32.
        merged_logits: the merged model's logits, (T, V) float32.
    """

    model: Any
    tokenizer: Any
    loaded: Any
    ids: Any
    reference_logits: Any
    merged_logits: Any


def qlora_round_trip(model, dtype_name: str) -> int:
    """Replace every Linear weight QLoRA would quantize (all but the LM head) by its nf4 round trip.

    The weight is cast to the QLoRA compute dtype, quantized to nf4 with double quantization as bitsandbytes' CUDA
    kernels quantized it for training (`nf4_quantize_reference`, not bitsandbytes' CPU quantizer), dequantized
    with Hone's nf4 reference, which the kernel training ran matches bit for bit, and cast back to float32. Returns
    the number of weights changed.
    """
    import torch

    try:
        import bitsandbytes.functional as bnbf
    except ImportError:
        raise ExportError(
            "this run trained with QLoRA; merging it needs bitsandbytes to reproduce the 4-bit base",
            INSTALL_BITSANDBYTES,
        ) from None
    from hone.kernels.reference import nf4_quantize_reference

    dtype = torch.float16 if dtype_name == "float16" else torch.bfloat16
    scale_code = bnbf.create_dynamic_map().float()
    output = model.get_output_embeddings()
    count = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module is not output:
            w = module.weight.data.to(dtype)
            module.weight.data = nf4_quantize_reference(w, scale_code).dequantize(dtype).to(torch.float32)
            count += 1
    return count


def merge_run(run: RunSource, log: CheckLog, steps=None) -> Merged:
    """Load the base, apply the run's adapter, merge it, and check merged logits == base + adapter logits.

    Records under "merge.*": the adapter's effect on the logits (how much there is to get right) and the merged
    model's difference from base + adapter.
    """
    from peft import PeftModel

    loaded = run.load_base()
    tokenizer = run.tokenizer(fallback=loaded.tokenizer)
    model = loaded.model
    if run.config.lora.qlora:
        changed = qlora_round_trip(model, run.config.model.dtype)
        log.note("merge.qlora_base", f"{changed} linear weights put through the nf4 round trip before merging")
    if steps:
        steps.within(0.4)
    peft_model = PeftModel.from_pretrained(model, run.adapter_dir)
    peft_model.eval()
    ids = probe_ids(tokenizer)
    reference = logits_of(peft_model, ids)
    with peft_model.disable_adapter():
        base_logits = logits_of(peft_model, ids)
    effect = (reference - base_logits).abs().max().item()
    log.note("merge.adapter_effect.max_abs_diff", effect)
    if effect == 0.0:
        log.note("merge.warning", "the adapter does not change the logits at all (were its B matrices trained?)")
    if steps:
        steps.within(0.7)
    merged = peft_model.merge_and_unload()
    merged.eval()
    merged_logits = logits_of(merged, ids)
    compare_logits(
        log, "merge.logits", merged_logits, reference, MERGE_TOLERANCE, "merged model vs base + adapter logits"
    )
    return Merged(
        model=merged,
        tokenizer=tokenizer,
        loaded=loaded,
        ids=ids,
        reference_logits=reference,
        merged_logits=merged_logits,
    )
