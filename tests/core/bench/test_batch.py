"""The benchmark's token batch: sizes, determinism, and the same trained positions in both of its forms."""

from __future__ import annotations

import numpy as np
import pytest

from hone.core.bench.batch import make_batch
from hone.core.data.collate import IGNORE_INDEX, collate_packed
from hone.core.errors import ConfigError


def test_lengths_fill_the_budget_within_the_range_and_repeat_with_the_seed():
    batch = make_batch(16384, 151936, seed=0, min_len=32, max_len=2048)
    lengths = np.array(batch.lengths)
    assert lengths.sum() == batch.tokens == 16384
    assert lengths[:-1].min() >= 32 and lengths.max() <= 2048  # the last one may be cut to fit
    assert len(lengths) > 10, "log-uniform 32..2048 averages ~400 tokens, so 16K tokens hold dozens of rows"
    again = make_batch(16384, 151936, seed=0, min_len=32, max_len=2048)
    assert again.lengths == batch.lengths and np.array_equal(again.ids, batch.ids)
    other = make_batch(16384, 151936, seed=1, min_len=32, max_len=2048)
    assert other.lengths != batch.lengths
    assert batch.ids.min() >= 0 and batch.ids.max() < 151936


def test_log_uniform_lengths_are_mostly_short():
    lengths = np.array(make_batch(200_000, 1000, seed=3, min_len=32, max_len=2048).lengths[:-1])
    # log-uniform: P(len < sqrt(32 * 2048) = 256) = 1/2; a uniform draw would give ~11%.
    assert 0.4 < (lengths < 256).mean() < 0.6


def test_a_cut_too_short_to_train_joins_the_previous_sequence():
    batch = make_batch(101, 50, seed=0, min_len=50, max_len=50)
    assert batch.lengths == (50, 51)


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError):
        make_batch(1, 100)
    with pytest.raises(ConfigError):
        make_batch(100, 100, min_len=64, max_len=32)


def test_flattened_row_and_hone_pack_train_the_same_next_token_predictions():
    batch = make_batch(300, 97, seed=5, min_len=4, max_len=64)
    flat = batch.flattened()
    ids, positions, labels = flat["input_ids"][0], flat["position_ids"][0], flat["labels"][0]
    starts = np.cumsum((0, *batch.lengths[:-1]))
    assert np.array_equal(np.flatnonzero(positions == 0), starts)
    assert np.array_equal(np.flatnonzero(labels == IGNORE_INDEX), starts)
    # transformers' causal-LM loss: the prediction at t is scored against labels[t + 1].
    hf_targets = np.append(labels[1:], IGNORE_INDEX)
    hone_targets = collate_packed(batch.rows()).targets[0].numpy()
    assert np.array_equal(hf_targets, hone_targets)
    assert (hone_targets != IGNORE_INDEX).sum() == batch.trained_tokens == 300 - len(batch.lengths)
    assert np.array_equal(ids, np.concatenate([r.input_ids for r in batch.rows()]))


def test_the_tokenized_set_holds_the_rows_as_the_trainer_reads_them():
    batch = make_batch(200, 97, seed=2, min_len=4, max_len=64)
    dataset = batch.tokenized_set()
    assert len(dataset) == len(batch.lengths) and dataset.num_tokens == 200 == dataset.num_trained
    for row, expected in zip(dataset, batch.rows(), strict=True):
        assert row.input_ids == expected.input_ids == row.labels
    assert batch.packs() == [list(range(len(batch.lengths)))]
