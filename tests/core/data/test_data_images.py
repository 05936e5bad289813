"""Image rows: references in every form, lazy loading with a size bound, and token expansion through a real
vision processor, with text-only rows in the same dataset."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from data_helpers import chat, write_jsonl

from hone.core.config import DataConfig
from hone.core.data import IGNORE_INDEX, load_training_data
from hone.core.data.images import check_image, load_image, parse_image_ref
from hone.core.data.rows import RowError


def _png(path, size=(120, 80), color="red"):
    from PIL import Image

    Image.new("RGB", size, color).save(path)
    return path


def test_reference_forms(tmp_path):
    raw = _png(tmp_path / "x.png").read_bytes()
    b64 = base64.b64encode(raw).decode()
    assert parse_image_ref("x.png", tmp_path, "f").value == str(tmp_path / "x.png")
    assert parse_image_ref(str(tmp_path / "x.png"), None, "f").value == str(tmp_path / "x.png")
    assert parse_image_ref(f"file://{tmp_path / 'x.png'}", None, "f").kind == "path"
    assert parse_image_ref("https://example.org/cat.jpg", tmp_path, "f").kind == "url"
    assert parse_image_ref(f"data:image/png;base64,{b64}", None, "f").data == raw
    assert parse_image_ref(raw, None, "f").data == raw
    assert parse_image_ref({"bytes": raw, "path": None}, None, "f").data == raw
    assert parse_image_ref({"bytes": None, "path": "x.png"}, tmp_path, "f").value == str(tmp_path / "x.png")
    with pytest.raises(RowError, match="expected a path"):
        parse_image_ref(3.5, None, "f")


def test_check_reads_the_size_and_load_bounds_the_longest_side(tmp_path):
    ref = check_image(parse_image_ref(_png(tmp_path / "x.png", (300, 120)).name, tmp_path, "f"), "f")
    assert (ref.width, ref.height) == (300, 120)
    image = load_image(ref, max_side=100)
    assert image.mode == "RGB" and image.size == (100, 40)
    assert load_image(ref, max_side=1000).size == (300, 120)


def test_jpeg_truncated_is_caught_by_the_check(tmp_path):
    from PIL import Image

    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "x.jpg", quality=90)
    data = (tmp_path / "x.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    assert check_image(parse_image_ref("x.jpg", tmp_path, "f"), "f").width == 64
    with pytest.raises(RowError) as info:
        check_image(parse_image_ref("cut.jpg", tmp_path, "f"), "f")
    assert info.value.reason == "image unreadable"


def _vision_rows(tmp_path):
    _png(tmp_path / "red.png")
    _png(tmp_path / "blue.png", (40, 90), "blue")
    return [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                                   {"type": "text", "text": "Color?"}]},
                      {"role": "assistant", "content": "Red."}]},
        chat("Text only here", "Fine."),
        {"messages": [{"role": "user", "content": "Compare <image> and <image>."},
                      {"role": "assistant", "content": "Red, then blue."}], "images": ["red.png", "blue.png"]},
    ]


def test_vision_rows_expand_like_the_processor_and_never_train_image_tokens(tmp_path, llava_processor):
    from PIL import Image

    rows = _vision_rows(tmp_path)
    path = write_jsonl(tmp_path / "v.jsonl", rows)
    data = load_training_data(DataConfig(train=[str(path)]), llava_processor)
    report = data.reports[0]
    assert (report.rows_kept, report.image_rows) == (3, 2) and not report.skipped
    image_id = llava_processor.tokenizer.convert_tokens_to_ids("<image>")
    expected_images = [["red.png"], [], ["red.png", "blue.png"]]
    for row, names in zip(data.train, expected_images, strict=True):
        # Reference: the processor's own expansion of the rendered text with the same images.
        k = int(row.source.rsplit(":", 1)[1]) - 1
        messages = rows[k]["messages"]
        if k == 2:
            messages = [{"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                                     {"type": "text", "text": " and "}, {"type": "image"},
                                                     {"type": "text", "text": "."}]}, messages[1]]
        text = llava_processor.apply_chat_template(messages, tokenize=False)
        pictures = [Image.open(tmp_path / n) for n in names] or None
        reference = llava_processor(text=[text], images=pictures)["input_ids"][0]
        reference = reference.tolist() if hasattr(reference, "tolist") else list(reference)
        assert row.input_ids == reference, row.source
        ids, labels = np.array(row.input_ids), np.array(row.labels)
        assert (ids == image_id).sum() == 15 * len(names)
        assert np.all(labels[ids == image_id] == IGNORE_INDEX)
        assert [img.value.rsplit("/", 1)[1] for img in row.images] == names
    trained = [t for t, label in zip(data.train[2].input_ids, data.train[2].labels, strict=True) if label != -100]
    assert llava_processor.tokenizer.decode(trained) == "Red, then blue.<|im_end|>"


def test_truncation_never_cuts_an_image_in_half(tmp_path, llava_processor):
    _png(tmp_path / "red.png")
    row = {"messages": [{"role": "user", "content": "Look: <image> then <image>"},
                        {"role": "assistant", "content": "ok " * 40}], "images": ["red.png", "red.png"]}
    path = write_jsonl(tmp_path / "v.jsonl", [row])
    full = load_training_data(DataConfig(train=[str(path)], max_length=4096), llava_processor).train[0]
    image_id = llava_processor.tokenizer.convert_tokens_to_ids("<image>")
    second = [i for i, t in enumerate(full.input_ids) if t == image_id][15]  # first token of the second image
    cut = load_training_data(DataConfig(train=[str(path)], max_length=second + 5, overlong="truncate",
                                        train_on="all"), llava_processor)
    kept = cut.train[0]
    assert kept.input_ids == full.input_ids[:second], "the row should end right before the second image"
    assert len(kept.images) == 1 and cut.reports[0].truncated == 1


def test_missing_image_skips_the_row_not_the_run(tmp_path, llava_processor):
    rows = _vision_rows(tmp_path)
    (tmp_path / "blue.png").unlink()
    path = write_jsonl(tmp_path / "v.jsonl", rows)
    data = load_training_data(DataConfig(train=[str(path)]), llava_processor)
    assert data.reports[0].skipped == {"image missing": 1} and len(data.train) == 2
    assert f"{path}:3: image 2: image file" in data.reports[0].skipped_examples[0]


def test_image_refs_survive_the_cache(tmp_path, llava_processor):
    path = write_jsonl(tmp_path / "v.jsonl", _vision_rows(tmp_path))
    first = load_training_data(DataConfig(train=[str(path)]), llava_processor)
    second = load_training_data(DataConfig(train=[str(path)]), llava_processor)
    assert [r.images for r in first.train] == [r.images for r in second.train]
    assert second.train[0].images[0].width == 120
    assert json.dumps([r.input_ids for r in first.train]) == json.dumps([r.input_ids for r in second.train])
