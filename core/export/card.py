"""Hone's model cards: the README.md beside an export that says what it is, which base it belongs to and how to load
it. The exporters write one (adapter, merged); `hone push` writes one into an export that has none (GGUF, GGUF LoRA,
Ollama) before it goes to the Hugging Face Hub.

Stdlib only: hone.core.hub.push reads this without loading torch.
"""

from __future__ import annotations

from pathlib import Path

CARD_FILE = "README.md"
ADAPTER_CARD = """---
library_name: peft
base_model: {base}
tags: [lora, hone-studio]
---
# {name}

A LoRA adapter trained with Hone Studio on `{base}`. Load it with peft:

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained("{base}")
model = PeftModel.from_pretrained(base, "path/to/this/folder")
```
"""
MERGED_CARD = """---
base_model: {base}
tags: [hone-studio, merged-lora]
---
# {name}

{base} with a LoRA adapter trained in Hone Studio merged into its weights ({type} safetensors). Load it like
any transformers model:

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```
"""
GGUF_CARD = """---
base_model: {base}
tags: [hone-studio, gguf]
---
# {name}

{base} with a LoRA adapter trained in Hone Studio merged into its weights, as one GGUF file ({type}) for llama.cpp,
LM Studio and Ollama:

```
llama-cli -m {file}
```
"""
GGUF_LORA_CARD = """---
base_model: {base}
tags: [lora, hone-studio, gguf]
---
# {name}

A LoRA adapter trained with Hone Studio on `{base}`, as a GGUF LoRA file ({type}) in llama.cpp's layout. Use it on
a GGUF of the base model:

```
llama-cli -m BASE_MODEL.gguf --lora {file}
```
"""
OLLAMA_CARD = """---
base_model: {base}
tags: [hone-studio, gguf, ollama]
---
# {name}

{base} with a LoRA adapter trained in Hone Studio merged into its weights, as a GGUF file ({type}) with an Ollama
Modelfile that carries the chat template, stop tokens and parameters:

```
ollama create {name} -f Modelfile
ollama run {name}
```
"""
CARDS = {
    "adapter": ADAPTER_CARD,
    "merged": MERGED_CARD,
    "gguf": GGUF_CARD,
    "gguf-lora": GGUF_LORA_CARD,
    "ollama": OLLAMA_CARD,
}


def model_card(fmt: str, base: str, name: str, file: str = "") -> str:
    """The card of one export.

    Args:
        fmt: the export's format with its type, as export.json records it ("adapter", "merged:bf16", "gguf:q8_0").
        base: the base model as transformers and peft load it (a Hugging Face id, or a path on the training machine).
        name: the run's name, the card's title.
        file: the GGUF file's name, for the command a GGUF card shows.
    """
    kind, _, type_ = fmt.partition(":")
    return CARDS[kind].format(base=base, name=name, type=type_ or "default type", file=file or "MODEL.gguf")


def write_model_card(folder: str | Path, fmt: str, base: str, name: str, file: str = "") -> Path:
    """Write `model_card(...)` to FOLDER/README.md and return its path."""
    path = Path(folder) / CARD_FILE
    path.write_text(model_card(fmt, base, name, file), encoding="utf-8")
    return path


# How the checkpoint section shows each score (hone.core.inference.score_store's metric names); others as given.
_SCORE_LINES = {
    "loss": ("held-out loss", "{:.4f}"),
    "perplexity": ("perplexity", "{:.4g}"),
    "exact": ("exact match", "{:.1%}"),
    "normalized": ("normalized match", "{:.1%}"),
    "f1": ("word F1", "{:.3f}"),
    "contains": ("contains the reference", "{:.1%}"),
    "json_valid": ("valid JSON (rows with a JSON reference)", "{:.1%}"),
}


def checkpoint_section(run: str, step: int, scores: dict | None = None) -> str:
    """The model card's section for an export of a saved checkpoint rather than the run's final adapter: the step,
    and its scores with the data they were computed on.

    Args:
        run: the run's name.
        step: the checkpoint's training step.
        scores: a stored score entry as a dict (hone.core.inference.score_store.ScoreEntry.as_dict): "metrics"
            {name: value or None}, "data" {"path", "sha256", "rows"}, "scored"; None when it was not scored.
    """
    lines = [
        "",
        "## Checkpoint",
        "",
        f"This export holds the adapter of run `{run}`'s checkpoint at training step {step}, not the run's final one.",
        "",
    ]
    if not scores:
        lines.append(f"It was not scored; `hone eval RUN --checkpoints {step}` scores it on held-out rows.")
        return "\n".join(lines) + "\n"
    data = scores.get("data") or {}
    lines += ["| score | value |", "|---|---|"]
    for name, value in (scores.get("metrics") or {}).items():
        label, fmt = _SCORE_LINES.get(name, (name, "{:.4g}"))
        lines.append(f"| {label} | {'n/a' if value is None else fmt.format(value)} |")
    rows, path, sha = data.get("rows", "?"), data.get("path", "?"), data.get("sha256", "?")
    when = scores.get("scored", "at an unknown time")
    lines += ["", f"Scored on {rows} held-out rows of `{path}` (sha256 `{sha}`), {when}."]
    return "\n".join(lines) + "\n"
