"""The inspector for GRPO prompts: a row's prompt rendered with the chat template and the assistant's turn opened, as
the policy sees it before it samples, with its token count and the row's other columns (what rewards read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hone.core.data.formats import ColumnNames
from hone.core.data.inspect import views_of_rows
from hone.core.data.loaders import read_records
from hone.core.data.prompts import encode_prompt
from hone.core.data.rows import RowProblem


@dataclass
class PromptView:
    """One GRPO prompt as sampling sees it; `problem`: why training skips the row (then the rest is empty)."""

    source: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)  # every column but the prompt's: what rewards are given
    problem: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def _view(record: Any, where: str, columns: ColumnNames, tokenizer, max_length: int) -> PromptView:
    row = encode_prompt(record, where, columns, tokenizer, max_length)
    if isinstance(row, RowProblem):
        return PromptView(where, problem=row.message)
    prompt = columns["prompt"] if columns["prompt"] in row.columns else columns["messages"]
    return PromptView(where, row.text, row.input_ids, {k: v for k, v in row.columns.items() if k != prompt})


def inspect_prompt_rows(entry: str, tokenizer, rows: list[int], *, cfg=None) -> list[PromptView]:
    """Views of the given rows (1-based, as the report numbers them) of one GRPO prompt source, in that order.

    Raises:
        DataError: the source cannot be read, holds several files, or a requested row does not exist.
    """
    if cfg is None:
        from hone.core.config import DataConfig

        cfg = DataConfig()
    columns = ColumnNames(cfg.columns)
    return views_of_rows(
        entry,
        rows,
        read_records,
        lambda source, number, record: _view(record, f"{source.name}:{number}", columns, tokenizer, cfg.max_length),
    )


def format_prompt_view(view: PromptView, color: bool = True, show_tokens: bool = False) -> str:
    """The view as terminal text: the rendered prompt (dimmed: none of it is trained), its size, the other columns."""
    if view.problem:
        return f"skipped: {view.problem}"
    lines = [f"\033[2m{view.text}\033[0m" if color else view.text, ""]
    lines.append(f"{view.source}: prompt, {view.num_tokens} tokens; the answer is sampled, then scored by the rewards")
    for name, value in view.columns.items():
        shown = value if isinstance(value, str) else repr(value)
        lines.append(f"  {name}: {shown if len(shown) <= 200 else shown[:199] + '…'}")
    if show_tokens:
        lines.append("  tokens: " + " ".join(str(t) for t in view.token_ids))
    return "\n".join(lines)
