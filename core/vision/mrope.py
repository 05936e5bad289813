"""Qwen-VL's multimodal rope positions (3-D: time, height, width), one sequence at a time, on the CPU.

Text tokens advance all three coordinates together (0, 1, 2, ...). An image whose merged grid is t x h x w tokens
takes positions `start + (ti, hi, wi)` for each of its tokens (time, row, column), and the text after it continues
from `start + max(h, w)`. Built per sequence, so packed rows each start at 0 exactly as they would alone; that is
what lets Qwen-VL train packed (transformers builds the matching block-diagonal mask from the text positions).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mrope_positions(
    input_ids: Sequence[int], grids: Sequence[Sequence[int]], image_token_id: int, merge_size: int
) -> np.ndarray:
    """3-D rope positions of one sequence.

    Args:
        input_ids: the sequence's token ids, image placeholders expanded (length L).
        grids: (t, h, w) patch grid of each of its images, in order (the image processor's `image_grid_thw`).
        image_token_id: the image token.
        merge_size: patches merged per side into one token (`image_processor.merge_size`).

    Returns:
        int64 [3, L].

    Raises:
        ValueError: the image tokens do not add up to the grids (a row and its images disagree).
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    n = len(ids)
    out = np.empty((3, n), dtype=np.int64)
    is_image = ids == image_token_id
    cursor = 0  # next token to place
    position = 0  # next text position
    for t, h, w in grids:
        t, h, w = int(t), int(h) // merge_size, int(w) // merge_size
        start = int(np.argmax(is_image[cursor:])) + cursor if is_image[cursor:].any() else n
        count = t * h * w
        if start + count > n or not is_image[start : start + count].all():
            raise ValueError(f"an image of {t}x{h}x{w} tokens does not match the image tokens at position {start}")
        text = start - cursor
        out[:, cursor:start] = np.arange(position, position + text)
        position += text
        ti, hi, wi = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        out[0, start : start + count] = position + ti.reshape(-1)
        out[1, start : start + count] = position + hi.reshape(-1)
        out[2, start : start + count] = position + wi.reshape(-1)
        position += max(h, w)
        cursor = start + count
    if is_image[cursor:].any():
        raise ValueError(f"{int(is_image[cursor:].sum())} image tokens have no image")
    out[:, cursor:] = np.arange(position, position + n - cursor)
    return out
