"""Rows of the methods that train on text only (dpo, simpo, orpo, kto, grpo): an image in one is refused with its
place named, so that no row is trained without the image its writer gave it."""

from __future__ import annotations

from typing import Any

from hone.core.data.formats import ColumnNames
from hone.core.data.rows import RowError

IMAGE_IN_TEXT_ONLY_ROW = "image in a text-only method's row"
_IMAGES_ADVICE = (
    "holds an image; dpo, simpo, orpo, kto and grpo train on text only, so the row would be trained without it: "
    "remove the images, or train image rows with train.method = sft"
)


def refuse_images(record: dict, columns: ColumnNames, sides: dict[str, Any]) -> None:
    """Raise RowError naming the first image of a row of a text-only method (preference, GRPO): in its images
    column, or a part of a message in `sides` (canonical name -> its normalized messages, numbered as the user wrote
    them). Such a row is skipped with that said, never trained without its image."""
    if record.get(columns["images"]):
        raise RowError(IMAGE_IN_TEXT_ONLY_ROW, columns["images"], _IMAGES_ADVICE)
    for canonical, messages in sides.items():
        for i, message in enumerate(messages if isinstance(messages, list) else ()):
            content = message.get("content")
            for j, part in enumerate(content if isinstance(content, list) else ()):
                if isinstance(part, dict) and part.get("type") == "image":
                    raise RowError(IMAGE_IN_TEXT_ONLY_ROW, f"{columns[canonical]}[{i}].content[{j}]", _IMAGES_ADVICE)
