"""The vision demo's model: a small vision-language model whose language model is the real SmolLM2-135M-Instruct
(the bundled GGUF) and whose vision encoder and projector start from random weights.

It is built on transformers' LLaVA classes and sized for a CPU (`build_demo_model` says how). The folder is built
once and cached under Hone's cache, keyed by the GGUF and `BUILDER_VERSION`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hone.core.demo.vision_data import IMAGE_SIDE

IMAGE_TOKEN = "<image>"
# Bump when the architecture or its initialization changes: the cached folder is rebuilt.
BUILDER_VERSION = 1
# Vision encoder: a 2 x 2 grid of patches per image, width 128, 2 layers (about 0.4M parameters).
PATCH = 16
VISION = dict(
    model_type="clip_vision_model",
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=IMAGE_SIDE,
    patch_size=PATCH,
    projection_dim=128,
)
SEED = 0

# SmolLM2's ChatML without its default system prompt (rows stay short), with image parts.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}{{ '" + IMAGE_TOKEN + "' }}{% else %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def demo_model_folder() -> Path:
    """The demo model's folder (config, weights, tokenizer, image processor), built on first use."""
    from hone.core.models.load import publish_folder
    from hone.core.resources import cache_root, smollm2_gguf

    gguf = smollm2_gguf()
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|v{BUILDER_VERSION}".encode())
    target = cache_root("models", f"smolvlm-demo-{key.hexdigest()[:16]}")
    if (target / "config.json").is_file():
        return target
    return publish_folder(target, build_demo_model)


def build_demo_model(folder: Path) -> Path:
    """Write the demo model into `folder`: SmolLM2's weights for the language model, random vision parts.

    It is built the SmolVLM way (SmolLM2 text backbone, a ViT patch encoder, an MLP projector into the text
    embeddings) on transformers' LLaVA classes, whose image processor (CLIP's) runs on Pillow alone; the Idefics3 /
    SmolVLM image processors of transformers 5.17 need torchvision. Sizes are chosen for a CPU: 32 x 32 images cut
    into four 16 x 16 patches, a 2-layer encoder of width 128, so an image costs the language model four tokens.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessorPil,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from hone.core.models.load import gguf_folder
    from hone.core.resources import smollm2_gguf

    text_folder = gguf_folder(smollm2_gguf())
    tokenizer = AutoTokenizer.from_pretrained(text_folder)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    text_config = json.loads((text_folder / "config.json").read_text())
    text_config["vocab_size"] = len(tokenizer)
    config = LlavaConfig(
        text_config=text_config,
        vision_config=VISION,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        tie_word_embeddings=True,
    )
    torch.manual_seed(SEED)
    model = LlavaForConditionalGeneration(config)
    state = load_file(str(text_folder / "model.safetensors"))
    embeddings = state.pop("lm_head.weight")  # SmolLM2 ties its head to its embeddings; the file keeps one copy
    # The image token's embedding row is never looked up (image features replace it); the average row is a
    # harmless value that does not stand out in the tied head.
    state["model.embed_tokens.weight"] = torch.cat([embeddings, embeddings.mean(0, keepdim=True)])
    state = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    language_missing = [m for m in missing if ".language_model." in m]
    if unexpected or language_missing:
        raise RuntimeError(
            f"SmolLM2 weights do not fit the demo model: missing {language_missing}, unexpected {unexpected}"
        )
    model.tie_weights()
    model.save_pretrained(folder)
    images = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIDE}, crop_size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}
    )
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    return folder
