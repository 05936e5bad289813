"""The vision demo: the shipped shapes dataset is its generator's output, the demo model carries SmolLM2's real
weights, and `hone demo --vision` runs end to end (one step)."""

from __future__ import annotations

import json

import numpy as np

from hone.core.demo.vision_data import CAPITALS_EVAL, COLORS, SHAPES, make_dataset, write_shapes_dataset
from hone.core.resources import resource_path


def test_shipped_shapes_dataset_is_reproducible(tmp_path):
    from PIL import Image

    write_shapes_dataset(tmp_path)
    shipped = resource_path("datasets/shapes_vqa")
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name
    made = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert made == sorted(p.name for p in (shipped / "images").iterdir())
    for name in made:
        ours, theirs = (np.asarray(Image.open(folder / "images" / name)) for folder in (tmp_path, shipped))
        assert np.array_equal(ours, theirs), name


def test_dataset_mixes_text_rows_and_holds_out_images_and_facts():
    train, held_out, images = make_dataset()
    text_rows = [r for r in train if isinstance(r["messages"][0]["content"], str)]
    assert 0.15 < len(text_rows) / len(train) < 0.25
    train_images = {
        p["image"]
        for r in train
        for m in r["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image"
    }
    held_images = {
        p["image"]
        for q in held_out
        for m in q.row["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image"
    }
    assert not train_images & held_images and len(images) == len(train_images) + len(held_images)
    assert {q.answer for q in held_out if q.kind == "color"} <= set(COLORS)
    assert {q.answer for q in held_out if q.kind == "shape"} <= set(SHAPES)
    assert {q.answer for q in held_out if q.kind == "text"} == set(CAPITALS_EVAL.values())
    assert not any(city in json.dumps(text_rows) for city in CAPITALS_EVAL.values())


def test_drawn_colors_are_the_named_colors():
    """Each image's most common non-white pixel is (close to) the color its answer names."""
    import random

    from hone.core.demo.vision_data import draw_shape

    rng = random.Random(0)
    for color in COLORS:
        for shape in SHAPES:
            pixels = np.asarray(draw_shape(color, shape, rng)).reshape(-1, 3).astype(int)
            inside = pixels[(pixels < 250).any(1)]
            assert len(inside) > 100, (color, shape)
            assert np.abs(np.median(inside, 0) - COLORS[color]).max() < 12, (color, shape)


def test_demo_model_has_smollm2_weights_and_a_random_vision_encoder():
    import torch
    from safetensors import safe_open

    from hone.core.demo.vision_model import demo_model_folder
    from hone.core.models.load import gguf_folder
    from hone.core.resources import smollm2_gguf

    folder = demo_model_folder()
    text = gguf_folder(smollm2_gguf())
    with safe_open(str(text / "model.safetensors"), "pt") as f:
        smol = {k: f.get_tensor(k) for k in ("lm_head.weight", "model.layers.29.mlp.down_proj.weight")}
    # key layouts differ between transformers versions ("model.language_model.x" / "language_model.model.x")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        find = lambda suffix: f.get_tensor(next(n for n in names if n.endswith(suffix)))  # noqa: E731
        embed = (
            find("embed_tokens.weight")
            if any(n.endswith("embed_tokens.weight") for n in names)
            else find("lm_head.weight")
        )
        down = (
            find("language_model.layers.29.mlp.down_proj.weight")
            if any(n.endswith("language_model.layers.29.mlp.down_proj.weight") for n in names)
            else find("model.layers.29.mlp.down_proj.weight")
        )
    assert torch.equal(embed[: smol["lm_head.weight"].shape[0]], smol["lm_head.weight"])
    assert torch.equal(down, smol["model.layers.29.mlp.down_proj.weight"])
    assert any("vision_tower." in n for n in names) and any("multi_modal_projector." in n for n in names)


def test_vision_demo_command_runs_end_to_end(tmp_path, capsys):
    """A short `hone demo --vision` (1 step; 3 held-out questions, one of each kind) on SmolLM2 with its vision
    encoder: it scores, trains, writes the adapter and prints the table of every kind before and after."""
    from hone.core.cli import main

    code = main(["demo", "--vision", "--runs-dir", str(tmp_path), "--steps", "1", "--eval-rows", "3"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "held-out answers" in err and "+ Hone" in err and "chance" in err
    for kind in ("color", "shape", "text"):  # --eval-rows keeps the mix: one question of each kind, scored twice
        assert err.count(f"{kind:>5}: expected ") == 1, err[-3000:]
    run_dir = next(tmp_path.iterdir())
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((run_dir / "run.json").read_text())["step"] == 1
