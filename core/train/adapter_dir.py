"""The user-facing adapter folder: peft's files, the tokenizer with its chat template, and a model card."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from hone.core.resources import BUNDLED_MODELS, BUNDLED_PREFIX

MODEL_CARD = """---
library_name: peft
base_model: {base}
tags: [lora, hone-studio]
---
# {name}

A LoRA adapter trained with Hone Studio.

| | |
|---|---|
| base model | `{base}` |
| data | {data} |
| steps | {steps} |
| final training loss | {loss} |
| LoRA | r={r}, alpha={alpha}, dropout={dropout}, targets={targets}{rslora} |
{remark}
Load it with peft:

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained("{base}")
model = PeftModel.from_pretrained(base, "path/to/this/folder")
```
"""


@dataclass(frozen=True)
class BaseModel:
    """How an adapter names its base outside Hone.

    Attributes:
        name: a Hugging Face id or an absolute path, what `from_pretrained` takes (adapter_config.json's
            `base_model_name_or_path`, the model card's `base_model`).
        remark: a paragraph for the model card: where the training weights came from, or a warning.
        local: True when `name` is a path on this machine (the adapter loads elsewhere only with the base copied).
    """

    name: str
    remark: str = ""
    local: bool = False


def base_model(model_cfg) -> BaseModel:
    """The base an adapter trained from `model_cfg` (a ModelConfig) belongs to, named so transformers + peft load
    it without Hone: a bundled model's Hub id, a Hub id as given, else the absolute path of the folder or file."""
    name = model_cfg.name_or_path.strip()
    if name.startswith(BUNDLED_PREFIX) and name[len(BUNDLED_PREFIX) :] in BUNDLED_MODELS:
        hub_id = BUNDLED_MODELS[name[len(BUNDLED_PREFIX) :]]
        return BaseModel(
            hub_id,
            f"\nTrained from the GGUF of `{hub_id}` that Hone bundles ({name}), dequantized to "
            "float32; the adapter applies to the original weights below, which differ from that GGUF "
            "only by its quantization.\n",
        )
    path = Path(name).expanduser()
    if not path.exists():
        return BaseModel(name)  # a Hugging Face id
    absolute = str(path.resolve())
    return BaseModel(
        absolute,
        f"\n**Warning:** the base is a {'GGUF file' if path.is_file() else 'folder'} on "
        f"the machine that trained this adapter (`{absolute}`), so the code below works only on this "
        "machine. Elsewhere, set `base_model_name_or_path` in adapter_config.json to where that model "
        "is (its Hugging Face id, if it came from the Hub).\n",
        local=True,
    )


def save_adapter(peft_model, tokenizer, folder: Path, config, *, steps: int, final_loss: float | None) -> Path:
    """Write adapter_model.safetensors + adapter_config.json (peft), tokenizer files and README.md into a folder
    beside `folder`, then put it in place of `folder`: an adapter saved before (a stopped run resumed) stays whole
    until the new one is.

    Raises:
        HoneError: the disk is full (nothing of the new adapter is left, the old one is as it was).
    """
    from hone.core.train.run_dir import disk_full_error, is_disk_full

    folder = Path(folder)
    staging = folder.with_name(f".tmp-{folder.name}")
    shutil.rmtree(staging, ignore_errors=True)  # a save a kill cut short
    try:
        _write_adapter(peft_model, tokenizer, staging, config, steps=steps, final_loss=final_loss)
        _put_in_place(staging, folder)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(e):
            raise disk_full_error(e, "the adapter", folder.parent) from e
        raise
    return folder


def _put_in_place(staging: Path, folder: Path) -> None:
    """Rename `staging` to `folder`; an existing `folder` is set aside first and removed once the new one is in."""
    aside = folder.with_name(f".old-{folder.name}")
    shutil.rmtree(aside, ignore_errors=True)
    if folder.exists():
        folder.rename(aside)
    staging.rename(folder)
    shutil.rmtree(aside, ignore_errors=True)


def _write_adapter(peft_model, tokenizer, folder: Path, config, *, steps: int, final_loss: float | None) -> None:
    peft_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # peft records the path it loaded from (for a GGUF that is Hone's conversion cache); record the base as
    # transformers and peft can load it outside Hone instead.
    base = base_model(config.model)
    cfg_path = folder / "adapter_config.json"
    adapter_cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    adapter_cfg["base_model_name_or_path"] = base.name
    cfg_path.write_text(json.dumps(adapter_cfg, indent=2), encoding="utf-8")
    lora = config.lora
    (folder / "README.md").write_text(
        MODEL_CARD.format(
            base=base.name,
            name=folder.parent.name,
            data=", ".join(config.data.train),
            remark=base.remark,
            steps=steps,
            loss="n/a" if final_loss is None else f"{final_loss:.4f}",
            r=lora.r,
            alpha=lora.alpha,
            dropout=lora.dropout,
            targets=", ".join(lora.targets),
            rslora=", rsLoRA" if lora.rslora else "",
        ),
        encoding="utf-8",
    )
