"""The one token batch every run of a benchmark trains on.

Sequence lengths are drawn log-uniform between a minimum and a maximum with a fixed seed (like SFT chat data: many
short rows, a few long ones) until they fill the token budget exactly; token ids are uniform random with the same
seed. Each runner gets it in its own form: Hone the trainer's `TokenizedSet` and one pack (`tokenized_set`,
`packs`), the transformers + peft reference one packed row as `DataCollatorWithFlattening` makes it (`flattened`).
Both train the same positions: every next-token prediction inside a sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hone.core.data import IGNORE_INDEX, TokenizedRow, TokenizedSet
from hone.core.data.tokenized import TokenizedSetBuilder
from hone.core.errors import ConfigError

# A sequence needs two tokens to train one prediction.
_MIN_USEFUL_LEN = 2


@dataclass(frozen=True)
class TokenBatch:
    """Sequences of random token ids packed end to end.

    Attributes:
        lengths: tokens of each sequence; they sum to `tokens`.
        ids: int64 [tokens], all sequences back to back.
        vocab_size: ids are in [0, vocab_size).
        seed, min_len, max_len: how it was drawn (for the JSON record).
    """

    lengths: tuple[int, ...]
    ids: np.ndarray
    vocab_size: int
    seed: int
    min_len: int
    max_len: int

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0])

    @property
    def trained_tokens(self) -> int:
        """Positions with a loss: every token but the first of each sequence (the model's-loss convention)."""
        return self.tokens - len(self.lengths)

    def starts(self) -> list[int]:
        """Offset of each sequence in the packed row."""
        return [0, *np.cumsum(self.lengths)[:-1].tolist()]

    def rows(self) -> list[TokenizedRow]:
        """One `TokenizedRow` per sequence, every token trained (labels = ids)."""
        out = []
        for index, (start, n) in enumerate(zip(self.starts(), self.lengths, strict=True)):
            ids = self.ids[start : start + n].tolist()
            out.append(TokenizedRow(input_ids=ids, labels=list(ids), source=f"bench:{index + 1}"))
        return out

    def tokenized_set(self) -> TokenizedSet:
        """The rows as the trainer's data API holds them."""
        builder = TokenizedSetBuilder()
        for index, (start, n) in enumerate(zip(self.starts(), self.lengths, strict=True)):
            builder.add(self.ids[start : start + n], np.ones(n, dtype=bool), f"bench:{index + 1}")
        return builder.build()

    def packs(self) -> list[list[int]]:
        """One micro-batch holding every row, in order (what `plan_packs` gives when all rows fit one budget)."""
        return [list(range(len(self.lengths)))]

    def flattened(self) -> dict[str, np.ndarray]:
        """One packed row the way `DataCollatorWithFlattening` builds it: (1, T) int64 arrays `input_ids`,
        `position_ids` (restarting at 0 at each sequence) and `labels` (the ids, -100 at each sequence start: the
        model's own loss shifts the labels, so no loss crosses a sequence boundary)."""
        positions = np.concatenate([np.arange(n, dtype=np.int64) for n in self.lengths])
        labels = self.ids.copy()
        labels[self.starts()] = IGNORE_INDEX
        return {"input_ids": self.ids[None, :].copy(), "position_ids": positions[None, :], "labels": labels[None, :]}

    def describe(self) -> dict:
        """Sizes for the JSON record and the table title."""
        lengths = np.asarray(self.lengths)
        return {
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "sequences": len(self.lengths),
            "length_min": int(lengths.min()),
            "length_median": int(np.median(lengths)),
            "length_max": int(lengths.max()),
            "min_len": self.min_len,
            "max_len": self.max_len,
            "seed": self.seed,
            "vocab_size": self.vocab_size,
        }


def draw_lengths(tokens: int, min_len: int, max_len: int, rng: np.random.Generator) -> list[int]:
    """Log-uniform lengths in [min_len, max_len] until they sum to `tokens`; the last one is cut to fit.

    A cut that would leave a sequence too short to train anything is added to the previous sequence instead.
    """
    lengths: list[int] = []
    total = 0
    low, high = math.log(min_len), math.log(max_len + 1)
    while total < tokens:
        n = min(int(math.exp(rng.uniform(low, high))), max_len)
        n = min(max(n, min_len), tokens - total)
        if n < _MIN_USEFUL_LEN and lengths:
            lengths[-1] += n
        else:
            lengths.append(n)
        total += n
    return lengths


def make_batch(tokens: int, vocab_size: int, *, seed: int = 0, min_len: int = 32, max_len: int = 2048) -> TokenBatch:
    """The benchmark's token batch: the same arguments always give the same batch.

    Raises:
        ConfigError: sizes that cannot make a batch.
    """
    if tokens < _MIN_USEFUL_LEN:
        raise ConfigError(f"--tokens is {tokens}; a batch needs at least {_MIN_USEFUL_LEN}", "raise --tokens")
    if not _MIN_USEFUL_LEN <= min_len <= max_len:
        raise ConfigError(
            f"sequence lengths {min_len}..{max_len} are not a range of at least {_MIN_USEFUL_LEN} tokens",
            "give --seq-min <= --seq-max, both >= 2",
        )
    rng = np.random.default_rng(seed)
    lengths = draw_lengths(tokens, min_len, max_len, rng)
    ids = rng.integers(0, vocab_size, size=tokens, dtype=np.int64)
    return TokenBatch(
        lengths=tuple(lengths), ids=ids, vocab_size=vocab_size, seed=seed, min_len=min_len, max_len=max_len
    )
