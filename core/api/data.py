"""Check and inspect training data: every row validated and reported (`check_data`; preference pairs:
`check_pairs`; KTO's labelled answers: `check_unpaired`; either with its tokenized rows: `check_preference`; GRPO's
prompts: `check_prompts`), a row
shown as the model will see it (`inspect_row(s)`; a preference row's answers: `inspect_preference_rows`),
and the readers under them for a first look at a file (`resolve_sources`, `read_records`, `detect_format`,
`suggest_columns`).

Importing this loads numpy (hone.core.data), never torch; transformers loads when a tokenizer is used.
"""

from __future__ import annotations

from hone.core.data import check_data, format_report
from hone.core.data.formats import ColumnNames, detect_format, suggest_columns
from hone.core.data.inspect import format_view, inspect_row, inspect_rows
from hone.core.data.loaders import DUPLICATES_KEY, SourceError, read_records, resolve_sources
from hone.core.data.preference import check_pairs
from hone.core.data.preference_view import check_preference, format_preference_view, inspect_preference_rows
from hone.core.data.prompt_view import format_prompt_view, inspect_prompt_rows
from hone.core.data.prompts import check_prompts
from hone.core.data.rows import RowError
from hone.core.data.template import apply_template_setting
from hone.core.data.unpaired import check_unpaired

__all__ = [
    "DUPLICATES_KEY",
    "ColumnNames",
    "RowError",
    "SourceError",
    "apply_template_setting",
    "check_data",
    "check_pairs",
    "check_preference",
    "check_prompts",
    "check_unpaired",
    "detect_format",
    "format_preference_view",
    "format_prompt_view",
    "format_report",
    "format_view",
    "inspect_preference_rows",
    "inspect_prompt_rows",
    "inspect_row",
    "inspect_rows",
    "read_records",
    "resolve_sources",
    "suggest_columns",
]
