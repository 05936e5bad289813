"""A stand-in for a transformers processor where the real one cannot be built: the Qwen-VL processors also hold a
video processor, which needs torchvision even when no video is ever used. Hone trains on images and text only, so
this class holds what training uses (the tokenizer, the image processor, the image placeholder and how many tokens
an image becomes) and follows the same calling convention, so the data layer and the collator treat both alike.

Only families listed in `PLACEHOLDER_RULES` get one; the rule is the Qwen processor's own
(`image_grid_thw.prod() // merge_size**2` copies of `<|image_pad|>` per image).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _qwen_replacement(processor: ImageTextProcessor, image_inputs: dict, index: int) -> str:
    merge = processor.image_processor.merge_size
    tokens = int(image_inputs["image_grid_thw"][index].prod()) // (merge * merge)
    return processor.image_token * tokens


# model_type -> (placeholder token, replacement rule)
PLACEHOLDER_RULES: dict[str, tuple[str, Callable[[Any, dict, int], str]]] = {
    "qwen2_vl": ("<|image_pad|>", _qwen_replacement),
    "qwen2_5_vl": ("<|image_pad|>", _qwen_replacement),
    "qwen3_vl": ("<|image_pad|>", _qwen_replacement),
    "qwen3_vl_moe": ("<|image_pad|>", _qwen_replacement),
}

CHAT_TEMPLATE_FILE = "chat_template.jinja"


class ImageTextProcessor:
    """Tokenizer + image processor + the family's placeholder rule, called like a transformers processor.

    Attributes:
        tokenizer: the text tokenizer.
        image_processor: a transformers image processor (the Pillow backend works without torchvision).
        image_token: the placeholder the chat template writes for each image.
        chat_template: the conversation template with image parts (None: the tokenizer's).
        model_type: whose rule this is.
    """

    def __init__(self, tokenizer, image_processor, model_type: str, chat_template: str | None = None):
        if model_type not in PLACEHOLDER_RULES:
            raise ValueError(f"no image placeholder rule for model type {model_type!r}")
        self.tokenizer, self.image_processor, self.model_type = tokenizer, image_processor, model_type
        self.image_token, self._replacement = PLACEHOLDER_RULES[model_type]
        self.image_token = getattr(tokenizer, "image_token", None) or self.image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)

    def __call__(
        self,
        text: list[str] | str | None = None,
        images: list | None = None,
        *,
        add_special_tokens: bool = True,
        return_tensors: str | None = None,
        **kwargs,
    ) -> dict:
        """Image inputs for `images` (a flat list, in placeholder order) and the ids of `text` with each placeholder
        replaced by its image's tokens, like the transformers processors do."""
        out: dict[str, Any] = {}
        replacements: list[str] = []
        if images:
            image_inputs = self.image_processor(images=list(images), return_tensors="pt")
            out.update(image_inputs)
            replacements = [self._replacement(self, image_inputs, i) for i in range(len(images))]
        if text is not None:
            texts = [text] if isinstance(text, str) else list(text)
            queue = iter(replacements)
            expanded = []
            for sample in texts:
                parts = sample.split(self.image_token)
                pieces = [parts[0]]
                for part in parts[1:]:
                    try:
                        pieces.append(next(queue))
                    except StopIteration:
                        raise ValueError(f"more {self.image_token} placeholders than images") from None
                    pieces.append(part)
                expanded.append("".join(pieces))
            if next(queue, None) is not None:
                raise ValueError(f"more images than {self.image_token} placeholders")
            out.update(self.tokenizer(expanded, add_special_tokens=add_special_tokens, return_tensors=return_tensors))
        return out

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, **kwargs)

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)

    def save_pretrained(self, folder: str | Path) -> None:
        """Tokenizer files, the image processor's config and the chat template (the files AutoProcessor reads)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(folder)
        self.image_processor.save_pretrained(folder)
        if self.chat_template:
            (folder / CHAT_TEMPLATE_FILE).write_text(self.chat_template, encoding="utf-8")


def read_chat_template(folder: str | Path) -> str | None:
    """The processor chat template saved in a model folder (chat_template.jinja or .json), if any."""
    folder = Path(folder)
    jinja = folder / CHAT_TEMPLATE_FILE
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    as_json = folder / "chat_template.json"
    if as_json.is_file():
        return json.loads(as_json.read_text(encoding="utf-8")).get("chat_template")
    return None


def load_image_processor(folder: str, **kwargs):
    """The image processor a model folder (or hub id) names, on the Pillow backend where transformers has one (its
    AutoImageProcessor needs torchvision on transformers 5.17)."""
    import transformers
    from transformers.image_processing_base import ImageProcessingMixin

    config, _ = ImageProcessingMixin.get_image_processor_dict(folder, **kwargs)
    name = config.get("image_processor_type") or ""
    for candidate in (name if name.endswith("Pil") else name + "Pil", name.removesuffix("Fast")):
        cls = getattr(transformers, candidate, None) if candidate else None
        if cls is not None:
            try:
                return cls.from_pretrained(folder, **kwargs)
            except ImportError:
                continue
    raise ValueError(f"{folder} names image processor {name!r}, which this transformers cannot build here")


def build_fallback_processor(folder: str, model_type: str, **kwargs) -> ImageTextProcessor:
    """An ImageTextProcessor from a model folder's tokenizer, image processor config and chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    image_processor = load_image_processor(folder, **kwargs)
    template = read_chat_template(folder) if Path(folder).is_dir() else None
    return ImageTextProcessor(tokenizer, image_processor, model_type, chat_template=template)
