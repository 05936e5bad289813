"""Random-init vision-language models and offline processors, for tests (tiny, CPU) and GPU benchmarks (real
shapes): no download, the SmolLM2 tokenizer with each family's image tokens added and a chat template written here
in the family's style. `KINDS` lists the families; `available(kind)` says whether one can be built here.

    tokenizer = vision_tokenizer("qwen2_5_vl", smollm2_tokenizer_dir)
    processor = build_processor("qwen2_5_vl", tokenizer)
    model = build_vision_model("qwen2_5_vl", tokenizer)                 # tiny, seed 0
    folder = save_vision_model(folder, "qwen2_5_vl", smollm2_tokenizer_dir)   # what load_model reads
"""

from __future__ import annotations

from pathlib import Path

KINDS = ("qwen2_5_vl", "qwen3_vl", "gemma3", "llava", "idefics3")
# Families built here for their own tests only (vision and MoE at once), not in every vision test's KINDS.
MOE_KINDS = ("qwen3_vl_moe",)

SMOLVLM_IMAGE_SIDE = 384  # pixels: SmolVLM's SigLIP tile

# Special tokens each family's tokenizer has (added to SmolLM2's vocabulary).
SPECIAL_TOKENS = {
    "qwen2_5_vl": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
    "qwen3_vl": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
    "qwen3_vl_moe": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
    "gemma3": ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"],
    "llava": ["<image>"],
    "idefics3": ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"],
}


def _chatml(image: str) -> str:
    """A ChatML template whose image parts render as `image`."""
    return (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
        "{% if p['type'] == 'image' %}{{ '" + image + "' }}{% else %}{{ p['text'] }}{% endif %}{% endfor %}"
        "{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


_GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}{{ '<start_of_image>' }}{% else %}{{ p['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{{ '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

TEMPLATES = {
    "qwen2_5_vl": _chatml("<|vision_start|><|image_pad|><|vision_end|>"),
    "qwen3_vl": _chatml("<|vision_start|><|image_pad|><|vision_end|>"),
    "qwen3_vl_moe": _chatml("<|vision_start|><|image_pad|><|vision_end|>"),
    "gemma3": _GEMMA_TEMPLATE,
    "llava": _chatml("<image>"),
    "idefics3": _chatml("<image>"),
}

# Tiny sizes: fast on a CPU, yet every part of the architecture is there (grouped heads, several layers).
_TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
)
# Multimodal rope sections (time, height, width) of a 16-wide head: 8 rotary frequency pairs.
_TINY_MROPE = [2, 3, 3]


def available(kind: str) -> str | None:
    """None when this transformers can build the family's processor here, else the reason it cannot (the
    Idefics3 image processor of transformers 5.17 needs torchvision)."""
    if kind == "idefics3":
        import transformers

        try:
            transformers.Idefics3ImageProcessorPil()
        except ImportError:
            return "transformers' Idefics3 image processor needs torchvision here"
    return None


def vision_tokenizer(kind: str, tokenizer_dir: str | Path):
    """The SmolLM2 tokenizer with the family's special tokens and chat template."""
    from transformers import AutoTokenizer

    extra = {}
    if kind == "gemma3":
        extra = {
            "extra_special_tokens": {
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            }
        }
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, **extra)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[kind]})
    tokenizer.chat_template = TEMPLATES[kind]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _image_processor(kind: str, shape: str):
    import transformers

    if kind in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"):
        patch = 14 if kind == "qwen2_5_vl" else 16
        unit = patch * 2  # one merged token covers 2 x 2 patches
        # tiny: 2 x 2 to 4 x 4 merged tokens per image; real: up to 768 x 768 pixels
        low, high = (4, 16) if shape == "tiny" else (16, (768 // unit) ** 2)
        return transformers.Qwen2VLImageProcessorPil(
            patch_size=patch,
            merge_size=2,
            temporal_patch_size=2,
            min_pixels=low * unit * unit,
            max_pixels=high * unit * unit,
        )
    if kind == "gemma3":
        return transformers.Gemma3ImageProcessorPil(size={"height": 28, "width": 28})
    if kind == "llava":
        return transformers.CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    side = 56 if shape == "tiny" else SMOLVLM_IMAGE_SIDE  # real: one 384 px tile per image, no splitting
    return transformers.Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": side}, max_image_size={"longest_edge": side}
    )


def build_processor(kind: str, tokenizer, shape: str = "tiny"):
    """The family's processor around `tokenizer` (Hone's ImageTextProcessor for Qwen-VL, whose transformers
    processor needs torchvision for its video part)."""
    import transformers

    images = _image_processor(kind, shape)
    template = TEMPLATES[kind]
    if kind in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"):
        from hone.core.vision.processor import ImageTextProcessor

        return ImageTextProcessor(tokenizer, images, kind, chat_template=template)
    if kind == "gemma3":
        return transformers.Gemma3Processor(
            image_processor=images, tokenizer=tokenizer, chat_template=template, image_seq_length=4
        )
    if kind == "llava":
        return transformers.LlavaProcessor(
            image_processor=images,
            tokenizer=tokenizer,
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            image_token="<image>",
            chat_template=template,
        )
    # image tokens per tile: (side / patch)^2 / scale_factor^2 (real: (384 / 14)^2 / 9 = 81)
    return transformers.Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=4 if shape == "tiny" else 81, chat_template=template
    )


def _vocab(tokenizer) -> int:
    return (len(tokenizer) + 63) // 64 * 64  # a multiple of 64, like real checkpoints pad their vocabularies


def model_config(kind: str, tokenizer, shape: str = "tiny", layers: int | None = None):
    """A transformers config of the family with the tokenizer's special token ids.

    Args:
        shape: "tiny" (CPU tests) or "real" (Qwen2.5-VL-3B's sizes for qwen2_5_vl, SmolVLM-Instruct's for
            idefics3; the other families have only "tiny").
        layers: text layers (None = the shape's own).
    """
    import transformers

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS[kind]}
    vocab = _vocab(tokenizer)
    text = dict(_TINY_TEXT, vocab_size=vocab)
    if layers is not None:
        text["num_hidden_layers"] = layers
    pad = tokenizer.pad_token_id
    if kind == "qwen2_5_vl":
        if shape == "real":  # Qwen2.5-VL-3B-Instruct
            text = dict(
                hidden_size=2048,
                intermediate_size=11008,
                num_hidden_layers=layers or 36,
                num_attention_heads=16,
                num_key_value_heads=2,
                max_position_embeddings=32768,
                vocab_size=151936,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
            )
            vision = dict(
                depth=32,
                hidden_size=1280,
                intermediate_size=3420,
                num_heads=16,
                out_hidden_size=2048,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                window_size=112,
                fullatt_block_indexes=[7, 15, 23, 31],
                tokens_per_second=2,
            )
        else:
            text.pop("head_dim")
            text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _TINY_MROPE}
            vision = dict(
                depth=2,
                hidden_size=32,
                intermediate_size=64,
                num_heads=2,
                out_hidden_size=64,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                window_size=56,
                fullatt_block_indexes=[1],
            )
        return transformers.Qwen2_5_VLConfig(
            text_config=dict(text, pad_token_id=pad),
            vision_config=vision,
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
        )
    if kind in ("qwen3_vl", "qwen3_vl_moe"):
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": _TINY_MROPE,
            "mrope_interleaved": True,
        }
        vision = dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        )
        config_class = transformers.Qwen3VLConfig
        if kind == "qwen3_vl_moe":  # 5 experts of width 24, top-2, every layer sparse
            text.update(
                num_experts=5,
                num_experts_per_tok=2,
                moe_intermediate_size=24,
                decoder_sparse_step=1,
                mlp_only_layers=[],
            )
            config_class = transformers.Qwen3VLMoeConfig
        return config_class(
            text_config=dict(text, pad_token_id=pad),
            vision_config=vision,
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
        )
    if kind == "gemma3":
        text.update(sliding_window=16, query_pre_attn_scalar=16, pad_token_id=pad)
        vision = dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=7,
        )
        return transformers.Gemma3Config(
            text_config=text,
            vision_config=vision,
            mm_tokens_per_image=4,
            boi_token_index=ids["<start_of_image>"],
            eoi_token_index=ids["<end_of_image>"],
            image_token_index=ids["<image_soft_token>"],
        )
    text.pop("head_dim")
    if kind == "llava":
        vision = dict(
            model_type="clip_vision_model",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
            projection_dim=32,
        )
        return transformers.LlavaConfig(
            text_config=dict(text, model_type="llama", pad_token_id=pad),
            vision_config=vision,
            image_token_id=ids["<image>"],
            vision_feature_select_strategy="default",
            vision_feature_layer=-1,
        )
    if shape == "real":  # SmolVLM-Instruct (2.2B): SmolLM2-1.7B text, SigLIP so400m vision
        text = dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=layers or 24,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=16384,
            vocab_size=vocab,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 273768.0},
        )
        vision = dict(
            hidden_size=1152,
            intermediate_size=4304,
            num_hidden_layers=27,
            num_attention_heads=16,
            image_size=SMOLVLM_IMAGE_SIDE,
            patch_size=14,
        )
        return transformers.Idefics3Config(
            text_config=dict(text, model_type="llama", pad_token_id=pad),
            vision_config=vision,
            scale_factor=3,
            image_token_id=ids["<image>"],
        )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=14
    )
    return transformers.Idefics3Config(
        text_config=dict(text, model_type="llama", pad_token_id=pad),
        vision_config=vision,
        scale_factor=2,
        image_token_id=ids["<image>"],
    )


def build_vision_model(
    kind: str,
    tokenizer,
    *,
    shape: str = "tiny",
    layers: int | None = None,
    seed: int = 0,
    dtype=None,
    device: str = "cpu",
):
    """A random-init model of the family (same seed -> same weights)."""
    import torch
    from transformers import AutoModelForImageTextToText

    config = model_config(kind, tokenizer, shape, layers)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype or torch.float32)
    return model


def save_vision_model(
    folder: str | Path,
    kind: str,
    tokenizer_dir: str | Path,
    *,
    shape: str = "tiny",
    layers: int | None = None,
    seed: int = 0,
) -> Path:
    """A model folder like a downloaded one: config, safetensors weights, tokenizer, image processor, template."""
    folder = Path(folder)
    tokenizer = vision_tokenizer(kind, tokenizer_dir)
    build_vision_model(kind, tokenizer, shape=shape, layers=layers, seed=seed).save_pretrained(folder)
    build_processor(kind, tokenizer, shape).save_pretrained(folder)
    return folder
