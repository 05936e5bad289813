"""Values kept beside the tokenized data (the reference log-probabilities of preference runs): written atomically,
read back only when every array is what was written and what the reader expects, and keyed by the stored tokens."""

from __future__ import annotations

import numpy as np
import pytest

from hone.core.data import cache
from hone.core.data.tokenized import TokenizedSetBuilder

EXPECTED = {"values": (np.float32, (5,)), "known": (np.bool_, (5,))}


@pytest.fixture
def entry(tmp_path):
    folder = tmp_path / "reference" / "key"
    values = np.array([-1.5, -2.25, np.nan, -0.125, -7.0], dtype=np.float32)
    known = np.array([True, True, False, True, True])
    cache.save_checked_arrays(folder, {"values": values, "known": known}, {"what": "test"})
    return folder, values, known


def test_arrays_come_back_as_written(entry):
    folder, values, known = entry
    got = cache.load_checked_arrays(folder, EXPECTED)
    np.testing.assert_array_equal(got["values"], values)  # NaN where not known, bit for bit
    np.testing.assert_array_equal(got["known"], known)
    assert [p.name for p in folder.parent.iterdir()] == ["key"]  # no temporary folder left beside it


def test_a_new_entry_replaces_the_old_one(entry):
    folder, values, known = entry
    cache.save_checked_arrays(folder, {"values": values * 2, "known": known}, {})
    np.testing.assert_array_equal(cache.load_checked_arrays(folder, EXPECTED)["values"], values * 2)


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: (f / "values.npy").write_bytes((f / "values.npy").read_bytes()[:-4]),  # cut short
        lambda f: (f / "values.npy").write_bytes((f / "values.npy").read_bytes()[:-1] + b"\x00"),  # a byte changed
        lambda f: (f / "known.npy").unlink(),  # a file missing
        lambda f: (f / "meta.json").write_text("{not json", encoding="utf-8"),
        lambda f: (f / "meta.json").write_text('{"arrays": {}}', encoding="utf-8"),  # no checks for the arrays
        lambda f: (f / "values.npy").write_bytes(b"\x93NUMPY" + b"\x00" * 10_000),  # larger than its values can be
    ],
    ids=["cut", "changed", "missing", "meta", "no checks", "too large"],
)
def test_a_damaged_entry_is_not_trusted(entry, damage):
    folder, _, _ = entry
    damage(folder)
    assert cache.load_checked_arrays(folder, EXPECTED) == {}


def test_an_entry_of_another_shape_or_type_is_not_read(entry):
    folder, _, _ = entry
    assert cache.load_checked_arrays(folder, {"values": (np.float32, (6,))}) == {}
    assert cache.load_checked_arrays(folder, {"values": (np.float64, (5,))}) == {}
    assert cache.load_checked_arrays(folder.parent / "absent", EXPECTED) == {}


def _tokens(rows):
    builder = TokenizedSetBuilder()
    for ids, trained in rows:
        builder.add(np.array(ids, np.int32), np.array(trained, bool), "f.jsonl:1")
    return builder.build()


def test_the_tokens_fingerprint_follows_the_stored_tokens_not_the_subset_shown():
    rows = [([1, 2, 3], [0, 1, 1]), ([4, 5], [0, 1])]
    data = _tokens(rows)
    assert cache.tokens_fingerprint(data) == cache.tokens_fingerprint(_tokens(rows))
    assert cache.tokens_fingerprint(data.subset([1])) == cache.tokens_fingerprint(data)  # one table for every split
    assert cache.tokens_fingerprint(_tokens([([1, 2, 3], [0, 1, 1]), ([4, 6], [0, 1])])) != cache.tokens_fingerprint(
        data
    )  # another token
    assert cache.tokens_fingerprint(_tokens([([1, 2, 3], [0, 0, 1]), ([4, 5], [0, 1])])) != cache.tokens_fingerprint(
        data
    )  # another token trained
    assert cache.tokens_fingerprint(_tokens([([1, 2], [0, 1]), ([3, 4, 5], [1, 0, 1])])) != cache.tokens_fingerprint(
        data
    )  # the same tokens cut into rows elsewhere
