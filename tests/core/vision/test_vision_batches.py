"""Mixed text + image batches on tiny random-init models of each family: labels, image token counts against the
processors, forward/backward, packed == per-row, 3-D rope positions against transformers, chunked == plain loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vision_helpers import KINDS, PACKED_KINDS

from hone.core.config import RunConfig
from hone.core.data.formats import ColumnNames, normalize
from hone.core.data.images import check_image, load_image
from hone.core.data.labels import RowEncoder
from hone.core.data.tokenized import TokenizedRow
from hone.core.train.loss import loss_sum
from hone.core.vision import family_of, tiny
from hone.core.vision.collate import VisionCollator, image_token_id
from hone.core.vision.mrope import mrope_positions

MAX_SIDE = 64
# End-of-turn text each tiny family's template writes after an assistant turn.
END_OF_TURN = {"gemma3": "<end_of_turn>"}


def encode(processor, folder, rows):
    """TokenizedRows of JSON rows through the data layer (normalize, check images, render, tokenize, expand)."""
    encoder = RowEncoder(processor, max_length=512, image_max_side=MAX_SIDE)
    parsed = []
    for n, record in enumerate(rows):
        row = normalize(dict(record), "messages", ColumnNames({}), f"mixed.jsonl:{n + 1}", folder, True)
        row.images = [check_image(ref, "image") for ref in row.images]
        parsed.append(row)
    out = []
    for row, enc in zip(parsed, encoder.encode(parsed), strict=True):
        assert hasattr(enc, "ids"), enc
        labels = np.where(enc.trained, enc.ids, -100)
        out.append(
            TokenizedRow(input_ids=enc.ids.tolist(), labels=labels.tolist(), source=row.source, images=enc.images)
        )
    return out


def collator(processor, model, packing):
    return VisionCollator(
        family_of(model),
        processor,
        model.config,
        image_max_side=MAX_SIDE,
        packing=packing,
        pad_id=processor.tokenizer.pad_token_id,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_labels_cover_exactly_the_assistant_text(kind, vision_kit, mixed_rows):
    processor, _ = vision_kit(kind)
    folder, rows = mixed_rows
    tokenizer = processor.tokenizer
    end = END_OF_TURN.get(kind, "<|im_end|>")
    for record, row in zip(rows, encode(processor, folder, rows), strict=True):
        answers = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        expected = [t for a in answers for t in tokenizer(a + end, add_special_tokens=False)["input_ids"]]
        trained = [t for t, label in zip(row.input_ids, row.labels, strict=True) if label != -100]
        assert trained == expected, (kind, tokenizer.decode(trained), tokenizer.decode(expected))


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in ("qwen2_5_vl", "qwen3_vl")])
def test_image_tokens_match_the_transformers_processor(kind, vision_kit, mixed_rows):
    """Image tokens and the family's image markers, in order, as transformers' own processor writes them for the
    rendered conversation and the size-limited images."""
    processor, model = vision_kit(kind)
    folder, rows = mixed_rows
    feature = image_token_id(model.config)
    tokenizer = processor.tokenizer
    markers = {feature} | {tokenizer.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS[kind]}
    encoder = RowEncoder(processor, max_length=512, image_max_side=MAX_SIDE)
    for record, row in zip(rows, encode(processor, folder, rows), strict=True):
        text, _ = encoder.template.render_with_spans(
            normalize(dict(record), "messages", ColumnNames({}), "x:1", folder, True).messages
        )
        images = [load_image(ref, MAX_SIDE) for ref in row.images]
        reference = processor(text=[text], images=images or None, add_special_tokens=False)["input_ids"][0]
        ours = [t for t in row.input_ids if t in markers]
        theirs = [t for t in reference if t in markers]
        assert ours == theirs, (kind, len(ours), len(theirs))


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_qwen_image_tokens_match_the_image_grid(kind, vision_kit, mixed_rows):
    """Qwen: grid_t * grid_h * grid_w / merge**2 image tokens per image, from transformers' image processor."""
    processor, model = vision_kit(kind)
    folder, rows = mixed_rows
    for row in encode(processor, folder, rows):
        images = [load_image(ref, MAX_SIDE) for ref in row.images]
        expected = 0
        if images:
            grid = processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"]
            expected = int(grid.prod(-1).sum()) // 4
        assert row.input_ids.count(model.config.image_token_id) == expected


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_batch_runs_forward_and_backward(kind, vision_kit, mixed_rows):
    processor, model = vision_kit(kind)
    folder, rows = mixed_rows
    batch = collator(processor, model, packing=True).collate(encode(processor, folder, rows))
    assert batch.num_images == 3 and batch.pixels["pixel_values"].dtype == torch.float32
    model.zero_grad()
    loss = loss_sum(model, batch, mode="plain")
    loss.backward()
    assert torch.isfinite(loss)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    patches = [g for n, g in grads.items() if "patch_embed" in n and n.endswith("weight")]
    assert patches, "the image encoder's first layer is not in the graph"
    family = family_of(model)
    vision = sum(
        g.abs().sum()
        for n, g in grads.items()
        if any(f".{v}." in n for v in family.vision_modules + family.projector_modules)
    )
    # (Gemma 3 initializes its projection to zeros, so on a fresh model only the projection itself moves)
    assert vision > 0, "no gradient reached the vision side"
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", KINDS)
def test_batched_loss_and_gradients_equal_the_rows_one_by_one(kind, vision_kit, mixed_rows):
    """Packed rows (padded for Gemma 3) give the summed loss and gradients of each row run alone."""
    processor, model = vision_kit(kind)
    folder, rows = mixed_rows
    tokenized = encode(processor, folder, rows)
    make = collator(processor, model, packing=True)
    assert make.collate(tokenized).packed == (kind in PACKED_KINDS)
    assert_batched_equals_rows_alone(kind, model, make, tokenized)


def assert_batched_equals_rows_alone(kind, model, make, tokenized) -> None:
    """The rows in one batch give the summed loss and the gradients of each row run alone."""
    model.zero_grad()
    together = loss_sum(model, make.collate(tokenized), mode="plain")
    together.backward()
    grads_together = _grads(model)
    model.zero_grad()
    alone = sum(loss_sum(model, make.collate([row]), mode="plain") for row in tokenized)
    alone.backward()
    grads_alone = _grads(model)
    model.zero_grad()
    assert torch.allclose(together, alone, rtol=1e-5), (float(together), float(alone))
    assert grads_together.keys() == grads_alone.keys()
    # relative to each parameter's own gradient, with a floor for gradients that are zero in exact arithmetic (a
    # key bias: softmax ignores it) and only rounding noise here
    scale = max(g.abs().max().item() for g in grads_alone.values())
    worst = max(
        (grads_together[n] - grads_alone[n]).abs().max().item() / (grads_alone[n].abs().max().item() + 1e-4 * scale)
        for n in grads_alone
    )
    assert worst < 1e-3, f"{kind}: gradients differ by {worst:.2e} (relative)"


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_loss_equals_plain(kind, vision_kit, mixed_rows):
    processor, model = vision_kit(kind)
    folder, rows = mixed_rows
    batch = collator(processor, model, packing=True).collate(encode(processor, folder, rows))
    plain, chunked = loss_sum(model, batch, mode="plain"), loss_sum(model, batch, mode="chunked", chunk_tokens=5)
    assert torch.allclose(plain, chunked, rtol=1e-5), (float(plain), float(chunked))


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_mrope_positions_equal_transformers_rope_index(kind, vision_kit, mixed_rows):
    import inspect

    processor, model = vision_kit(kind)
    folder, rows = mixed_rows
    token = model.config.image_token_id
    for row in encode(processor, folder, rows):
        images = [load_image(ref, MAX_SIDE) for ref in row.images]
        grid = processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"] if images else None
        ours = mrope_positions(row.input_ids, grid.tolist() if grid is not None else [], token, 2)
        ids = torch.tensor([row.input_ids])
        if grid is None:
            reference = np.broadcast_to(np.arange(len(row.input_ids)), (3, len(row.input_ids)))
        else:
            kwargs = {"image_grid_thw": grid}
            if "mm_token_type_ids" in inspect.signature(model.model.get_rope_index).parameters:
                kwargs["mm_token_type_ids"] = (ids == token).int()
            reference = model.model.get_rope_index(ids, **kwargs)[0][:, 0].numpy()
        np.testing.assert_array_equal(ours, reference)


def test_mrope_positions_reject_a_grid_that_does_not_fit():
    with pytest.raises(ValueError, match="does not match"):
        mrope_positions([1, 9, 9, 9, 2], [(1, 4, 4)], 9, 2)  # 4 tokens needed, 3 present


def test_padded_family_pads_and_marks_image_tokens(vision_kit, mixed_rows):
    if "gemma3" not in KINDS:
        pytest.skip("no Gemma 3 processor here")
    processor, model = vision_kit("gemma3")
    folder, rows = mixed_rows
    batch = collator(processor, model, packing=True).collate(encode(processor, folder, rows))
    assert not batch.packed and batch.text.input_ids.shape[0] == len(rows)
    soft = model.config.image_token_id
    assert torch.equal(batch.token_type_ids.bool(), batch.text.input_ids == soft)
    assert int(batch.token_type_ids.sum()) == 3 * model.config.mm_tokens_per_image


def test_run_config_collator_describes_its_choice(vision_kit):
    from hone.core.vision import collator_for

    processor, model = vision_kit("qwen2_5_vl")
    config = RunConfig().with_overrides(["speed.packing=false", "data.image_max_side=96"])
    made = collator_for(model, processor, config)
    assert not made.packed and made.image_max_side == 96 and "Qwen2.5-VL" in made.describe()
