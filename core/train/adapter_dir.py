"""The user-facing adapter folder: peft's files, the tokenizer with its chat template, and a model card."""

from __future__ import annotations

import json
from pathlib import Path

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

Load it with peft:

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained("{base}")
model = PeftModel.from_pretrained(base, "path/to/this/folder")
```
"""


def save_adapter(peft_model, tokenizer, folder: Path, config, *, steps: int, final_loss: float | None) -> Path:
    """Write adapter_model.safetensors + adapter_config.json (peft), tokenizer files and README.md."""
    folder = Path(folder)
    peft_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # peft records the path it loaded from (for a GGUF that is Hone's conversion cache); record what the user
    # chose instead, so the folder says which base it belongs to.
    cfg_path = folder / "adapter_config.json"
    adapter_cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    adapter_cfg["base_model_name_or_path"] = config.model.name_or_path
    cfg_path.write_text(json.dumps(adapter_cfg, indent=2), encoding="utf-8")
    lora = config.lora
    (folder / "README.md").write_text(MODEL_CARD.format(
        base=config.model.name_or_path, name=folder.parent.name, data=", ".join(config.data.train),
        steps=steps, loss="n/a" if final_loss is None else f"{final_loss:.4f}", r=lora.r, alpha=lora.alpha,
        dropout=lora.dropout, targets=", ".join(lora.targets), rslora=", rsLoRA" if lora.rslora else ""),
        encoding="utf-8")
    return folder
