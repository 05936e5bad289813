"""Config -> tokenized training and evaluation sets, with one report per split. The trainer's entry point.

Per split: resolve the sources, read records (streamed), detect the format per source, normalize, check images
(fetching URLs into the data cache, once), encode in batches, collect into a TokenizedSet, and account for every row
in a ReportBuilder. A finished split is cached; a second run with the same inputs memory-maps it back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hone.core.data import cache as cache_store
from hone.core.data.formats import ColumnNames, detect_format, normalize, used_columns
from hone.core.data.holdout import hold_out_rows
from hone.core.data.images import OUTSIDE_DATA_FOLDER, ImageStore, reads_outside
from hone.core.data.labels import PRECUT, Encoded, RowEncoder
from hone.core.data.loaders import (
    DUPLICATES_KEY,
    Source,
    SourceError,
    content_hash,
    read_records,
    resolve_sources,
)
from hone.core.data.parallel import default_workers, encode_stream
from hone.core.data.report import ReportBuilder
from hone.core.data.rows import DUPLICATE_COLUMN, IMAGE_NOT_FETCHED, Row, RowError, RowProblem
from hone.core.data.tokenized import TokenizedSet, TokenizedSetBuilder
from hone.core.errors import DataError
from hone.core.events import DatasetReport

# Rows encoded per batch: large enough for the tokenizer's batch call to pay off, small enough that a batch of
# rendered texts stays a few MB.
ENCODE_BATCH = 512
# Progress callbacks at most this often (seconds), so a GUI is not flooded.
_PROGRESS_EVERY_S = 0.25

Progress = Callable[[str, float], None]


@dataclass
class TrainingData:
    """What the trainer gets: the tokenized splits and one DatasetReport per split."""

    train: TokenizedSet
    eval: TokenizedSet | None
    reports: list[DatasetReport]


def load_training_data(
    cfg, tokenizer, *, seed: int = 0, cache_dir: Path | None = None, progress: Progress | None = None
) -> TrainingData:
    """Read, validate and tokenize the data that `cfg` (a DataConfig) names.

    Args:
        cfg: hone.core.config.DataConfig.
        tokenizer: the model's tokenizer (with its chat template), or its processor for vision models.
        seed: picks the rows held out by `cfg.eval_fraction`.
        cache_dir: where tokenized splits are cached; None = `cache_root("datasets")` (`$HONE_CACHE/datasets`, else
            the platform's user cache, e.g. ~/.cache/hone/datasets).
        progress: called as progress(message, fraction 0..1) while working.

    Returns:
        TrainingData with train (and eval, when configured) sets and their reports.

    Raises:
        DataError: no training row is usable (the message lists why rows were skipped).
    """
    encoder = RowEncoder(
        tokenizer,
        max_length=cfg.max_length,
        overlong=cfg.overlong,
        train_on=cfg.train_on,
        image_max_side=cfg.image_max_side,
    )
    cache_dir = cache_store.default_cache_dir() if cache_dir is None else Path(cache_dir)
    has_eval = bool(cfg.eval)
    train, train_truncated, train_report = _tokenized_split(
        "train", cfg.train, cfg, encoder, _image_store(cfg, cache_dir), _scaled(progress, 0.0, 0.8 if has_eval else 1.0)
    )
    if len(train) == 0:
        raise DataError(_nothing_usable("training", cfg.train, train_report), _advice(train_report))
    reports: list[DatasetReport]
    eval_set: TokenizedSet | None = None
    if has_eval:
        eval_set, eval_truncated, eval_report = _tokenized_split(
            "eval", cfg.eval, cfg, encoder, _image_store(cfg, cache_dir), _scaled(progress, 0.8, 1.0)
        )
        if len(eval_set) == 0:
            raise DataError(_nothing_usable("evaluation", cfg.eval, eval_report), _advice(eval_report))
        reports = [_report(train_report, train, train_truncated), _report(eval_report, eval_set, eval_truncated)]
    elif cfg.eval_fraction > 0 and len(train) >= 2:
        held = hold_out_rows(len(train), cfg.eval_fraction, seed, train_report)
        eval_set, train = train.subset(held.eval_rows), train.subset(held.train_rows)
        reports = [
            _report(train_report, train, train_truncated[held.train_rows], held_out=len(held.eval_rows)),
            _report(held.report, eval_set, train_truncated[held.eval_rows]),
        ]
    else:
        if cfg.eval_fraction > 0:
            train_report.note("data.eval_fraction is set but there is only one usable row, so nothing is held out")
        reports = [_report(train_report, train, train_truncated)]
    if progress is not None:
        progress("data ready", 1.0)
    return TrainingData(train=train, eval=eval_set, reports=reports)


def check_data(
    cfg, tokenizer=None, *, split: str = "train", progress: Progress | None = None
) -> tuple[DatasetReport, TokenizedSet | None]:
    """Validate the data of one split without caching tokens; tokenize only when a tokenizer is given.

    Without a tokenizer every structural check still runs (files, JSON, fields, roles, images) and the report
    has no token statistics. Every skipped row is listed (a run's report lists the first few). Image URLs are
    fetched into the data cache (`cache_root("datasets")`), where the run finds them. Used by `hone data check` and
    the GUI's dataset page.
    """
    entries = cfg.train if split == "train" else cfg.eval
    report = ReportBuilder(split, [str(e) for e in entries], max_examples=None)
    rows = _row_batches(entries, split, cfg, report, progress, _image_store(cfg, cache_store.default_cache_dir()))
    if tokenizer is None:
        kept = image_rows = 0
        for batch in rows:
            kept += len(batch)
            image_rows += sum(1 for row in batch if row.images)
            report.formats.update(row.format for row in batch)
        empty = np.zeros(0, np.int64)
        return report.build(empty, empty, image_rows, rows_kept=kept), None
    encoder = RowEncoder(
        tokenizer,
        max_length=cfg.max_length,
        overlong=cfg.overlong,
        train_on=cfg.train_on,
        image_max_side=cfg.image_max_side,
    )
    builder = TokenizedSetBuilder()
    truncated: list[bool] = []
    workers = default_workers(_resolvable(entries, split, ReportBuilder(split, [])))
    for batch, results in encode_stream(encoder, rows, workers):
        _collect(batch, results, report, builder, truncated)
    data = builder.build()
    return _report(report, data, np.array(truncated, bool)), data


def _image_store(cfg, cache_dir: Path) -> ImageStore:
    return ImageStore(cache_dir, cfg.image_max_side, allow_private_urls=cfg.allow_private_urls)


def _tokenized_split(
    split: str, entries: list[str], cfg, encoder: RowEncoder, images: ImageStore, progress: Progress | None
) -> tuple[TokenizedSet, np.ndarray, ReportBuilder]:
    """One split: from the cache when its key matches (and the image copies it names are still there), else read,
    encode and store."""
    cache_dir = images.folder
    files = [str(e) for e in entries]
    key = None
    sources: list[Source] = []
    try:
        sources = resolve_sources(entries, side=split)
        key = cache_store.cache_key(
            {
                "sources": [(s.name, s.kind, s.split, content_hash(s)) for s in sources],
                "tokenizer": cache_store.tokenizer_fingerprint(encoder.tokenizer),
                "encoder": encoder.fingerprint(),
                "format": cfg.format,
                "columns": cfg.columns,
                "side": split,
                "allow_private_urls": cfg.allow_private_urls,
            }
        )
    except (SourceError, OSError):
        pass  # reading reports the problem properly below
    folder = cache_dir / key if key else None
    if folder is not None:
        cached = cache_store.load(folder)
        if cached is not None and _image_copies_present(cached[0]):
            data, truncated, state = cached
            if progress is not None:
                progress(f"{split} data from cache", 1.0)
            return data, truncated, ReportBuilder.from_state(split, files, state)
    report = ReportBuilder(split, files)
    builder = TokenizedSetBuilder()
    truncated_list: list[bool] = []
    workers = default_workers(sources) if sources else 0
    for batch, results in encode_stream(encoder, _row_batches(entries, split, cfg, report, progress, images), workers):
        _collect(batch, results, report, builder, truncated_list)
    data = builder.build()
    truncated = np.array(truncated_list, dtype=bool)
    if encoder.template.is_fallback:
        report.note("the tokenizer has no chat template, so conversations are rendered as plain ChatML text")
    if report.skipped[IMAGE_NOT_FETCHED]:
        report.note(
            f"{report.skipped[IMAGE_NOT_FETCHED]:,} rows skipped because an image URL was not fetched; the "
            "tokenized data is not cached, so the next run tries those URLs again"
        )
    elif folder is not None and len(data):
        try:
            cache_store.save(folder, data, truncated, report.to_state())
        except OSError as e:
            report.note(
                f"the tokenized data could not be cached in {cache_dir} ({e.strerror}); the next run tokenizes again"
            )
    return data, truncated, report


def _collect(
    batch: list[Row],
    results: list[Encoded | RowProblem],
    report: ReportBuilder,
    builder: TokenizedSetBuilder,
    truncated: list[bool],
) -> None:
    for row, result in zip(batch, results, strict=True):
        if isinstance(result, RowProblem):
            report.skip(result)
            continue
        assert isinstance(result, Encoded)
        builder.add(result.ids, result.trained, result.source, result.images)
        if result.precut:
            report.kept_with_note(result.source, PRECUT)
        truncated.append(result.truncated)
        report.truncated += int(result.truncated)
        report.formats[row.format] += 1


def _image_copies_present(data: TokenizedSet) -> bool:
    """Whether every fetched URL and reduced image a cached split names is still in the data cache."""
    return all(Path(ref.cached).is_file() for refs in data.images.values() for ref in refs if ref.cached)


def _row_batches(
    entries: list[str], split: str, cfg, report: ReportBuilder, progress: Progress | None, images: ImageStore
) -> Iterator[list[Row]]:
    """Every usable Row of the split's sources, in batches; every other row is counted as skipped."""
    try:
        sources = resolve_sources(entries, side=split)
    except SourceError as e:
        report.problem(e.message)
        sources = _resolvable(entries, split, report)
    batch: list[Row] = []
    last_progress = 0.0
    for n, source in enumerate(sources):
        try:
            for _, item in iter_rows(source, cfg, on_detect=report.detected, images=images):
                report.read()
                if isinstance(item, RowProblem):
                    report.skip(item)
                    continue
                for note in item.notes:
                    report.kept_with_note(item.source, note)
                batch.append(item)
                if len(batch) >= ENCODE_BATCH:
                    yield batch
                    batch = []
                    now = time.monotonic()
                    if progress is not None and now - last_progress > _PROGRESS_EVERY_S:
                        last_progress = now
                        progress(f"{split}: {report.rows_read:,} rows read", n / max(1, len(sources)))
        except SourceError as e:
            report.problem(e.message)
        if progress is not None:
            progress(f"{split}: {source.name} read", (n + 1) / max(1, len(sources)))
    if batch:
        yield batch


def iter_rows(
    source: Source, cfg, on_detect: Callable[[str, str], None] | None = None, images: ImageStore | None = None
) -> Iterator[tuple[int, Row | RowProblem]]:
    """(row number, Row or the RowProblem that skips it) for every row of one source, images checked.

    The format is `cfg.format`, or (auto) detected from the first row whose columns match one; then
    on_detect(source name, format) is called. Images are made ready by `images` (default: a store in the user's
    data cache); a row whose image paths lead outside the source's folder is kept with the OUTSIDE_DATA_FOLDER note.

    Raises:
        SourceError: the source as a whole cannot be read (rows yielded before stay valid).
    """
    columns = ColumnNames(cfg.columns)
    require_assistant = cfg.train_on == "assistant"
    fmt = None if cfg.format == "auto" else cfg.format
    if images is None:
        images = _image_store(cfg, cache_store.default_cache_dir())
    for number, record in read_records(source):
        if isinstance(record, RowProblem):
            yield number, record
            continue
        row_source = f"{source.name}:{number}"
        duplicates = record.pop(DUPLICATES_KEY, None)
        try:
            if fmt is None:
                fmt = detect_format(record, columns)
                if on_detect is not None:
                    on_detect(source.name, fmt)
            if duplicates:
                used = next((c for c in used_columns(fmt, columns) if c in duplicates), None)
                if used is not None:
                    raise RowError(DUPLICATE_COLUMN, used, duplicates[used])
            row = normalize(record, fmt, columns, row_source, source.base_dir, require_assistant)
            if row.images:
                row.images = [images.check(ref, f"image {k + 1}") for k, ref in enumerate(row.images)]
                if source.base_dir is not None and any(reads_outside(ref, source.base_dir) for ref in row.images):
                    row.notes.append(OUTSIDE_DATA_FOLDER)
        except RowError as e:
            yield number, RowProblem(row_source, e.reason, e.field, e.detail)
            continue
        yield number, row


def _resolvable(entries: list[str], split: str, report: ReportBuilder) -> list[Source]:
    """Sources of the entries that resolve, reporting the others (after a first failure)."""
    sources: list[Source] = []
    for entry in entries:
        try:
            sources += resolve_sources([entry], side=split)
        except SourceError as e:
            if e.message not in report.problems:
                report.problem(e.message)
    return sources


def _report(builder: ReportBuilder, data: TokenizedSet, truncated: np.ndarray, held_out: int = 0) -> DatasetReport:
    return builder.build(
        data.lengths, data.trained_lengths, data.image_rows, held_out=held_out, truncated=int(np.sum(truncated))
    )


def _nothing_usable(what: str, entries: list[str], report: ReportBuilder) -> str:
    names = ", ".join(map(str, entries)) or "(none given)"
    if report.problems:
        return f"no usable {what} rows in {names}: {report.problems[0]}"
    if report.rows_read == 0:
        return f"no {what} rows in {names}: the sources hold no rows"
    reasons = ", ".join(f"{count} {reason}" for reason, count in report.skipped.most_common(3))
    first = report.examples[0] if report.examples else ""
    return f"none of the {report.rows_read:,} {what} rows in {names} is usable ({reasons}); first: {first}"


def _advice(report: ReportBuilder) -> str:
    return "run `hone data check FILE --model MODEL` for the full report, fix the rows it lists, and try again"


def _scaled(progress: Progress | None, start: float, end: float) -> Progress | None:
    if progress is None:
        return None
    return lambda message, fraction: progress(message, start + (end - start) * fraction)
