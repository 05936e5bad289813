"""`merged`: the LoRA merged into the base, saved as 16-bit safetensors shards with config and tokenizer.

Checks, each against an independent reference:
- the merged float32 model's logits equal the unmerged base + adapter logits (merge.py);
- the saved folder, reloaded by transformers, computes exactly what the in-memory merged model computes after
  rounding its weights to the 16-bit type (so the files hold every weight, tied embeddings included);
- the rounding itself moves the logits by no more than the type's tolerance (reported);
- the saved tokenizer keeps the chat template and encodes the probe the same way.
"""

from __future__ import annotations

from hone.core.export.adapter import check_tokenizer_copy
from hone.core.export.card import write_model_card
from hone.core.export.checks import CheckLog, compare_logits, logits_of, quiet_transformers
from hone.core.export.formats import ExportResult, ExportSpec
from hone.core.export.merge import merge_run
from hone.core.export.source import Progress, Steps, check_space, finish, open_run, output_folder, staged
from hone.core.models.hub_kernels import from_pretrained_options
from hone.core.train.adapter_dir import base_model

# The largest safetensors file written; transformers' own default, so hub tooling sees the usual layout.
MAX_SHARD_SIZE = "5GB"
# Relative logit change from rounding float32 weights to 16 bits: bf16 keeps 8 mantissa bits (relative step
# 2^-8), f16 11 bits (2^-11); measured on tiny models and SmolLM2-135M well inside these.
ROUNDING_TOLERANCE = {"bf16": 5e-2, "f16": 1e-2}


def default_merged_type(run) -> str:
    """f16 when the run or the base checkpoint says float16, else bf16 (reads the base's config only)."""
    from hone.core.models.load import load_config

    if run.config.model.dtype == "float16":
        return "f16"
    _, _, config = load_config(run.config.model)
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return "f16" if str(stored).replace("torch.", "") == "float16" else "bf16"


def export_merged(
    run_dir, out=None, *, dtype: str | None = None, force: bool = False, progress: Progress | None = None
) -> ExportResult:
    """Merge the run's adapter into its base and save it as 16-bit safetensors with config and tokenizer.

    Args:
        run_dir: a run folder with an adapter.
        out: output folder; default RUN_DIR/exports/merged-<dtype>.
        dtype: "bf16" or "f16"; None = f16 if the base is float16, else bf16.
        force: replace an existing output folder written by an earlier export.
        progress: called as progress(stage, fraction done).
    """
    import torch
    from transformers import AutoModelForCausalLM

    run = open_run(run_dir)
    steps = Steps(progress, {"loading and merging": 3, "saving safetensors": 2, "checking the saved model": 3})
    dtype = dtype or default_merged_type(run)
    spec = ExportSpec("merged", dtype)
    out = output_folder(run, spec, out, force)
    log = CheckLog()
    with staged(out, run.run_dir) as folder, quiet_transformers():
        steps.start("loading and merging")
        merged = merge_run(run, log, steps)
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
        model = merged.model
        with torch.no_grad():  # round the weights (not the float32 rotary buffers) to what the files will hold
            for param in model.parameters():
                param.copy_(param.to(torch_dtype))
        rounded_logits = logits_of(model, merged.ids)
        steps.start("saving safetensors")
        check_space(folder, sum(p.numel() for p in model.parameters()) * 2)  # 16-bit weights, tied ones once
        model.to(torch_dtype)
        model.config.dtype = torch_dtype
        model.save_pretrained(folder, max_shard_size=MAX_SHARD_SIZE)
        merged.tokenizer.save_pretrained(folder)
        write_model_card(folder, spec.label, base_model(run.config.model).name, run.name)
        steps.start("checking the saved model")
        del model, merged.model
        reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **from_pretrained_options()).eval()
        compare_logits(
            log,
            "merged.reload.logits",
            logits_of(reloaded, merged.ids),
            rounded_logits,
            1e-6,
            "reloaded merged model vs the in-memory merged model",
        )
        compare_logits(
            log,
            "merged.rounding.logits",
            rounded_logits,
            merged.reference_logits,
            ROUNDING_TOLERANCE[dtype],
            f"{dtype} merged model vs base + adapter logits",
        )
        tied = bool(getattr(reloaded.config, "tie_word_embeddings", False))
        if tied:
            same = (
                reloaded.get_output_embeddings().weight.data_ptr() == reloaded.get_input_embeddings().weight.data_ptr()
            )
            log.require("merged.tied_embeddings", same, "the reloaded model's LM head is not tied to its embeddings")
        steps.within(0.6)
        check_tokenizer_copy(log, "merged.tokenizer", merged.tokenizer, folder)
        result = finish(folder, out, run, spec, log)
    steps.done()
    return result
