"""Image references: parse what a row gives (path, URL, base64, bytes), check it opens, load it lazily.

Pillow is imported only when an image is checked or loaded. Checking decodes at reduced scale where the format
allows (JPEG draft mode), so a corrupt or truncated file is caught during validation, not mid-run.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hone.core.data.rows import IMAGE_MISSING, IMAGE_UNREADABLE, WRONG_TYPE, ImageRef, RowError, preview

# A bare string this long made only of base64 characters is taken as base64 data, not a file name (no real
# path is 200+ characters without a dot or separator run like this).
_BASE64_MIN_CHARS = 200
_BASE64_RE = re.compile(r"^[A-Za-z0-9+/=\s]+$")
_DATA_URI_RE = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)
# Side length JPEG draft decoding aims for during checks: small enough to be fast, still decodes every block.
_CHECK_DRAFT_SIDE = 64
# Seconds to wait for an image URL when the run loads it.
_URL_TIMEOUT_S = 30


def parse_image_ref(raw: Any, base_dir: Path | None, field: str) -> ImageRef:
    """Turn what a row holds for an image into an ImageRef (no file access yet).

    Args:
        raw: a path (absolute, or relative to `base_dir`), "file://" URI, http(s) URL, data URI, base64 string,
            bytes, or a dict with "bytes"/"path"/"url" (as `datasets` stores images).
        base_dir: folder for relative paths (the dataset file's folder); None = current directory.
        field: the row field, for messages.

    Raises:
        RowError(WRONG_TYPE): the value cannot name an image.
    """
    if isinstance(raw, (bytes, bytearray, memoryview)):
        if not raw:
            raise RowError(WRONG_TYPE, field, "holds 0 bytes of image data")
        return ImageRef(kind="bytes", data=bytes(raw))
    if isinstance(raw, Mapping):
        for key in ("bytes", "path", "url"):
            if raw.get(key):
                return parse_image_ref(raw[key], base_dir, field)
        raise RowError(WRONG_TYPE, field, f"is an object without bytes, path or url: {preview(raw)}")
    if not isinstance(raw, str):
        raise RowError(WRONG_TYPE, field, f"is a {type(raw).__name__}, expected a path, URL, base64 or bytes")
    text = raw.strip()
    if not text:
        raise RowError(WRONG_TYPE, field, "is an empty string, expected a path, URL, base64 or bytes")
    if _DATA_URI_RE.match(text):
        return ImageRef(kind="bytes", data=_b64decode(text.split(",", 1)[1], field))
    lowered = text.lower()
    if lowered.startswith(("http://", "https://")):
        return ImageRef(kind="url", value=text)
    if lowered.startswith("file://"):
        text = text[len("file://"):]
    elif len(text) >= _BASE64_MIN_CHARS and _BASE64_RE.match(text):
        return ImageRef(kind="bytes", data=_b64decode(text, field))
    path = Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return ImageRef(kind="path", value=str(path))


def _b64decode(text: str, field: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise RowError(WRONG_TYPE, field, "looks like base64 image data but does not decode") from None


def check_image(ref: ImageRef, field: str) -> ImageRef:
    """Open the image and decode it (at reduced scale where possible); return the ref with its size filled in.

    URLs are not fetched here (validation stays offline); they are checked when the run loads them.

    Raises:
        RowError(IMAGE_MISSING): the file does not exist.
        RowError(IMAGE_UNREADABLE): it exists but is not an image Pillow can decode (corrupt, truncated).
    """
    if ref.kind == "url":
        return ref
    if ref.kind == "path" and not Path(ref.value).is_file():
        what = "is a folder" if Path(ref.value).is_dir() else "does not exist"
        raise RowError(IMAGE_MISSING, field, f"image file {ref.value} {what}")
    from PIL import Image, UnidentifiedImageError

    try:
        with _open(ref) as image:
            size = image.size
            image.draft("RGB", (_CHECK_DRAFT_SIDE, _CHECK_DRAFT_SIDE))
            image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise RowError(IMAGE_UNREADABLE, field, f"image {ref.describe()} cannot be decoded ({e})") from None
    return ImageRef(kind=ref.kind, value=ref.value, data=ref.data, width=size[0], height=size[1])


def _open(ref: ImageRef):
    from PIL import Image

    if ref.kind == "bytes":
        return Image.open(io.BytesIO(ref.data))
    if ref.kind == "url":
        import urllib.request

        with urllib.request.urlopen(ref.value, timeout=_URL_TIMEOUT_S) as response:
            return Image.open(io.BytesIO(response.read()))
    return Image.open(ref.value)


def load_image(ref: ImageRef, max_side: int):
    """Decode the image as RGB, scaled down (aspect kept) so its longest side is at most `max_side` pixels.

    Returns:
        PIL.Image.Image in mode "RGB".
    """
    from PIL import Image

    with _open(ref) as image:
        image = image.convert("RGB")
    longest = max(image.size)
    if longest > max_side:
        scale = max_side / longest
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC)
    return image


def fitted_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The (width, height) `load_image` produces for an image of this size."""
    longest = max(width, height)
    if longest <= max_side:
        return width, height
    scale = max_side / longest
    return max(1, round(width * scale)), max(1, round(height * scale))
