"""The inspector: pieces cover the rendered text exactly, trained pieces are the assistant turns, images show
their token counts, and skipped rows say why."""

from __future__ import annotations

import pytest
from data_helpers import chat, write_jsonl

from hone.core.config import DataConfig
from hone.core.data import load_training_data
from hone.core.data.inspect import format_view, inspect_row, inspect_rows
from hone.core.errors import DataError


def test_pieces_cover_the_text_and_match_the_training_rows(tmp_path, smollm2_tokenizer):
    rows = [chat("Hi", "Hello!", "Bye", "See you.", system="Be kind."), {"messages": []}, chat("q", "a")]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    view = inspect_row(str(path), smollm2_tokenizer, 1)
    assert view.text == smollm2_tokenizer.apply_chat_template(rows[0]["messages"], tokenize=False)
    assert "".join(p.text for p in view.pieces) == view.text
    assert [p.text for p in view.pieces if p.trained] == ["Hello!<|im_end|>", "See you.<|im_end|>"]
    assert sum(p.tokens for p in view.pieces) == view.num_tokens
    trained_row = load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer).train[0]
    assert view.token_ids == trained_row.input_ids
    assert view.trained == [label != -100 for label in trained_row.labels]
    assert view.source == f"{path}:1" and view.format == "messages" and view.problem is None


def test_skipped_row_and_missing_row(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "a"), {"messages": []}])
    view = inspect_row(str(path), smollm2_tokenizer, 2)
    assert view.problem == f"{path}:2: messages: is an empty list" and not view.pieces
    assert format_view(view).startswith("skipped: ")
    with pytest.raises(DataError, match="has no row 7 \\(its last row is 2\\)"):
        inspect_row(str(path), smollm2_tokenizer, 7)


def test_truncated_row_shows_only_the_kept_text(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "word " * 60)])
    view = inspect_row(str(path), smollm2_tokenizer, 1, cfg=DataConfig(max_length=40))
    assert view.truncated and view.num_tokens == 40
    assert "".join(p.text for p in view.pieces) == smollm2_tokenizer.decode(view.token_ids)


def test_image_placeholders_with_token_counts(tmp_path, llava_processor):
    from PIL import Image

    Image.new("RGB", (30, 20), "red").save(tmp_path / "red.png")
    row = {
        "messages": [{"role": "user", "content": "<image>Color?"}, {"role": "assistant", "content": "Red."}],
        "images": ["red.png"],
    }
    path = write_jsonl(tmp_path / "a.jsonl", [row])
    (view,) = inspect_rows(str(path), llava_processor, [1])
    (image,) = view.images
    assert (image.width, image.height, image.tokens) == (30, 20, 15)
    piece = next(p for p in view.pieces if p.kind == "image")
    assert piece.text == "<image>" and piece.tokens == 15 and not piece.trained
    assert view.token_ids[image.first_token : image.first_token + 15] == [llava_processor.image_token_id] * 15
    assert "".join(p.text for p in view.pieces) == view.text
    assert "[image 15 tokens]" in format_view(view, color=False)


def test_plain_format_marks_trained_text(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "a")])
    text = format_view(inspect_row(str(path), smollm2_tokenizer, 1), color=False)
    assert "[[a<|im_end|>]]" in text and "2 trained" in text
