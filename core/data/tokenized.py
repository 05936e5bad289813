"""Tokenized rows, stored compactly: one flat int32 token array, one flat bool "trained" array, row offsets.

A `TokenizedSet` of a million rows costs ~5 bytes per token plus ~16 bytes per row, and may be memory-mapped from
the cache. Rows come out as `TokenizedRow`s with plain lists, built on access.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hone.core.data.rows import ImageRef

IGNORE_INDEX = -100  # label of a token that carries no loss (the value torch's cross_entropy ignores by default)


@dataclass
class TokenizedRow:
    """One row ready for the trainer.

    Attributes:
        input_ids: token ids, length L.
        labels: length L; the token id where the token is trained, IGNORE_INDEX (-100) where it is not (system
            and user turns, template tokens, image tokens). Not shifted: the loss shifts.
        source: "path/to/file.jsonl:17" (1-based row number), for messages and the inspector.
        images: the row's images in the order their placeholder tokens appear.
    """

    input_ids: list[int]
    labels: list[int]
    source: str
    images: list[ImageRef] = field(default_factory=list)


class TokenizedSet(Sequence[TokenizedRow]):
    """A read-only sequence of TokenizedRow over flat arrays.

    Attributes:
        lengths: int64 [rows], tokens per row.
        num_tokens: total tokens.
        num_trained: total tokens that carry loss.
    """

    def __init__(
        self,
        ids: np.ndarray,
        trained: np.ndarray,
        offsets: np.ndarray,
        trained_counts: np.ndarray,
        sources: list[str],
        row_numbers: np.ndarray,
        source_index: np.ndarray,
        images: dict[int, list[ImageRef]] | None = None,
        rows: np.ndarray | None = None,
    ):
        """
        Args:
            ids: int32 [T], all rows' tokens back to back.
            trained: bool [T], True where the token carries loss.
            offsets: int64 [N + 1], row k is ids[offsets[k]:offsets[k + 1]].
            trained_counts: int64 [N], trained tokens of each stored row.
            sources: the distinct source names (files), indexed by `source_index`.
            row_numbers: int64 [N], 1-based row number of each stored row within its source.
            source_index: int32 [N], index into `sources`.
            images: stored row -> its images (only rows that have any).
            rows: int64 [M], the stored rows this set shows, in order (a view for splits); None = all.
        """
        self._ids, self._trained, self._offsets, self._trained_counts = ids, trained, offsets, trained_counts
        self._sources, self._row_numbers, self._source_index = sources, row_numbers, source_index
        self._images = images or {}
        self._rows = np.arange(len(offsets) - 1, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        self.lengths = (offsets[1:][self._rows] - offsets[:-1][self._rows]).astype(np.int64)
        self.num_tokens = int(self.lengths.sum())
        self.trained_lengths = np.asarray(trained_counts, dtype=np.int64)[self._rows]
        self.num_trained = int(self.trained_lengths.sum())

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} of a set of {len(self)}")
        k = int(self._rows[index])
        start, end = int(self._offsets[k]), int(self._offsets[k + 1])
        ids = np.asarray(self._ids[start:end], dtype=np.int64)
        labels = np.where(self._trained[start:end], ids, IGNORE_INDEX)
        return TokenizedRow(
            input_ids=ids.tolist(),
            labels=labels.tolist(),
            source=self.source(index),
            images=list(self._images.get(k, [])),
        )

    def source(self, index: int) -> str:
        """ "file:row" of the index-th row of this set."""
        k = int(self._rows[index])
        return f"{self._sources[self._source_index[k]]}:{self._row_numbers[k]}"

    def subset(self, indices: Sequence[int] | np.ndarray) -> TokenizedSet:
        """The rows at these positions of this set, sharing storage."""
        return TokenizedSet(
            self._ids,
            self._trained,
            self._offsets,
            self._trained_counts,
            self._sources,
            self._row_numbers,
            self._source_index,
            self._images,
            self._rows[np.asarray(indices, dtype=np.int64)],
        )

    @property
    def image_rows(self) -> int:
        return int(sum(1 for k in self._rows if int(k) in self._images)) if self._images else 0

    def arrays(self) -> dict[str, np.ndarray]:
        """The backing arrays (for the cache)."""
        return {
            "ids": self._ids,
            "trained": self._trained,
            "offsets": self._offsets,
            "trained_counts": self._trained_counts,
            "row_numbers": self._row_numbers,
            "source_index": self._source_index,
            "rows": self._rows,
        }

    @property
    def sources(self) -> list[str]:
        return self._sources

    @property
    def images(self) -> dict[int, list[ImageRef]]:
        return self._images


class TokenizedSetBuilder:
    """Collects tokenized rows and builds a TokenizedSet with one concatenation at the end."""

    def __init__(self):
        self._ids: list[np.ndarray] = []
        self._trained: list[np.ndarray] = []
        self._trained_counts: list[int] = []
        self._row_numbers: list[int] = []
        self._source_index: list[int] = []
        self._sources: dict[str, int] = {}
        self._images: dict[int, list[ImageRef]] = {}

    def add(self, ids: np.ndarray, trained: np.ndarray, source: str, images: list[ImageRef] | None = None) -> None:
        """Append one row; `source` is "name:row" (split at the last colon)."""
        name, _, number = source.rpartition(":")
        index = self._sources.setdefault(name, len(self._sources))
        if images:
            self._images[len(self._ids)] = list(images)
        self._ids.append(np.asarray(ids, dtype=np.int32))
        self._trained.append(np.asarray(trained, dtype=bool))
        self._trained_counts.append(int(self._trained[-1].sum()))
        self._row_numbers.append(int(number))
        self._source_index.append(index)

    def __len__(self) -> int:
        return len(self._ids)

    def build(self) -> TokenizedSet:
        lengths = np.array([len(a) for a in self._ids], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = np.concatenate(self._ids) if self._ids else np.zeros(0, np.int32)
        trained = np.concatenate(self._trained) if self._trained else np.zeros(0, bool)
        return TokenizedSet(
            ids,
            trained,
            offsets,
            np.array(self._trained_counts, np.int64),
            list(self._sources),
            np.array(self._row_numbers, np.int64),
            np.array(self._source_index, np.int32),
            self._images,
        )
