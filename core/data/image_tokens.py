"""What one image placeholder becomes in the token stream, asked of the model's own processor.

Rather than re-deriving each family's rule, the processor is run once on a blank image of the same (already
size-limited) size, with the placeholder as the only text, and its token ids are the expansion; results are
cached per image shape, so a dataset of many sizes costs one processor call per distinct shape, not per image.
Importing this module is light (numpy); Pillow loads on the first expansion.
"""

from __future__ import annotations

import numpy as np

from hone.core.data.images import fitted_size


class ImageExpansion:
    """The placeholder token of a vision processor and, per image size, the token ids it expands to.

    Chat templates write one placeholder per image (`<image>`, `<|image_pad|>`, Gemma 3's `<start_of_image>`); the
    processor replaces it by a sequence that depends on the image's size: a run of image tokens (Qwen, LLaVA), the
    run wrapped in markers (Gemma 3: `\\n\\n<start_of_image>` + 256 x `<image_soft_token>` + `<end_of_image>\\n\\n`),
    or a grid of tiles with row/column tags and a global view (Idefics3 / SmolVLM).

    Attributes:
        processor: a transformers processor (or hone.core.vision.processor.ImageTextProcessor).
        token: the placeholder string the chat template writes for each image.
        token_id: its id.
        max_side: images are scaled to this longest side before the processor sees them (data.image_max_side).
    """

    def __init__(self, processor, token: str, token_id: int, max_side: int):
        self.processor, self.token, self.token_id, self.max_side = processor, token, token_id, max_side
        self._cache: dict[tuple, np.ndarray] = {}

    def expand(self, width: int, height: int) -> np.ndarray:
        """int64 [n] token ids that replace the placeholder for an image of this size (before the size limit)."""
        w, h = fitted_size(width or self.max_side, height or self.max_side, self.max_side)
        key = self._shape_key(w, h)
        if key not in self._cache:
            self._cache[key] = self._run_processor(w, h)
        return self._cache[key]

    def count(self, width: int, height: int) -> int:
        """Tokens an image of this size becomes."""
        return len(self.expand(width, height))

    def _shape_key(self, w: int, h: int) -> tuple:
        """What decides the expansion ("image shape" as the processor itself counts it): the processor's own token
        and patch counts where it can say, else the size."""
        counter = getattr(self.processor, "_get_num_multimodal_tokens", None)
        patches = getattr(getattr(self.processor, "image_processor", None), "get_number_of_image_patches", None)
        if counter is None or patches is None:
            return ("size", w, h)
        try:
            info = counter(image_sizes=[(h, w)])
            tokens = info["num_image_tokens"] if isinstance(info, dict) else info.num_image_tokens
            grid = patches(h, w, {})
        except (TypeError, ValueError, KeyError, AttributeError):
            return ("size", w, h)
        return ("shape", int(tokens[0]), tuple(grid) if isinstance(grid, (tuple, list)) else int(grid))

    def _run_processor(self, w: int, h: int) -> np.ndarray:
        from PIL import Image

        blank = Image.new("RGB", (w, h), (127, 127, 127))
        out = self.processor(text=[self.token], images=[blank], add_special_tokens=False)
        ids = out["input_ids"][0]
        return np.asarray(ids.tolist() if hasattr(ids, "tolist") else ids, dtype=np.int64)

    def fingerprint(self) -> str:
        """Changes whenever the expansion rule could: the placeholder and the processor's class."""
        return f"{self.token}|{type(self.processor).__name__}|expand-v1"


def image_expansion_for(processor, max_side: int) -> ImageExpansion | None:
    """The ImageExpansion of a vision processor (None when it has no image placeholder)."""
    token = getattr(processor, "image_token", None)
    if token is None:
        return None
    return ImageExpansion(processor, token, processor.tokenizer.convert_tokens_to_ids(token), max_side)
