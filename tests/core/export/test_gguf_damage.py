"""A cut-short or foreign .gguf is reported as damaged, with the size it should have, before anything reads it; a
whole file (a small one written by the gguf package, the bundled SmolLM2) is not."""

from __future__ import annotations

import numpy as np
import pytest

from hone.core.errors import ModelError
from hone.core.models.gguf_read import TYPE_SIZES, GgufDamaged, gguf_damage, read_gguf
from hone.core.models.load import resolve_source


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """A real GGUF (gguf.GGUFWriter): metadata with a 300-token vocabulary, an f32 and an f16 tensor; its tensor
    data is a multiple of the alignment, so the whole file is exactly as long as its last tensor's end."""
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list([f"token-{i}" for i in range(300)])
    writer.add_tensor("a", np.arange(64, dtype=np.float32))
    writer.add_tensor("b", np.ones((8, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _cut(path, size, tmp_path):
    cut = tmp_path / f"cut-{size}.gguf"
    cut.write_bytes(path.read_bytes()[:size])
    return cut


def test_the_type_table_is_the_gguf_packages():
    from gguf import GGML_QUANT_SIZES

    assert {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()} == TYPE_SIZES


def test_whole_files_are_not_damaged(small_gguf):
    from hone.core.resources import smollm2_gguf

    assert gguf_damage(small_gguf) is None
    assert gguf_damage(smollm2_gguf()) is None


def test_a_file_cut_in_its_data_says_how_long_it_should_be(small_gguf, tmp_path):
    whole = small_gguf.stat().st_size
    data_start = read_gguf(small_gguf, keys=set()).data_start
    for size in (whole - 1, data_start + 100, data_start):
        reason = gguf_damage(_cut(small_gguf, size, tmp_path))
        assert reason == (
            f"it is cut short: it should have {whole:,} bytes (to the end of the last of the 2 tensors "
            f"its header lists) but has {size:,} ({whole - size:,} missing)"
        )


def test_a_file_cut_in_its_header_says_so(small_gguf, tmp_path):
    data_start = read_gguf(small_gguf, keys=set()).data_start
    for size in (30, data_start // 2, data_start - 40):
        cut = _cut(small_gguf, size, tmp_path)
        reason = gguf_damage(cut)
        assert reason.startswith(f"it ends inside its GGUF header (the file has {size:,} bytes"), reason
        with pytest.raises(GgufDamaged):
            read_gguf(cut, keys=None)
    assert gguf_damage(_cut(small_gguf, 10, tmp_path)) == "it has 10 bytes, fewer than a GGUF header's first 24"


def test_a_file_that_is_not_gguf_says_so(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("<html>404 Not Found</html>" * 4)
    assert gguf_damage(path) == "it is not a GGUF file (it does not start with the GGUF magic bytes)"


def test_loading_a_damaged_gguf_stops_at_resolving_the_model(small_gguf, tmp_path):
    from hone.core.resources import smollm2_gguf

    assert resolve_source(str(small_gguf)).kind == "gguf"
    folder = tmp_path / "folder"
    folder.mkdir()
    cut = _cut(smollm2_gguf(), 2_000_000, folder)  # the real model: header whole, nearly all weights missing
    for name, gguf_file in ((str(cut), ""), (str(folder), ""), (str(folder), cut.name)):
        with pytest.raises(ModelError) as e:
            resolve_source(name, gguf_file)
        assert e.value.message.startswith(
            f"{cut} is damaged: it is cut short: it should have {smollm2_gguf().stat().st_size:,} bytes"
        )
        assert "but has 2,000,000" in e.value.message
        assert "download or copy the file again" in e.value.advice
