"""Images into a packed batch without the host waiting on the GPU: the model call for packed vision rows.

transformers' vision-language forwards make the host wait on the GPU several times a step. The Qwen-VL encoders
read the image grid back to build rotary positions, attention windows and sequence starts. The merge finds the
image tokens with a boolean mask, checks their count on the host, and scatters with masked_scatter, whose backward
sizes its output on the host. Qwen3-VL adds its deepstack features in three layers through boolean indexing.

Here the grid stays on the host, where the collator made it, and the collator gives the image tokens' flat
positions. The encoder's metadata is built from the host grid with transformers' own helpers and copied without
waiting; the features go in with index_copy / index_add, whose backward is an index_select; the model then runs on
the merged embeddings with no pixels. `install` puts this on a model, and the collator sends `hone_images` only to
a model that has it (`installed`).
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import torch

# config.model_type values whose merge this module does.
FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "llava", "idefics3", "smolvlm")
KWARG = "hone_images"  # the model call's keyword argument carrying HostImages
_ORIGINAL = "_hone_host_merge_original"  # attribute holding the replaced forward (for `uninstall`)
_installed: dict[int, weakref.ref] = {}  # id(config) -> config, for the models that have the merge


@dataclass
class HostImages:
    """A batch's images as the merge takes them.

    Attributes:
        pixel_values: the image processor's pixels (on the model's device once the batch is moved).
        positions: int64 (image tokens,): each image token's flat index in the batch's (B * T) tokens, in image order.
        grid: Qwen-VL's int64 (images, 3) image grid, kept on the host; None for families without one.
        pixel_attention_mask: Idefics3's mask of real pixels; None when every pixel of every image is real (the
            collator checks on the host), which lets the encoder run without a mask.
    """

    pixel_values: torch.Tensor
    positions: torch.Tensor
    grid: torch.Tensor | None = None
    pixel_attention_mask: torch.Tensor | None = None


def image_positions(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """Flat indices of the image tokens in a (B, T) host batch of ids."""
    return torch.nonzero(input_ids.reshape(-1) == image_token_id).reshape(-1)


def supports(model_type: str) -> bool:
    return model_type in FAMILIES


def installed(config) -> bool:
    """Whether the model owning this config takes `hone_images` (the collator asks, per batch)."""
    ref = _installed.get(id(config))
    return ref is not None and ref() is config


def _inner_model(hf_model) -> torch.nn.Module:
    """The multimodal base model whose forward merges the images (`model` of a ...ForConditionalGeneration)."""
    inner = getattr(hf_model, "model", None)
    if inner is None or not hasattr(inner, "get_input_embeddings"):
        raise ValueError(f"{type(hf_model).__name__} has no multimodal base model")
    return inner


def install(hf_model) -> bool:
    """Put the host-side merge on a transformers vision-language model of a family in FAMILIES; False (nothing
    changed) for any other."""
    if not supports(getattr(hf_model.config, "model_type", "")):
        return False
    inner = _inner_model(hf_model)
    if getattr(inner, _ORIGINAL, None) is None:
        original = inner.forward
        setattr(inner, _ORIGINAL, original)
        inner.forward = _MergedForward(inner, original)
        language = getattr(inner, "language_model", None)
        if hasattr(language, "_deepstack_process"):  # Qwen3-VL
            _DeepstackByIndex.install(language)
    _installed[id(hf_model.config)] = weakref.ref(hf_model.config)
    return True


def uninstall(hf_model) -> None:
    """Undo `install`."""
    _installed.pop(id(hf_model.config), None)
    inner = getattr(hf_model, "model", None)
    if inner is None or getattr(inner, _ORIGINAL, None) is None:
        return
    del inner.forward
    delattr(inner, _ORIGINAL)
    if getattr(inner, "language_model", None) is not None:
        _DeepstackByIndex.uninstall(inner.language_model)


class _MergedForward:
    """The multimodal model's forward: with `hone_images`, the image features are merged here and the original
    forward runs on the embeddings alone; without, the original forward runs as it is."""

    def __init__(self, inner: torch.nn.Module, original):
        self.inner, self.original = inner, original

    def __call__(self, *args, **kwargs):
        images: HostImages | None = kwargs.pop(KWARG, None)
        if images is None:
            return self.original(*args, **kwargs)
        inner = self.inner
        input_ids = kwargs.pop("input_ids", None)
        if input_ids is None and args:
            input_ids, args = args[0], args[1:]
        for name in ("pixel_values", "image_grid_thw", "image_sizes", "pixel_attention_mask"):
            kwargs.pop(name, None)
        embeds = kwargs.pop("inputs_embeds", None)
        if embeds is None:
            embeds = inner.get_input_embeddings()(input_ids)
        features, deepstack = _encode(inner, images)
        if features.shape[0] != images.positions.shape[0]:  # both sizes are known on the host
            raise ValueError(f"{features.shape[0]} image features for {images.positions.shape[0]} image tokens")
        flat = embeds.reshape(-1, embeds.shape[-1])
        embeds = flat.index_copy(0, images.positions, features.to(flat.dtype)).view_as(embeds)
        if not deepstack:
            return self.original(*args, input_ids=None, inputs_embeds=embeds, **kwargs)
        _DeepstackByIndex.pending(inner.language_model, images.positions, deepstack)
        try:
            return self.original(*args, input_ids=None, inputs_embeds=embeds, **kwargs)
        finally:
            _DeepstackByIndex.pending(inner.language_model, None, None)


def _encode(inner, images: HostImages) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """(features (image tokens, hidden), Qwen3-VL's deepstack features or None) for the batch's images."""
    visual = getattr(inner, "visual", None)
    if visual is not None:  # Qwen-VL
        device = images.pixel_values.device
        metadata, grid = _qwen_encoder_metadata(visual, images.grid, device)
        out = visual(images.pixel_values.type(visual.dtype), grid_thw=grid, **metadata)
        deepstack = getattr(out, "deepstack_features", None)
        return out.pooler_output, list(deepstack) if deepstack else None
    if hasattr(inner, "connector"):  # Idefics3 / SmolVLM
        return _idefics3_features(inner, images), None
    config = inner.config  # LLaVA
    out = inner.get_image_features(
        pixel_values=images.pixel_values,
        vision_feature_layer=config.vision_feature_layer,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
    )
    return _flat(getattr(out, "pooler_output", out)), None


def _flat(features) -> torch.Tensor:
    """(image tokens, hidden) from per-image features (a list, or one (images, tokens, hidden) tensor)."""
    if isinstance(features, list | tuple):
        return torch.cat([f.reshape(-1, f.shape[-1]) for f in features], dim=0)
    return features.reshape(-1, features.shape[-1])


def _idefics3_features(inner, images: HostImages) -> torch.Tensor:
    """Idefics3's encoder and connector on every image of the batch. transformers' own path finds padding images
    and padded patches with boolean masks on the GPU; Hone's collation makes no padding images, and when every
    pixel is real the encoder runs with no mask at all (what transformers' mask code also ends with)."""
    pixels = images.pixel_values
    if images.pixel_attention_mask is not None:  # padded pixels: transformers' path (it syncs)
        out = inner.get_image_features(pixel_values=pixels, pixel_attention_mask=images.pixel_attention_mask)
        return _flat(getattr(out, "pooler_output", out))
    pixels = pixels.reshape(-1, *pixels.shape[-3:]).to(inner.dtype)
    vision = inner.vision_model
    embeddings = vision.embeddings
    positions = every_patch_positions(embeddings, pixels.shape, pixels.dtype)
    if pixels.device.type == "cuda":
        positions = positions.pin_memory()
    positions = positions.to(pixels.device, non_blocking=True)
    hidden = embeddings.patch_embedding(pixels).flatten(2).transpose(1, 2) + embeddings.position_embedding(positions)
    hidden = vision.post_layernorm(vision.encoder(inputs_embeds=hidden, attention_mask=None).last_hidden_state)
    return _flat(inner.connector(hidden))


def every_patch_positions(embeddings, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Idefics3's patch position ids for images whose every patch is real, computed on the host.

    They depend on the images' shape and dtype alone, so transformers' own `Idefics3VisionEmbeddings.forward` runs
    here on a host stand-in of the module (its convolution and position table replaced by shape-only stand-ins)
    and its arithmetic, which differs between releases, is kept exactly. On the GPU the forward fills the ids
    through boolean-mask indexing in transformers 5.17, which waits for the device.

    Args:
        embeddings: the encoder's `Idefics3VisionEmbeddings`.
        shape: the pixel batch's shape, (images, channels, height, width).
        dtype: the pixels' dtype (transformers 5.17 rounds the patch coordinates to it).

    Returns:
        (images, patches) int64 position ids on the host.
    """
    images, _, height, width = shape
    rows, cols = height // embeddings.patch_size, width // embeddings.patch_size
    found = []

    def position_table(ids: torch.Tensor) -> torch.Tensor:
        found.append(ids)
        return torch.zeros((*ids.shape, 1))

    stand_in = SimpleNamespace(
        patch_size=embeddings.patch_size,
        num_patches_per_side=embeddings.num_patches_per_side,
        patch_embedding=lambda pixels: torch.zeros((images, 1, rows, cols)),
        position_embedding=position_table,
    )
    pixels = torch.zeros((), dtype=dtype).expand(tuple(shape))  # no memory: only its shape and dtype are read
    type(embeddings).forward(
        stand_in, pixel_values=pixels, patch_attention_mask=torch.ones((images, rows, cols), dtype=torch.bool)
    )
    return found[0]


def _qwen_encoder_metadata(visual, grid: torch.Tensor, device: torch.device) -> tuple[dict, torch.Tensor]:
    """(keyword arguments with every tensor the encoder would build from the grid, the grid to pass): built on the
    host with the helpers the encoder's own module calls, copied to `device` without waiting. A transformers whose
    encoder takes no precomputed metadata gets the grid on the device, as before (it then syncs)."""
    module = sys.modules[type(visual).__module__]
    helpers = ("get_vision_position_ids", "get_vision_attention_seqlens")
    if not all(hasattr(module, name) for name in helpers):
        return {}, grid.to(device)
    from transformers import vision_utils

    merge = visual.spatial_merge_size
    out = {"position_ids": vision_utils.get_vision_position_ids(grid, merge)}
    cu = vision_utils.get_vision_cu_seqlens(grid)
    out["cu_seqlens"], out["max_seqlen"] = cu, _longest(cu)
    if hasattr(module, "get_vision_window_index"):  # Qwen2.5-VL: window attention
        index, cu_window = vision_utils.get_vision_window_index(grid, merge, visual.window_size, visual.patch_size)
        out["window_index"], out["cu_window_seqlens"], out["max_window_seqlen"] = index, cu_window, _longest(cu_window)
    if hasattr(module, "get_vision_interpolation_indices_and_weights"):  # Qwen3-VL: interpolated position table
        out["interp_indices"], out["interp_weights"] = vision_utils.get_vision_interpolation_indices_and_weights(
            grid,
            num_grid_per_side=visual.num_grid_per_side,
            mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners,
            spatial_merge_size=visual.config.spatial_merge_size,
        )
    if device.type == "cuda":
        out = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    out = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    return out, grid


def _longest(cu: torch.Tensor) -> int:
    return int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


class _DeepstackByIndex:
    """Qwen3-VL's deepstack features added at the image tokens' flat positions (index_add) instead of through a
    boolean mask. The language model's forward gets them from `pending`, set by the merge for the one call.
    Callable objects rather than closures, so that a deep-copied model calls its own modules."""

    STATE = "_hone_deepstack"

    def __init__(self, language: torch.nn.Module, original):
        self.language, self.original = language, original

    def __call__(self, *args, visual_pos_masks=None, deepstack_visual_embeds=None, **kwargs):
        pending = getattr(self.language, self.STATE)
        if pending is not None:
            visual_pos_masks, deepstack_visual_embeds = pending
        return self.original(
            *args, visual_pos_masks=visual_pos_masks, deepstack_visual_embeds=deepstack_visual_embeds, **kwargs
        )

    @classmethod
    def install(cls, language: torch.nn.Module) -> None:
        setattr(language, cls.STATE, None)
        language.forward = cls(language, language.forward)
        language._deepstack_process = _AddAtPositions(language._deepstack_process)

    @classmethod
    def uninstall(cls, language: torch.nn.Module) -> None:
        if hasattr(language, cls.STATE):
            del language.forward, language._deepstack_process
            delattr(language, cls.STATE)

    @classmethod
    def pending(cls, language: torch.nn.Module, positions, features) -> None:
        if hasattr(language, cls.STATE):
            setattr(language, cls.STATE, None if positions is None else (positions, features))


class _AddAtPositions:
    """`_deepstack_process` taking flat positions (int64) as well as transformers' boolean mask."""

    def __init__(self, original):
        self.original = original

    def __call__(self, hidden_states, visual_pos_masks, visual_embeds):
        if visual_pos_masks.dtype == torch.bool:
            return self.original(hidden_states, visual_pos_masks, visual_embeds)
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        return flat.index_add(0, visual_pos_masks, visual_embeds.to(flat.dtype)).view_as(hidden_states)
