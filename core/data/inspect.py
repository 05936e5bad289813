"""The inspector: one row as the model will see it, for the GUI's highlight view and `hone data inspect`.

`inspect_rows` gives a `RowView` per requested row: the rendered text cut into `Piece`s that cover it exactly, each
a run of tokens with the same trained flag (or one image's tokens), so long rows stay cheap to draw. Row numbers
are the 1-based ones the data report prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hone.core.data.labels import Encoded, RowEncoder
from hone.core.data.loaders import Source, SourceError, resolve_sources
from hone.core.data.pipeline import iter_rows
from hone.core.data.rows import Row, RowProblem
from hone.core.errors import DataError


@dataclass(frozen=True)
class Piece:
    """A run of consecutive tokens with the same trained flag (or one image's placeholder tokens).

    Attributes:
        text: the characters of the rendered text these tokens cover (for an image: its placeholder text).
        trained: whether these tokens carry loss.
        tokens: how many tokens the run holds.
        kind: "text", or "image" for an image's placeholder tokens.
        first_token: index of the run's first token in the row.
    """

    text: str
    trained: bool
    tokens: int
    kind: str = "text"
    first_token: int = 0


@dataclass(frozen=True)
class ImagePlaceholder:
    """One image of the row: which it is, its size, and its place and token count in the row."""

    index: int
    source: str
    width: int
    height: int
    tokens: int
    first_token: int


@dataclass
class RowView:
    """What the inspector shows for one row.

    Attributes:
        source: where the row is ("file.jsonl:17").
        format: the row format it was read as ("messages", "alpaca", ...).
        text: the rendered conversation (chat template applied; one placeholder per image).
        pieces: consecutive runs of tokens that cover `text` exactly; the GUI highlights those with `trained=True`.
        token_ids: the row's token ids.
        trained: per token, whether it carries loss.
        images: per image: where it is, its size, and how many tokens it becomes.
        messages: the normalized conversation, where the row got that far.
        truncated: the row was cut to `data.max_length`.
        problem: the report's message when the row is skipped; then only `source` (and `format` and `messages`
            where the row got that far) are set.
    """

    source: str
    format: str = ""
    text: str = ""
    pieces: list[Piece] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    images: list[ImagePlaceholder] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None
    truncated: bool = False
    problem: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_trained(self) -> int:
        return sum(self.trained)


def inspect_rows(entry: str, tokenizer, rows: list[int], *, cfg=None) -> list[RowView]:
    """Views of the given rows of one dataset source.

    Example:
        views = inspect_rows("data/train.jsonl", tokenizer, [17], cfg=run_config.data)
        view = views[0]
        view.text                    # the rendered conversation (chat template applied; one placeholder per image)
        for piece in view.pieces:    # consecutive pieces cover view.text exactly
            piece.text, piece.trained, piece.kind, piece.tokens   # kind: "text" | "image"

    Row numbers are the ones the report prints ("file.jsonl:17" is row 17: the line of a JSONL file, the element
    of a JSON list, the spreadsheet row of a CSV with its header as row 1).

    Args:
        entry: a file, folder or dataset id, as in DataConfig.train.
        tokenizer: the model's tokenizer (or processor).
        rows: 1-based row numbers, as the report prints them.
        cfg: a DataConfig for format, columns, max_length, train_on (default: DataConfig()).

    Raises:
        DataError: the source cannot be read, or a requested row does not exist.
    """
    if cfg is None:
        from hone.core.config import DataConfig

        cfg = DataConfig()
    encoder = RowEncoder(
        tokenizer,
        max_length=cfg.max_length,
        overlong=cfg.overlong,
        train_on=cfg.train_on,
        image_max_side=cfg.image_max_side,
    )
    return views_of_rows(
        entry, rows, lambda source: iter_rows(source, cfg), lambda source, n, item: _view(encoder, item)
    )


def views_of_rows(
    entry: str,
    rows: list[int],
    read: Callable[[Source], Iterator[tuple[int, Any]]],
    view: Callable[[Source, int, Any], Any],
) -> list[Any]:
    """`view(source, number, item)` of each of the given rows (1-based) of the one source `entry` names, reading
    (number, item) pairs with `read(source)` and stopping at the last row wanted; in the order of `rows`.

    Raises:
        DataError: the entry cannot be read, holds several files, or has no such row.
    """
    try:
        sources = resolve_sources([entry])
    except SourceError as e:
        raise DataError(e.message, "check the path") from None
    if len(sources) != 1:
        names = ", ".join(s.name for s in sources[:5])
        raise DataError(f"{entry} holds {len(sources)} files ({names}, ...)", "inspect one file at a time")
    wanted = set(rows)
    found: dict[int, Any] = {}
    last = 0
    try:
        for number, item in read(sources[0]):
            last = number
            if number not in wanted:
                continue
            found[number] = view(sources[0], number, item)
            if len(found) == len(wanted):
                break
    except SourceError as e:
        raise DataError(e.message, "fix the file and try again") from None
    missing = sorted(wanted - set(found))
    if missing:
        raise DataError(
            f"{entry} has no row {missing[0]} (its last row is {last})",
            "row numbers are 1-based, as the report prints them",
        )
    return [found[n] for n in rows]


def inspect_row(entry: str, tokenizer, row: int, *, cfg=None) -> RowView:
    """The view of one row; see inspect_rows."""
    return inspect_rows(entry, tokenizer, [row], cfg=cfg)[0]


def _view(encoder: RowEncoder, item: Row | RowProblem) -> RowView:
    if isinstance(item, RowProblem):
        return RowView(source=item.source, problem=item.message)
    (result,) = encoder.encode([item], keep_text=True)
    if isinstance(result, RowProblem):
        return RowView(source=item.source, format=item.format, messages=item.messages, problem=result.message)
    assert isinstance(result, Encoded)
    pieces, images = _pieces(result, encoder)
    return RowView(
        source=item.source,
        format=item.format,
        text=result.text,
        pieces=pieces,
        token_ids=result.ids.tolist(),
        trained=result.trained.tolist(),
        images=images,
        messages=item.messages,
        truncated=result.truncated,
    )


def _pieces(result: Encoded, encoder: RowEncoder) -> tuple[list[Piece], list[ImagePlaceholder]]:
    """Group tokens into runs of equal trained flag; each image's tokens form their own run."""
    text, starts, trained = result.text, result.offsets, result.trained
    assert starts is not None
    n = len(result.ids)
    image_at = {start: (k, count) for k, (start, count) in enumerate(result.image_runs)}
    token_text = encoder.image_tokens.token if encoder.image_tokens is not None else ""
    covered = result.text_end  # truncation drops the text after it
    pieces: list[Piece] = []
    images: list[ImagePlaceholder] = []
    j = 0
    while j < n:
        if j in image_at:
            k, count = image_at[j]
            ref = result.images[k]
            begin = int(starts[j])
            pieces.append(
                Piece(
                    text=text[begin : begin + len(token_text)], trained=False, tokens=count, kind="image", first_token=j
                )
            )
            images.append(
                ImagePlaceholder(
                    index=k, source=ref.describe(), width=ref.width, height=ref.height, tokens=count, first_token=j
                )
            )
            j += count
            continue
        flag = bool(trained[j])
        end = j + 1
        while end < n and bool(trained[end]) == flag and end not in image_at:
            end += 1
        begin = int(starts[j])
        stop = int(starts[end]) if end < n else covered
        pieces.append(Piece(text=text[begin:stop], trained=flag, tokens=end - j, first_token=j))
        j = end
    return pieces, images


def render_pieces(pieces: list[Piece], color: bool = True) -> str:
    """Pieces as terminal text: trained spans in green (or [[...]] without color), the rest dimmed, images as
    [image N tokens]."""
    out = []
    for piece in pieces:
        if piece.kind == "image":
            label = f"[image {piece.tokens} tokens]"
            out.append(f"\033[35m{label}\033[0m" if color else label)
        elif piece.trained:
            out.append(f"\033[1;32m{piece.text}\033[0m" if color else f"[[{piece.text}]]")
        else:
            out.append(f"\033[2m{piece.text}\033[0m" if color else piece.text)
    return "".join(out)


def token_line(token_ids: list[int], trained: list[bool]) -> str:
    """ "  tokens: 12 345* ..." (* = trained)."""
    return "  tokens: " + " ".join(f"{t}{'*' if f else ''}" for t, f in zip(token_ids, trained, strict=True))


def format_view(view: RowView, color: bool = True, show_tokens: bool = False) -> str:
    """The view as terminal text: trained spans in green (or [[...]] without color), images as [image ...]."""
    if view.problem:
        return f"skipped: {view.problem}"
    lines = [
        render_pieces(view.pieces, color),
        "",
        f"{view.source}: {view.format}, {view.num_tokens} tokens, {view.num_trained} trained"
        + (", truncated to max_length" if view.truncated else ""),
    ]
    lines += [
        f"  image {im.index + 1}: {im.source} ({im.width}x{im.height}) -> {im.tokens} tokens at token {im.first_token}"
        for im in view.images
    ]
    if show_tokens:
        lines.append(token_line(view.token_ids, view.trained))
    return "\n".join(lines)
