"""What the Data page shows, apart from its widgets: rows as HTML, the report in words, skipped rows as the report
lists them and as the file holds them."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QImageReader, QPixmap

from hone.app.theme import Palette
from hone.app.widgets.config_form import CHOICE_LABELS, field_label, in_words
from hone.core.config import SECTIONS
from hone.core.events import DatasetReport
from hone.core.resources import BUNDLED_PREFIX

THUMBNAIL = 56  # px
# A report's skipped example: "file:row: field: why" (a Windows path's drive colon is not followed by digits).
_SKIPPED = re.compile(r"^(.+?):(\d+): (.*)$", re.S)
# A setting a message tells the user to change: `data.train_on = "all"`.
_SETTING = re.compile(r'\b([a-z_]+)\.([a-z_]+) = "?([\w.-]+)"?')


@dataclass(frozen=True)
class SkippedRow:
    """A row the check skipped: which split, the file as the report names it, its 1-based row number, and why."""

    split: str
    source: str
    row: int
    why: str

    @property
    def where(self) -> str:
        return f"{Path(self.source).name}:{self.row}"


def user_words(message: str) -> str:
    """A core message (written for the command line, where config keys are what people type) in the Studio's
    words: `data.train_on = "all"` reads “Train on” to “Every token”, other keys as the form labels them, bundled
    files without their `bundled:` prefix."""

    def setting(match: re.Match) -> str:
        section, name, value = match.groups()
        key = f"{section}.{name}"
        if section not in SECTIONS or name not in {f.name for f in fields(SECTIONS[section])}:
            return match.group(0)
        return f"“{field_label(key)}” to “{CHOICE_LABELS.get(key, {}).get(value, value)}”"

    return in_words(_SETTING.sub(setting, message)).replace(BUNDLED_PREFIX, "")


def skipped_rows(report: DatasetReport | None, split: str) -> list[SkippedRow]:
    """Every skipped row a check listed (a check lists them all, a run's report only the first few)."""
    rows = []
    for example in report.skipped_examples if report else []:
        match = _SKIPPED.match(example)
        if match:
            rows.append(SkippedRow(split, match.group(1), int(match.group(2)), user_words(match.group(3))))
    return rows


def highlight_html(pieces: list[Any], palette: Palette | None) -> str:
    """The rendered row as HTML: trained runs on an accent background, image placeholders as pills."""
    accent_bg = palette.accent_soft if palette else "#e7e4ff"
    accent_fg = palette.accent_text if palette else "#4335c9"
    muted = palette.muted if palette else "#666"
    parts = []
    for piece in pieces:
        text = html.escape(piece.text)
        if piece.kind == "image":
            parts.append(
                f"<span style='background:{muted};color:white'>&nbsp;image · {piece.tokens} tokens&nbsp;</span>"
            )
        elif piece.trained:
            parts.append(f"<span style='background:{accent_bg};color:{accent_fg};font-weight:600'>{text}</span>")
        else:
            parts.append(f"<span style='color:{muted}'>{text}</span>")
    body = "".join(parts).replace("\n", "<br>")
    return f"<div style='font-family:monospace;font-size:10pt;white-space:pre-wrap'>{body}</div>"


def report_html(report: DatasetReport, eval_report: DatasetReport | None = None) -> str:
    """The report in words: rows kept, sources that could not be read, notes; the evaluation data's below."""
    text = _split_html(report, "Training data" if eval_report is not None else "")
    return text + (_split_html(eval_report, "Evaluation data") if eval_report is not None else "")


def _split_html(report: DatasetReport, heading: str) -> str:
    lines = [f"<p><b>{heading}</b></p>"] if heading else []
    lines += [
        f"<p><b>{report.rows_kept:,}</b> of {report.rows_read:,} rows kept"
        + (f" ({report.format})" if report.format else "")
        + (f"; {report.image_rows:,} with images" if report.image_rows else "")
        + (f"; {report.held_out:,} held out for evaluation" if report.held_out else "")
        + ".</p>"
    ]
    # notes in the form's words: "(set data.format to override)" reads "(set “Format” to override)"
    notes = [user_words(note) for note in report.notes]
    for title, items in (("Could not read", report.problems), ("Notes", notes)):
        if items:
            lines.append(f"<p><b>{title}</b></p><ul>")
            lines += [f"<li>{html.escape(item.replace(BUNDLED_PREFIX, ''))}</li>" for item in items]
            lines.append("</ul>")
    return "".join(lines)


def prompt_and_response(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The last user turn and the last assistant turn, as one line each."""

    def text_of(message):
        content = message.get("content", "")
        if isinstance(content, list):
            content = " ".join(
                part.get("text", "[image]") if part.get("type") == "text" else "[image]" for part in content
            )
        return " ".join(str(content).split())

    prompt = next((text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
    response = next((text_of(m) for m in reversed(messages) if m.get("role") == "assistant"), "")
    if not messages:
        return "", ""
    if not prompt and not response:  # plain text rows
        prompt = text_of(messages[0])
    return prompt, response


def thumbnail(source: str):
    """A small icon of an image file, or None where it cannot be read."""
    from PySide6.QtGui import QIcon

    path = Path(str(source))
    if not path.is_file():
        return None
    reader = QImageReader(str(path))
    reader.setAutoTransform(True)
    size = reader.size()
    if size.isValid():
        reader.setScaledSize(size.scaled(THUMBNAIL, THUMBNAIL, Qt.KeepAspectRatio))
    image = reader.read()
    return None if image.isNull() else QIcon(QPixmap.fromImage(image))
