"""Holding out evaluation rows (data.eval_fraction) is one rule for supervised rows, preference pairs and KTO's
labelled answers: the same rows held out for the same (count, fraction, seed), and the splits of the bundled data
exactly the ones the three loaders gave before they shared the rule (recorded below)."""

from __future__ import annotations

import numpy as np
import pytest

from hone.core.config import DataConfig
from hone.core.data import load_training_data
from hone.core.data.holdout import hold_out
from hone.core.data.preference import load_preference_data
from hone.core.data.unpaired import load_unpaired_data
from hone.core.demo.preference_data import write_preference_dataset
from hone.core.resources import resource_path

pytestmark = pytest.mark.core

# The row numbers (as the data report prints them) held out of the bundled demo data, recorded from the three
# loaders before they shared the hold-out rule. SFT: resources/datasets/json_extract/train.jsonl (360 rows);
# pairs: the preference demo's train.jsonl (36 pairs); KTO: the same pairs unpaired (72 answers: row, desirable).
RECORDED = {
    (0.1, 0): {
        "sft": [5, 8, 10, 17, 33, 40, 61, 63, 71, 75, 105, 109, 131, 143, 145, 166, 180, 184, 185, 186, 188, 190,
                191, 192, 193, 205, 247, 251, 257, 293, 298, 313, 316, 323, 328, 329],
        "pairs": [5, 10, 16, 27],
        "kto": [(1, True), (5, False), (19, True), (23, True), (32, False), (36, True), (36, False)],
        "train sizes": (324, 32, 65),
    },
    (0.25, 7): {
        "sft": [11, 12, 14, 15, 19, 21, 24, 26, 30, 39, 41, 44, 45, 50, 53, 58, 60, 62, 70, 74, 76, 83, 93, 102, 104,
                108, 110, 111, 115, 117, 119, 121, 125, 127, 128, 129, 130, 131, 133, 134, 137, 142, 144, 146, 149,
                150, 159, 161, 166, 168, 170, 176, 179, 183, 184, 185, 190, 191, 203, 208, 213, 215, 219, 222, 228,
                231, 233, 251, 255, 266, 268, 270, 276, 283, 290, 293, 296, 304, 306, 307, 314, 319, 323, 326, 328,
                335, 342, 346, 348, 351],
        "pairs": [6, 7, 12, 21, 23, 24, 26, 27, 32],
        "kto": [(3, True), (5, True), (6, True), (6, False), (8, False), (10, True), (11, True), (21, False),
                (23, True), (24, True), (25, True), (26, False), (28, True), (29, False), (30, False), (31, False),
                (32, True), (34, False)],
        "train sizes": (270, 27, 54),
    },
}  # fmt: skip


def _numbers(rows) -> list[int]:
    return [int(rows.source(i).rpartition(":")[2]) for i in range(len(rows))]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    train, _ = write_preference_dataset(tmp_path_factory.mktemp("pairs"))
    return str(train)


@pytest.mark.parametrize("fraction, seed", list(RECORDED))
def test_every_loader_holds_out_the_rows_it_held_out_before(fraction, seed, pairs_file, smollm2_tokenizer, tmp_path):
    want = RECORDED[(fraction, seed)]
    sft_file = str(resource_path("datasets/json_extract/train.jsonl"))
    sft = load_training_data(
        DataConfig(train=[sft_file], eval_fraction=fraction), smollm2_tokenizer, seed=seed, cache_dir=tmp_path
    )
    pairs = load_preference_data(DataConfig(train=[pairs_file], eval_fraction=fraction), smollm2_tokenizer, seed=seed)
    kto = load_unpaired_data(DataConfig(train=[pairs_file], eval_fraction=fraction), smollm2_tokenizer, seed=seed)
    assert _numbers(sft.eval) == want["sft"]
    assert _numbers(pairs.eval) == want["pairs"]
    assert list(zip(_numbers(kto.eval), kto.eval.desirable.tolist(), strict=True)) == want["kto"]
    assert (len(sft.train), len(pairs.train), len(kto.train)) == want["train sizes"]
    # every row on exactly one side, and the reports count them
    for data, total in ((sft, 360), (pairs, 36), (kto, 72)):
        assert len(data.train) + len(data.eval) == total
        train_report, eval_report = data.reports
        assert (train_report.held_out, eval_report.rows_kept) == (len(data.eval), len(data.eval))
        assert f"seed {seed}" in " ".join(eval_report.notes)


@pytest.mark.parametrize("count, fraction", [(2, 0.01), (2, 0.99), (5, 0.5), (37, 0.1), (1000, 0.03)])
def test_the_hold_out_rule_keeps_a_row_on_each_side_and_follows_the_seed(count, fraction):
    held, kept = hold_out(count, fraction, seed=3)
    assert len(held) == min(count - 1, max(1, round(count * fraction))) and len(kept) == count - len(held)
    assert sorted(np.concatenate([held, kept]).tolist()) == list(range(count))
    assert list(held) == sorted(held) and list(kept) == sorted(kept)
    # the rule itself, written out: the first rows of a permutation seeded with (seed, 0x5EED)
    picked = np.random.default_rng([3, 0x5EED]).permutation(count)[: len(held)]
    assert held.tolist() == sorted(picked.tolist())
