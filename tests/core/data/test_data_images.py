"""Image rows: references in every form, lazy loading with a size bound, and token expansion through a real
vision processor, with text-only rows in the same dataset."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from data_helpers import chat, write_jsonl

from hone.core.config import DataConfig
from hone.core.data import IGNORE_INDEX, load_training_data
from hone.core.data.images import (
    KEEP_REDUCED_PIXELS,
    ImageStore,
    check_image,
    fitted_size,
    load_image,
    parse_image_ref,
)
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
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": "red.png"}, {"type": "text", "text": "Color?"}],
                },
                {"role": "assistant", "content": "Red."},
            ]
        },
        chat("Text only here", "Fine."),
        {
            "messages": [
                {"role": "user", "content": "Compare <image> and <image>."},
                {"role": "assistant", "content": "Red, then blue."},
            ],
            "images": ["red.png", "blue.png"],
        },
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
            messages = [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Compare "},
                        {"type": "image"},
                        {"type": "text", "text": " and "},
                        {"type": "image"},
                        {"type": "text", "text": "."},
                    ],
                },
                messages[1],
            ]
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
    row = {
        "messages": [
            {"role": "user", "content": "Look: <image> then <image>"},
            {"role": "assistant", "content": "ok " * 40},
        ],
        "images": ["red.png", "red.png"],
    }
    path = write_jsonl(tmp_path / "v.jsonl", [row])
    full = load_training_data(DataConfig(train=[str(path)], max_length=4096), llava_processor).train[0]
    image_id = llava_processor.tokenizer.convert_tokens_to_ids("<image>")
    second = [i for i, t in enumerate(full.input_ids) if t == image_id][15]  # first token of the second image
    cut = load_training_data(
        DataConfig(train=[str(path)], max_length=second + 5, overlong="truncate", train_on="all"), llava_processor
    )
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


@pytest.fixture
def decodes(monkeypatch):
    """Every decode Pillow does from here on, as (file name, decoded size): the size of the pixels it produced."""
    from PIL import ImageFile

    seen = []
    original = ImageFile.ImageFile.load

    def load(self):
        if self.tile:  # pixels still to decode (a loaded image has none)
            seen.append((Path(getattr(self, "filename", "") or "").name, self.size))
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return seen


def test_a_large_jpeg_is_decoded_once_at_reduced_scale_and_kept_at_the_model_size(tmp_path, decodes):
    from PIL import Image

    Image.new("RGB", (6000, 4000), "red").save(tmp_path / "big.jpg", quality=90)
    assert KEEP_REDUCED_PIXELS < 6000 * 4000
    ref = ImageStore(tmp_path / "cache", max_side=768).check(parse_image_ref("big.jpg", tmp_path, "f"), "f")
    assert (ref.kind, ref.width, ref.height) == ("path", 6000, 4000)
    # JPEG draft mode at 1/4 scale, the smallest that still covers 768 x 512 (1/8 gives 750 x 500): 1/16 of the pixels.
    assert decodes == [("big.jpg", (1500, 1000))]
    with Image.open(ref.cached) as copy:
        assert (copy.format, copy.size) == ("PNG", (768, 512)) == ("PNG", fitted_size(6000, 4000, 768))
    for _ in range(3):  # training steps read the small copy
        assert load_image(ref, 768).size == (768, 512)
    assert decodes[1:] == [(Path(ref.cached).name, (768, 512))] * 3
    again = ImageStore(tmp_path / "cache", max_side=768).check(parse_image_ref("big.jpg", tmp_path, "f"), "f")
    assert again == ref and len(decodes) == 4  # the next run's check finds the copy and decodes nothing


def test_a_large_png_is_decoded_in_full_once_then_never_again(tmp_path, decodes):
    from PIL import Image

    Image.new("RGB", (5000, 4000), "blue").save(tmp_path / "big.png")
    ref = ImageStore(tmp_path / "cache", max_side=500).check(parse_image_ref("big.png", tmp_path, "f"), "f")
    assert decodes == [("big.png", (5000, 4000))]  # PNG has no reduced-scale decoding
    assert [load_image(ref, 500).getpixel((0, 0)) for _ in range(3)] == [(0, 0, 255)] * 3
    assert [name for name, _ in decodes] == ["big.png"] + [Path(ref.cached).name] * 3


def test_a_mid_size_jpeg_is_read_directly_at_reduced_scale(tmp_path, decodes):
    from PIL import Image

    Image.new("RGB", (3000, 2000), "green").save(tmp_path / "mid.jpg")
    ref = ImageStore(tmp_path / "cache", max_side=256).check(parse_image_ref("mid.jpg", tmp_path, "f"), "f")
    assert ref.cached == "" and not (tmp_path / "cache" / "images").exists()  # below the threshold: no copy
    assert load_image(ref, 256).size == (256, 171)
    assert decodes[-1] == ("mid.jpg", (375, 250))  # draft at 1/8, not the 3000 x 2000 a full decode makes


def test_decompression_bombs_are_still_refused(tmp_path, decodes, monkeypatch):
    from PIL import Image

    _png(tmp_path / "bomb.png", (200, 200))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)  # Pillow refuses over twice this: 40,000 > 20,000
    with pytest.raises(RowError) as info:
        ImageStore(tmp_path / "cache", max_side=64).check(parse_image_ref("bomb.png", tmp_path, "f"), "f")
    assert info.value.reason == "image unreadable" and "decompression bomb" in info.value.detail
    assert decodes == []
