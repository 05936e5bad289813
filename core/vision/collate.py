"""Batches for vision-language models: text-only rows and image rows together, pixels next to the ids.

The text part is built by `hone.core.data.collate`, so targets, trained positions and token counts are exactly
those of a text model; `VisionCollator` adds the batch's images, run through the model's image processor, and the
family's extra inputs. Each row's image tokens are checked against what its images expand to, so a file that
changed since tokenization is reported with its row instead of failing deep inside the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from hone.core.data.collate import PackedBatch, PaddedBatch, collate_packed, collate_padded
from hone.core.data.image_tokens import image_expansion_for
from hone.core.data.images import load_image
from hone.core.errors import DataError
from hone.core.resources import cache_root
from hone.core.vision import host_merge
from hone.core.vision.families import PACKED, VisionFamily, family_of
from hone.core.vision.mrope import mrope_positions

# Image processor outputs the models' forward methods take; anything else (row/column counts, crop counts) is
# bookkeeping the processor needed for the text side, which the data layer already expanded.
PIXEL_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes")
# Keyword arguments of Hone's packed attention backends. They go into the model call only when its language model
# runs one of them: transformers' own attention finds sequence starts from the position ids, and these would only
# reach the vision tower's attention. (The image encoder keeps transformers' attention either way.)
_TEXT_ATTENTION_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_HONE_ATTENTION_PREFIX = "hone_"  # the names hone.core.speed.attention registers its backends under


def _move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if tensor.device == device:
        return tensor
    return tensor.to(device, non_blocking=tensor.is_pinned())


@dataclass
class VisionBatch:
    """A text batch (packed or padded) plus its images' model inputs.

    Attributes:
        text: the PackedBatch or PaddedBatch of the rows' token ids and targets.
        pixels: image processor outputs for every image of the batch, in row order (empty without images);
            e.g. `pixel_values` (float, model dtype) and `image_grid_thw` (int64 [N, 3]).
        position_ids: Qwen-VL only: int64 [4, B, T], the text positions then the 3-D rope positions.
        token_type_ids: Gemma 3 only: int64 [B, T], 1 on image tokens.
        num_images: images in the batch.
        image_positions: with the host-side merge (hone.core.vision.host_merge): int64, each image token's flat
            index in the batch; None otherwise.
    """

    text: PackedBatch | PaddedBatch
    pixels: dict[str, torch.Tensor] = field(default_factory=dict)
    position_ids: torch.Tensor | None = None
    token_type_ids: torch.Tensor | None = None
    num_images: int = 0
    attention_kwargs: bool = False  # the packed-attention metadata goes into the model call (Hone's attention)
    image_positions: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.text.num_tokens

    @property
    def num_trained(self) -> int:
        return self.text.num_trained

    @property
    def targets(self) -> torch.Tensor:
        return self.text.targets

    @property
    def trained_positions(self) -> torch.Tensor | None:
        return self.text.trained_positions

    @property
    def packed(self) -> bool:
        return isinstance(self.text, PackedBatch)

    def to(self, device: torch.device | str) -> VisionBatch:
        device = torch.device(device)
        # with the host-side merge the image grid stays on the host: the encoder's metadata is built from it there
        stays = ("image_grid_thw",) if self.image_positions is not None else ()
        return replace(
            self,
            text=self.text.to(device),
            pixels={k: v if k in stays else _move(v, device) for k, v in self.pixels.items()},
            image_positions=None if self.image_positions is None else _move(self.image_positions, device),
            position_ids=None if self.position_ids is None else _move(self.position_ids, device),
            token_type_ids=None if self.token_type_ids is None else _move(self.token_type_ids, device),
        )

    def model_inputs(self) -> dict:
        """Keyword arguments for `model(**...)`: ids, positions, mask (padded), pixels and the family's extras."""
        inputs = {
            k: v
            for k, v in self.text.model_inputs().items()
            if self.attention_kwargs or k not in _TEXT_ATTENTION_KWARGS
        }
        if self.image_positions is not None:
            inputs[host_merge.KWARG] = host_merge.HostImages(
                self.pixels["pixel_values"],
                self.image_positions,
                self.pixels.get("image_grid_thw"),
                self.pixels.get("pixel_attention_mask"),
            )
        else:
            inputs.update(self.pixels)
        if self.position_ids is not None:
            inputs["position_ids"] = self.position_ids
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        return inputs


class VisionCollator:
    """Builds VisionBatches for one model and processor.

    Args:
        family: the model's VisionFamily (hone.core.vision.families).
        processor: the model's processor (transformers', or hone.core.vision.processor.ImageTextProcessor).
        model_config: the model's transformers config (image token id, vision settings).
        image_max_side: data.image_max_side; images are scaled to it exactly as during tokenization.
        packing: speed.packing; families that cannot pack pad instead.
        pad_id: the padding token id.
        dtype: floating point pixel tensors are cast to this (the model's dtype).
    """

    def __init__(
        self,
        family: VisionFamily,
        processor,
        model_config,
        *,
        image_max_side: int,
        packing: bool,
        pad_id: int,
        dtype: torch.dtype = torch.float32,
    ):
        self.family, self.processor, self.config = family, processor, model_config
        self.image_max_side, self.pad_id, self.dtype = image_max_side, pad_id, dtype
        self.packed = packing and family.batching == PACKED
        self.image_token_id = image_token_id(model_config)
        self.expansion = image_expansion_for(processor, image_max_side)

    @property
    def text_attention_kwargs(self) -> bool:
        """Whether the language model runs Hone's packed attention now (read per batch: the speed paths install
        it after the collator may have been made)."""
        text = getattr(self.config, "text_config", None) or self.config
        return self.packed and str(getattr(text, "_attn_implementation", "")).startswith(_HONE_ATTENTION_PREFIX)

    def describe(self) -> str:
        how = "packed rows" if self.packed else "padded rows"
        why = self.family.why  # how transformers' own attention keeps the rows apart
        if self.text_attention_kwargs:
            why = "each sequence's start goes to Hone's packed attention, no mask" + (
                "; 3-D rope positions built per sequence" if self.family.mrope else ""
            )
            if host_merge.installed(self.config):
                why += "; image features merged at positions known on the host (no host sync)"
        return f"{self.family.name}: {how}, images up to {self.image_max_side} px; {why}"

    def collate(self, rows: Sequence, *, pin_memory: bool = False) -> VisionBatch:
        """One batch from tokenized rows (TokenizedRow: input_ids, labels, source, images), built on the CPU:

        - the text part with `hone.core.data.collate` (packed rows for families that accept them, else padded
          rows);
        - every image of the batch, decoded and scaled to `data.image_max_side`, run through the model's image
          processor in one call (`pixel_values` and the family's companions: `image_grid_thw`,
          `pixel_attention_mask`);
        - Qwen-VL's 3-D rope positions per sequence (hone.core.vision.mrope), Gemma 3's `token_type_ids`.

        Rows without images contribute no pixels; a batch of text-only rows carries no pixel tensors at all.

        Raises:
            DataError: an image cannot be read any more, or a row's image tokens do not match its images.
        """
        if self.packed:
            text = collate_packed(rows, pin_memory=pin_memory)
        else:
            text = collate_padded(rows, pad_id=self.pad_id, pin_memory=pin_memory)
        images, per_row = self._load_images(rows)
        pixels = self._pixels(images) if images else {}
        batch = VisionBatch(
            text=text, pixels=pixels, num_images=len(images), attention_kwargs=self.text_attention_kwargs
        )
        if images and self.text_attention_kwargs and host_merge.installed(self.config):
            positions = host_merge.image_positions(text.input_ids, self.image_token_id)
            batch.image_positions = positions.pin_memory() if pin_memory else positions
            mask = pixels.get("pixel_attention_mask")
            if mask is not None and bool(mask.all()):  # every pixel real: the encoder needs no mask
                del pixels["pixel_attention_mask"]
        if self.family.mrope:
            batch.position_ids = self._mrope(rows, per_row, pixels.get("image_grid_thw"), text)
        if self.family.token_types:
            batch.token_type_ids = (text.input_ids == self.image_token_id).to(torch.int64)
        return batch

    def prompt_inputs(self, row) -> dict[str, torch.Tensor]:
        """What `generate` takes besides the ids for one row's prompt: its images' pixels (and the family's
        companions) and Gemma 3's `token_type_ids`; {} for a row without images.

        Raises:
            DataError: as `collate`.
        """
        images, _ = self._load_images([row])
        if not images:
            return {}
        out = self._pixels(images)
        if self.family.token_types:
            out["token_type_ids"] = (torch.tensor([row.input_ids]) == self.image_token_id).to(torch.int64)
        return out

    def _load_images(self, rows) -> tuple[list, list[int]]:
        """Every image of the batch in row order, and how many each row has."""
        images, per_row = [], []
        for row in rows:
            loaded = []
            for k, ref in enumerate(getattr(row, "images", None) or []):
                try:
                    loaded.append(load_image(ref, self.image_max_side))
                except Exception as e:  # a file deleted or replaced since the data was checked
                    raise DataError(
                        f"{row.source}: image {k + 1} ({ref.describe()}) can no longer be read: {e}",
                        "restore the file, or fix the row and start the run again",
                    ) from None
            self._check_tokens(row, loaded)
            images += loaded
            per_row.append(len(loaded))
        return images, per_row

    def _check_tokens(self, row, images) -> None:
        if self.expansion is None:
            return
        expected = sum(
            int(np.count_nonzero(self.expansion.expand(*image.size) == self.image_token_id)) for image in images
        )
        found = sum(1 for t in row.input_ids if t == self.image_token_id)
        if expected != found:
            raise DataError(
                f"{row.source}: {found} image tokens for images that need {expected}",
                "an image changed since the data was tokenized; clear the data cache "
                f"({cache_root('datasets')}) and start the run again",
            )

    def _pixels(self, images) -> dict[str, torch.Tensor]:
        processor = self.processor.image_processor
        batch = processor(images=[images] if self.family.nested_pixels else images, return_tensors="pt")
        out = {}
        for key in PIXEL_KEYS:
            value = batch.get(key)
            if value is None:
                continue
            value = torch.as_tensor(value)
            out[key] = value.to(self.dtype) if value.is_floating_point() and key == "pixel_values" else value
        return out

    def _mrope(self, rows, per_row: list[int], grids, text) -> torch.Tensor:
        merge = int(
            getattr(self.processor.image_processor, "merge_size", None) or self.config.vision_config.spatial_merge_size
        )
        grids_list = grids.tolist() if grids is not None else []
        sequences, used = [], 0
        for row, n in zip(rows, per_row, strict=True):
            try:
                sequences.append(
                    mrope_positions(row.input_ids, grids_list[used : used + n], self.image_token_id, merge)
                )
            except ValueError as e:
                raise DataError(f"{row.source}: {e}", "clear the data cache and start the run again") from None
            used += n
        text_positions = text.position_ids
        if isinstance(text, PackedBatch):
            rope = torch.from_numpy(np.concatenate(sequences, axis=1)).unsqueeze(1)  # [3, 1, T]
        else:
            rope = torch.zeros((3, *text_positions.shape), dtype=torch.int64)
            for b, seq in enumerate(sequences):
                rope[:, b, : seq.shape[1]] = torch.from_numpy(seq)
        return torch.cat([text_positions.unsqueeze(0), rope], dim=0)


def image_token_id(model_config) -> int:
    """The token whose embeddings the model replaces with image features."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(model_config, name, None)
        if value is not None:
            return int(value)
    raise DataError(f"{type(model_config).__name__} names no image token", "this model cannot take images")


def collator_for(model, processor, config, dtype=None):
    """The VisionCollator for `model` (a transformers or peft model) under a RunConfig."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    text_tokenizer = getattr(processor, "tokenizer", processor)
    return VisionCollator(
        family_of(hf),
        processor,
        hf.config,
        image_max_side=config.data.image_max_side,
        packing=config.speed.packing,
        pad_id=text_tokenizer.pad_token_id,
        dtype=dtype or torch.float32,
    )
