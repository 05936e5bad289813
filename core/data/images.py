"""Image references: parse what a row gives (path, URL, base64, bytes), make each ready once, load it scaled.

The check runs while the data is read, before training, and does the expensive work once (`ImageStore`): a URL is
fetched into the data cache (hone.core.data.fetch), every image is decoded, at reduced scale where the format allows
(JPEG draft mode), so a corrupt or truncated file is caught then and not mid-run, and an image far larger than
data.image_max_side is decoded once and kept in the data cache at the size the model needs. Loading (each training
step) then decodes a local file, again at reduced scale where it can. Images past Pillow's decompression-bomb limit
are refused as unreadable. Pillow is imported only when an image is checked or loaded.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hone.core.data.rows import (
    IMAGE_MISSING,
    IMAGE_NOT_FETCHED,
    IMAGE_UNREADABLE,
    WRONG_TYPE,
    ImageRef,
    RowError,
    preview,
)

if TYPE_CHECKING:  # imported on the first URL only (urllib, TLS)
    from hone.core.data.fetch import UrlFetcher

# A bare string this long made only of base64 characters is taken as base64 data, not a file name (no real
# path is 200+ characters without a dot or separator run like this).
_BASE64_MIN_CHARS = 200
_BASE64_RE = re.compile(r"^[A-Za-z0-9+/=\s]+$")
_DATA_URI_RE = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)
# Side length JPEG draft decoding aims for during checks: small enough to be fast, still decodes every block.
_CHECK_DRAFT_SIDE = 64
# Images with more pixels than this are decoded once, during the check, and kept in the data cache scaled to
# data.image_max_side (as PNG, so nothing more is lost). Decoding one costs at least 48 MB and a large share of a
# second on every use (formats other than JPEG have no reduced-scale decoding); below it (a 12-megapixel phone photo)
# each use decodes the image itself at reduced scale, and the dataset is not copied to disk.
KEEP_REDUCED_PIXELS = 16_000_000
# Shrinking by whole-pixel averaging (Image.reduce) first, down to this multiple of the final size, before the bicubic
# resize: as fast as a plain reduce, as smooth as a bicubic resize from the full image (Pillow's thumbnail default).
_REDUCING_GAP = 2.0
# Note key for rows whose image paths lead outside their data file's folder (the report prints "N rows <key>").
OUTSIDE_DATA_FOLDER = "read an image from outside the data file's folder"


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
        text = text[len("file://") :]
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


class ImageStore:
    """Makes a split's images ready during the data check, once, in the data cache (see the module docstring).

    Per-split state lives here (the URL fetcher remembers URLs that failed), so two splits or two runs in one process
    never share it. The fetcher (urllib, TLS) is imported on the first URL only.

    Args:
        folder: the data cache (`cache_root("datasets")` or the run's cache_dir); fetched URLs go to folder/urls,
            reduced copies of very large images to folder/images.
        max_side: data.image_max_side, the longest side images are scaled to.
        allow_private_urls: data.allow_private_urls.
    """

    def __init__(self, folder: Path, max_side: int, *, allow_private_urls: bool = False):
        self.folder, self.max_side, self.allow_private_urls = Path(folder), max_side, allow_private_urls
        self._fetcher: UrlFetcher | None = None

    def check(self, ref: ImageRef, field: str) -> ImageRef:
        """`check_image` with this store: a URL is fetched first, a very large image is kept reduced.

        Raises:
            RowError(IMAGE_NOT_FETCHED): a URL was refused or failed (the message gives the URL and why).
            RowError(IMAGE_MISSING / IMAGE_UNREADABLE): as `check_image`.
        """
        return check_image(ref, field, self)

    def fetch(self, ref: ImageRef, field: str) -> str:
        """The local copy of a URL image (fetched now unless an earlier row or run did)."""
        from hone.core.data.fetch import FetchError, UrlFetcher

        if self._fetcher is None:
            self._fetcher = UrlFetcher(self.folder / "urls", allow_private=self.allow_private_urls)
        try:
            return str(self._fetcher.fetch(ref.value))
        except FetchError as e:
            raise RowError(IMAGE_NOT_FETCHED, field, f"image URL {ref.value} was not fetched: {e}") from None

    def keep_reduced(self, ref: ImageRef, image) -> str:
        """The path of `image` (opened, not yet decoded) scaled to max_side and saved in the data cache, decoding it
        only when no earlier check saved it; "" when it cannot be saved (then each use decodes the original)."""
        target = self.folder / "images" / f"{_identity(ref, self.max_side)}.png"
        if target.is_file():
            return str(target)
        fitted = fit_image(image, self.max_side)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(prefix=f".{target.stem}-", suffix=".png", dir=target.parent)
            try:
                with os.fdopen(handle, "wb") as out:
                    fitted.save(out, format="PNG")
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            return ""
        return str(target)


def _identity(ref: ImageRef, max_side: int) -> str:
    """A key that changes when the image or the size it is reduced to changes."""
    if ref.kind == "path":
        stat = os.stat(ref.value)
        what = f"path|{ref.value}|{stat.st_size}|{stat.st_mtime_ns}"
    elif ref.kind == "url":
        what = f"url|{ref.value}"
    else:
        what = f"bytes|{hashlib.blake2b(ref.data, digest_size=16).hexdigest()}"
    return hashlib.blake2b(f"{what}|{max_side}".encode(), digest_size=16).hexdigest()


def check_image(ref: ImageRef, field: str, store: ImageStore | None = None) -> ImageRef:
    """Open the image and decode it (at reduced scale where possible); return the ref with its size filled in.

    With a store (the data pipeline always gives one) a URL is fetched into the data cache first, and an image of
    more than KEEP_REDUCED_PIXELS pixels is decoded once at reduced scale and kept; the returned ref's `cached`
    names the file that loading reads. Without one, URLs are returned unchecked (and cannot be loaded).

    Raises:
        RowError(IMAGE_MISSING): the file does not exist.
        RowError(IMAGE_UNREADABLE): it exists but is not an image Pillow can decode (corrupt, truncated, or past
            Pillow's decompression-bomb limit).
        RowError(IMAGE_NOT_FETCHED): a URL was refused or failed.
    """
    if ref.kind == "url" and store is None:
        return ref
    if ref.kind == "path" and not Path(ref.value).is_file():
        what = "is a folder" if Path(ref.value).is_dir() else "does not exist"
        raise RowError(IMAGE_MISSING, field, f"image file {ref.value} {what}")
    cached = store.fetch(ref, field) if ref.kind == "url" and store is not None else ""  # a URL has a store here
    from PIL import Image, UnidentifiedImageError

    try:
        with _open(replace(ref, cached=cached)) as image:
            size = image.size
            if store is not None and size[0] * size[1] > KEEP_REDUCED_PIXELS:
                cached = store.keep_reduced(ref, image) or cached
            else:
                image.draft("RGB", (_CHECK_DRAFT_SIDE, _CHECK_DRAFT_SIDE))
                image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise RowError(IMAGE_UNREADABLE, field, f"image {ref.describe()} cannot be decoded ({e})") from None
    return replace(ref, width=size[0], height=size[1], cached=cached)


def reads_outside(ref: ImageRef, folder: Path) -> bool:
    """Whether a local image path leads outside `folder` (through "..", an absolute path or a symlink)."""
    if ref.kind != "path":
        return False
    return not Path(ref.value).resolve().is_relative_to(folder.resolve())


def _open(ref: ImageRef):
    from PIL import Image

    if ref.cached:
        return Image.open(ref.cached)
    if ref.kind == "bytes":
        return Image.open(io.BytesIO(ref.data))
    if ref.kind == "url":
        raise OSError(f"image URL {ref.value} was not fetched by the data check (it has no copy in the data cache)")
    return Image.open(ref.value)


def load_image(ref: ImageRef, max_side: int):
    """Decode the image as RGB, scaled down (aspect kept) so its longest side is at most `max_side` pixels.

    Reads `ref.cached` when the check left one (a fetched URL, or a very large image already scaled), else the image
    itself, decoding at reduced scale where the format allows (see `fit_image`).

    Returns:
        PIL.Image.Image in mode "RGB", of size fitted_size(width, height, max_side).
    """
    with _open(ref) as image:
        return fit_image(image, max_side)


def fit_image(image, max_side: int):
    """Decode an opened (not yet loaded) image as RGB at fitted_size(..., max_side), decoding no more than needed.

    JPEG decodes directly at the smallest power-of-two scale (1/2 to 1/8) still at least that size (draft mode);
    other formats decode in full. The rest of the way is whole-pixel averaging (Image.reduce) down to twice the
    target, then a bicubic resize.
    """
    from PIL import Image

    target = fitted_size(image.width, image.height, max_side)
    if target != image.size:
        image.draft("RGB", target)
    rgb = image.convert("RGB")
    if rgb.size != target:
        rgb = rgb.resize(target, Image.Resampling.BICUBIC, reducing_gap=_REDUCING_GAP)
    return rgb


def fitted_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The (width, height) `load_image` produces for an image of this size."""
    longest = max(width, height)
    if longest <= max_side:
        return width, height
    scale = max_side / longest
    return max(1, round(width * scale)), max(1, round(height * scale))
