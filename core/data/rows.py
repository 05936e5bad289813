"""The row model: what one dataset row becomes after reading and before tokenizing.

Every row the user gave ends as exactly one of: a `Row` (usable: a conversation or a plain text, with its image
references), or a `RowProblem` (skipped: a short reason for the report's counts plus a message naming the file,
row and field). Nothing in between, so the report can account for every row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Skip reasons: short, stable keys for DatasetReport.skipped (the GUI groups by them).
INVALID_JSON = "invalid JSON"
TOO_DEEP = "nested too deeply"
INVALID_UTF8 = "invalid UTF-8"
NOT_AN_OBJECT = "not an object"
BAD_RECORD = "malformed record"
MISSING_FIELD = "missing field"
WRONG_TYPE = "wrong type"
EMPTY_CONVERSATION = "empty conversation"
EMPTY_CONTENT = "empty content"
UNKNOWN_ROLE = "unknown role"
NO_ASSISTANT = "no assistant turn"
TURN_ORDER = "malformed turn order"
UNKNOWN_FORMAT = "unknown format"
DUPLICATE_COLUMN = "duplicate column"
IMAGE_MISSING = "image missing"
IMAGE_UNREADABLE = "image unreadable"
IMAGE_NOT_FETCHED = "image URL not fetched"
IMAGE_MISMATCH = "image placeholder mismatch"
TEXT_ONLY_MODEL = "image row for a text-only model"
TEMPLATE_ERROR = "chat template error"
TOKENIZER_ERROR = "tokenizer error"
TOO_SLOW = "too slow to tokenize"
TOO_LONG = "longer than max_length"
NO_TRAINED_TOKENS = "no trained tokens"
EMPTY_TEXT = "empty text"
# File-level problems (the file's rows could not be read at all); listed in DatasetReport.problems.
EMPTY_FILE = "empty file"
UNREADABLE_FILE = "unreadable file"

ROLES = ("system", "user", "assistant", "tool")
# Other names for the roles, as ShareGPT-style and assorted exports spell them.
ROLE_ALIASES = {
    "human": "user",
    "gpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "chatgpt": "assistant",
    "ai": "assistant",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
}


@dataclass(frozen=True)
class ImageRef:
    """Where one image of a row comes from; nothing is decoded until it is checked (see hone.core.data.images).

    Attributes:
        kind: "path" (a local file), "url" (http(s), fetched once by the data check), or "bytes".
        value: the absolute path or URL for "path"/"url"; "" for "bytes".
        data: the encoded image (PNG, JPEG, ...) for "bytes", decoded from base64 or taken from a bytes column.
        width, height: pixel size once known (read from the file header during validation), else 0.
        cached: a file in the data cache that loading reads instead: a URL's fetched bytes, or a very large image
            already scaled to data.image_max_side; "" = read the image itself.
    """

    kind: str
    value: str = ""
    data: bytes = b""
    width: int = 0
    height: int = 0
    cached: str = ""

    def describe(self) -> str:
        """A short human name for messages: the path or URL, or "<N bytes>"."""
        return self.value if self.kind != "bytes" else f"<{len(self.data)} bytes>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "value": self.value,
            "data": self.data.hex(),
            "width": self.width,
            "height": self.height,
            "cached": self.cached,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ImageRef:
        return cls(
            kind=d["kind"],
            value=d["value"],
            data=bytes.fromhex(d["data"]),
            width=d["width"],
            height=d["height"],
            cached=d.get("cached", ""),
        )


@dataclass
class Row:
    """One usable row, normalized.

    Attributes:
        source: "file:row" with a 1-based row number (for files) or "dataset[split]:row".
        messages: the conversation as [{"role": ..., "content": str | list of parts}], roles normalized to
            system/user/assistant/tool; parts are {"type": "text", "text": ...} or {"type": "image"}.
            None for plain-text rows.
        text: the plain text of a `text` row (continued pretraining); None for conversations.
        images: the row's images, in the order their {"type": "image"} parts appear.
        format: the format the row was read as ("messages", "sharegpt", "alpaca", ...).
        notes: what was changed or is unusual about a kept row (hone.core.data.turn_order's note keys); the
            report lists every such row under its note.
    """

    source: str
    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    images: list[ImageRef] = field(default_factory=list)
    format: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RowProblem:
    """Why a row is skipped. `reason` is one of the keys above; `message` names the file, row and field."""

    source: str
    reason: str
    field: str
    detail: str

    @property
    def message(self) -> str:
        where = f"{self.source}: {self.field}" if self.field else self.source
        return f"{where}: {self.detail}"


class RowError(Exception):
    """Raised inside normalization; the caller turns it into a RowProblem with the row's source."""

    def __init__(self, reason: str, field: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.field = field
        self.detail = detail


def preview(value: Any, limit: int = 40) -> str:
    """A short repr of a user value for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
