"""Rows -> token ids and trained flags: render through the chat template, tokenize in batches, mask by span.

A token is trained when its first character lies inside an assistant span (see hone.core.data.template), or
always with `train_on = "all"`. Plain `text` rows are tokenized as they are (BOS if the tokenizer adds one, EOS
appended) and trained throughout. Each image placeholder expands to the tokens the model's processor gives that
image (hone.core.data.image_tokens), which are never trained. A row the tokenizer panics on (a tokenizer.json whose
pre-tokenizer regex backtracks past its limit) is skipped with the reason; time limits are hone.core.data.parallel's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hone.core.data.formats import flatten_text_content
from hone.core.data.image_tokens import ImageExpansion, image_expansion_for
from hone.core.data.rows import (
    NO_TRAINED_TOKENS,
    TEMPLATE_ERROR,
    TEXT_ONLY_MODEL,
    TOKENIZER_ERROR,
    TOO_LONG,
    ImageRef,
    Row,
    RowProblem,
)
from hone.core.data.template import ChatTemplate, TemplateFailure, TemplateLimit

# A row's text is cut (data.overlong = "truncate") or the row dropped ("drop") before tokenizing when it has more than
# max_length x this many characters. Tokens average 3-5 characters of prose or code and rarely exceed 16; at 32 the
# kept prefix still yields well over max_length tokens, so the tokens kept are the ones a full tokenization would
# keep, while a 50 MB string costs a 64k-character tokenization instead of minutes and gigabytes.
MAX_CHARS_PER_TOKEN = 32
# Note key for rows cut before tokenizing (the report prints "N rows <key> (kept): file:row, ...").
PRECUT = (
    f"had more than data.max_length x {MAX_CHARS_PER_TOKEN} characters; only that many were tokenized, then truncated"
)


@dataclass
class Encoded:
    """One tokenized row before it is stored.

    Attributes:
        ids: int32 [L]; trained: bool [L]; truncated: whether max_length cut it; images: its images (kept ones).
        text: the rendered text (kept only when asked, for the inspector).
        offsets: int64 [L], character where each token starts in `text` (kept with `text`).
        text_end: where the kept tokens' text ends (before the first token cut by truncation).
        image_runs: (start, count) of each image's placeholder tokens in `ids`.
        precut: the text was cut to max_length x MAX_CHARS_PER_TOKEN characters before tokenizing.
    """

    source: str
    ids: np.ndarray
    trained: np.ndarray
    truncated: bool = False
    images: list[ImageRef] = field(default_factory=list)
    text: str = ""
    offsets: np.ndarray | None = None
    text_end: int = 0
    image_runs: list[tuple[int, int]] = field(default_factory=list)
    precut: bool = False


class RowEncoder:
    """Turns Rows into Encoded rows for one tokenizer (or processor) and one data config.

    Args:
        tokenizer: a transformers tokenizer, or a processor (its `.tokenizer` is used for text, its image
            processor for image token counts).
        max_length: longest row in tokens.
        overlong: "truncate" or "drop".
        train_on: "assistant" or "all".
        image_max_side: images are scaled down to this longest side before counting their tokens.
    """

    def __init__(
        self,
        tokenizer,
        *,
        max_length: int,
        overlong: str = "truncate",
        train_on: str = "assistant",
        image_max_side: int = 768,
    ):
        self.processor = (
            tokenizer if hasattr(tokenizer, "tokenizer") and hasattr(tokenizer, "image_processor") else None
        )
        self.tokenizer = tokenizer.tokenizer if self.processor is not None else tokenizer
        self.template = ChatTemplate.for_tokenizer(
            self.processor
            if self.processor is not None and getattr(self.processor, "chat_template", None)
            else self.tokenizer
        )
        self.max_length, self.overlong, self.train_on = max_length, overlong, train_on
        self.image_max_side = image_max_side
        self.image_tokens: ImageExpansion | None = (
            image_expansion_for(self.processor, image_max_side) if self.processor is not None else None
        )
        self.eos_id = self.tokenizer.eos_token_id
        self.has_offsets = bool(getattr(self.tokenizer, "is_fast", False))
        self.backend = getattr(self.tokenizer, "backend_tokenizer", None) if self.has_offsets else None

    def encode(
        self, rows: list[Row], keep_text: bool = False, progress: Callable[[int], None] | None = None
    ) -> list[Encoded | RowProblem]:
        """Encode a batch of rows; each comes back as an Encoded or the RowProblem that skipped it.

        A text far longer than max_length could use (over max_length x MAX_CHARS_PER_TOKEN characters) is never
        tokenized whole: with overlong = "drop" the row is skipped, with "truncate" only that many leading characters
        are tokenized (then cut to max_length tokens as usual).

        Args:
            progress: called with k before row k is rendered and with len(rows) + k before it is tokenized; given,
                rows are tokenized one at a time, so a watcher (hone.core.data.parallel) knows which row is slow.
        """
        out: list[Encoded | RowProblem | None] = [None] * len(rows)
        texts: list[str] = []
        plans: list[tuple[int, list[tuple[int, int]], bool]] = []  # (row position, spans, add_special_tokens)
        precut: set[int] = set()
        limit = self.max_length * MAX_CHARS_PER_TOKEN
        for k, row in enumerate(rows):
            if progress is not None:
                progress(k)
            if row.text is not None:
                if len(row.text) > limit and self._overlong(row, row.text, k, out, precut):
                    continue
                texts.append(row.text[:limit])
                plans.append((k, [(0, len(texts[-1]))], True))
                continue
            if row.images and self.image_tokens is None:
                out[k] = RowProblem(
                    row.source,
                    TEXT_ONLY_MODEL,
                    "",
                    f"has {len(row.images)} image(s) but the "
                    "model reads text only; pick a vision-language model to train on it",
                )
                continue
            assert row.messages is not None  # a row holds text or messages
            messages = row.messages if row.images else flatten_text_content(row.messages)
            try:
                text, spans = self.template.render_with_spans(messages)
            except TemplateFailure as e:
                out[k] = RowProblem(row.source, TEMPLATE_ERROR, "", f"the chat template failed on this row: {e}")
                continue
            except TemplateLimit as e:
                raise e.for_row(row.source) from None
            if len(text) > limit:
                if self._overlong(row, text, k, out, precut):
                    continue
                text = text[:limit]
                spans = [(s, min(e, limit)) for s, e in spans if s < limit]
            texts.append(text)
            plans.append((k, [(0, len(text))] if self.train_on == "all" else spans, False))
        step = None if progress is None else (lambda j: progress(len(rows) + plans[j][0]))
        encoded = self._tokenize(texts, [p[2] for p in plans], [p[1] for p in plans], step)
        for j, ((k, spans, is_text_row), result) in enumerate(zip(plans, encoded, strict=True)):
            if isinstance(result, str):
                out[k] = RowProblem(rows[k].source, TOKENIZER_ERROR, "", f"the tokenizer failed on this row ({result})")
                continue
            ids, starts = result
            out[k] = self._finish(rows[k], ids, starts, spans, texts[j] if keep_text else "", is_text_row, k in precut)
        return out  # type: ignore[return-value]

    def _overlong(self, row: Row, text: str, k: int, out: list, precut: set[int]) -> bool:
        """For a text over the character limit: skip the row (drop; returns True) or mark it to be cut."""
        if self.overlong == "drop":
            out[k] = RowProblem(
                row.source,
                TOO_LONG,
                "",
                f"has {len(text):,} characters, far more than "
                f"data.max_length = {self.max_length} tokens can hold (it would need over "
                f"{MAX_CHARS_PER_TOKEN} characters per token), so it was not tokenized; shorten the "
                'row or set data.overlong = "truncate"',
            )
            return True
        precut.add(k)
        return False

    def _tokenize(
        self,
        texts: list[str],
        special: list[bool],
        spans: list[list[tuple[int, int]]],
        progress: Callable[[int], None] | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray] | str]:
        """(ids int64 [L], character start of each token int64 [L]) per text, batched per add_special_tokens; for a
        text the tokenizer panics on, the panic's message instead. With `progress`, texts go one at a time and
        progress(j) is called before text j."""
        results: list[tuple[np.ndarray, np.ndarray] | str] = [""] * len(texts)
        for flag in (False, True):
            idx = [i for i, s in enumerate(special) if s == flag]
            if not idx:
                continue
            if progress is None:
                try:
                    batch = self._tokenize_batch([texts[i] for i in idx], flag, [spans[i] for i in idx])
                    for i, result in zip(idx, batch, strict=True):
                        results[i] = result
                    continue
                except BaseException as e:
                    if not is_tokenizer_panic(e):
                        raise
            for i in idx:  # one at a time: after a panic, to find its row (and keep the others); or to be watched
                if progress is not None:
                    progress(i)
                try:
                    results[i] = self._tokenize_batch([texts[i]], flag, [spans[i]])[0]
                except BaseException as e:
                    if not is_tokenizer_panic(e):
                        raise
                    results[i] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return results

    def _tokenize_batch(
        self, batch: list[str], flag: bool, spans: list[list[tuple[int, int]]] | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Tokenize `batch` with add_special_tokens = `flag` (spans: each text's assistant spans, for tokenizers
        without offsets)."""
        if self.backend is not None:
            # The Rust tokenizer that transformers' fast tokenizers wrap: the same ids, without building
            # Python dicts of every field for every row. Like the wrapper, switch off any truncation or
            # padding saved in tokenizer.json (max_length is applied afterwards, and counted).
            if self.backend.truncation is not None:
                self.backend.no_truncation()
            if self.backend.padding is not None:
                self.backend.no_padding()
            out = []
            for enc in self.backend.encode_batch(batch, add_special_tokens=flag):
                offsets = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
                out.append((np.array(enc.ids, dtype=np.int64), offsets[:, 0]))
            return out
        if self.has_offsets:
            enc = self.tokenizer(
                batch, add_special_tokens=flag, return_offsets_mapping=True, return_attention_mask=False
            )
            return [
                (
                    np.asarray(ids, dtype=np.int64),
                    np.fromiter((o[0] for o in offs), dtype=np.int64, count=len(offs)),
                )
                for ids, offs in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
            ]
        return [
            _tokenize_in_pieces(self.tokenizer, text, flag, text_spans)
            for text, text_spans in zip(batch, spans or [[] for _ in batch], strict=True)
        ]

    def _finish(
        self,
        row: Row,
        ids: np.ndarray,
        starts: np.ndarray,
        spans: list[tuple[int, int]],
        text: str,
        is_text_row: bool,
        precut: bool = False,
    ) -> Encoded | RowProblem:
        trained = np.zeros(len(ids), dtype=bool)
        for s, e in spans:
            trained |= (starts >= s) & (starts < e)
        if is_text_row and not precut and self.eos_id is not None and (len(ids) == 0 or ids[-1] != self.eos_id):
            ids = np.append(ids, self.eos_id)
            trained = np.append(trained, True)
            starts = np.append(starts, len(text))
            if text:  # the inspector shows the appended end-of-text token too
                text += self.tokenizer.convert_ids_to_tokens(int(self.eos_id))
        image_runs: list[tuple[int, int]] = []
        images = list(row.images)
        if row.images:
            ids, trained, starts, image_runs, problem = self._expand_images(row, ids, trained, starts, precut)
            if problem is not None:
                return problem
            images = images[: len(image_runs)]  # a cut text may have lost the placeholders of the last images
        truncated = precut
        text_end = len(text)
        if len(ids) > self.max_length:
            if self.overlong == "drop":
                return RowProblem(
                    row.source,
                    TOO_LONG,
                    "",
                    f"has {len(ids)} tokens, more than data.max_length = "
                    f'{self.max_length}; raise max_length or set data.overlong = "truncate"',
                )
            cut = self.max_length
            kept_runs = [r for r in image_runs if r[0] + r[1] <= cut]
            if len(kept_runs) < len(image_runs):  # never cut an image's tokens in half: end before that image
                cut = min(cut, image_runs[len(kept_runs)][0])
            text_end = int(starts[cut])
            ids, trained, starts = ids[:cut], trained[:cut], starts[:cut]
            images, image_runs = images[: len(kept_runs)], kept_runs
            truncated = True
        if not trained.any():
            why = (
                (
                    f"after truncation to data.max_length = {self.max_length} tokens no trained token is left; raise "
                    "max_length"
                )
                if truncated
                else "no token is trained (the assistant turns render as nothing)"
            )
            return RowProblem(row.source, NO_TRAINED_TOKENS, "", why)
        return Encoded(
            source=row.source,
            ids=ids.astype(np.int32),
            trained=trained,
            truncated=truncated,
            images=images,
            text=text,
            offsets=starts if text else None,
            text_end=text_end,
            image_runs=image_runs,
            precut=precut,
        )

    def _expand_images(self, row: Row, ids, trained, starts, precut: bool = False):
        """Replace each image placeholder by the tokens the processor gives that image (hone.core.data.image_tokens:
        a run of image tokens, possibly with the family's markers, tiles and tags); none of them is trained. A text
        cut before tokenizing (`precut`) may hold the placeholders of only the first images."""
        assert self.image_tokens is not None
        where = np.flatnonzero(ids == self.image_tokens.token_id)
        if len(where) != len(row.images) and not (precut and len(where) < len(row.images)):
            problem = RowProblem(
                row.source,
                TEMPLATE_ERROR,
                "",
                f"the chat template wrote {len(where)} image token(s) for {len(row.images)} image(s)",
            )
            return ids, trained, starts, [], problem
        pieces_ids, pieces_trained, pieces_starts, runs = [], [], [], []
        cursor = length = 0
        for position, ref in zip(where, row.images[: len(where)], strict=True):
            expansion = self.image_tokens.expand(ref.width, ref.height)
            pieces_ids += [ids[cursor:position], expansion]
            pieces_trained += [trained[cursor:position], np.zeros(len(expansion), dtype=bool)]
            pieces_starts += [starts[cursor:position], np.full(len(expansion), starts[position], dtype=starts.dtype)]
            length += position - cursor
            runs.append((int(length), len(expansion)))
            length += len(expansion)
            cursor = position + 1
        pieces_ids.append(ids[cursor:])
        pieces_trained.append(trained[cursor:])
        pieces_starts.append(starts[cursor:])
        return (
            np.concatenate(pieces_ids).astype(ids.dtype),
            np.concatenate(pieces_trained),
            np.concatenate(pieces_starts),
            runs,
            None,
        )

    def fingerprint(self) -> dict:
        """Everything about this encoder that changes its output (for the cache key)."""
        return {
            "template": self.template.source,
            "variables": self.template.variables,
            "max_length": self.max_length,
            "overlong": self.overlong,
            "train_on": self.train_on,
            "image_max_side": self.image_max_side,
            "image_token": None if self.image_tokens is None else self.image_tokens.fingerprint(),
        }


def _tokenize_in_pieces(
    tokenizer, text: str, add_special_tokens: bool, spans: list[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """For tokenizers without an offset mapping: cut the text at the span boundaries and encode each piece, so
    every token starts inside exactly one piece (merges across a boundary are lost, which is rare: boundaries sit
    next to the template's special tokens)."""
    cuts = sorted({0, len(text), *(p for span in spans for p in span if 0 < p < len(text))})
    ids: list[int] = []
    starts: list[int] = []
    for n, (a, b) in enumerate(itertools.pairwise(cuts)):
        piece = tokenizer.encode(text[a:b], add_special_tokens=add_special_tokens and n == 0)
        ids += piece
        starts += [a] * len(piece)
    return np.asarray(ids, dtype=np.int64), np.asarray(starts, dtype=np.int64)


def is_tokenizer_panic(error: BaseException) -> bool:
    """Whether `error` is a panic of Rust code under pyo3 (tokenizers): `pyo3_runtime.PanicException` derives from
    BaseException, so `except Exception` misses it; matched by name, since pyo3_runtime is not importable."""
    kind = type(error)
    return kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime"
