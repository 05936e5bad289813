"""Shared pieces of the export tests (a uniquely named module: several test folders have a conftest.py).

Run folders are built the way the trainer writes them: a tiny random-init base model saved as a folder, a real
peft LoRA adapter on it (applied with hone.core.train.lora, then given random non-zero B matrices so that merging has
something to get right), config.toml and run.json. `Reference` computes what exports must reproduce without the
exporter: LoRA deltas by hand, models through plain transformers / peft, GGUF files through the gguf package.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch

from hone.core.models.shapes import SHAPES, Shape

# Tiny models get a tiny byte-level BPE tokenizer (trained here, ~300 tokens) instead of SmolLM2's 49k tokens:
# every GGUF read-back parses the whole vocabulary, which costs seconds at 49k and milliseconds at 300. The model
# vocabulary is larger than the tokenizer, so GGUF export pads it as it must for real models (Qwen2's 151,936 rows
# for 151,665 tokens).
TINY_VOCAB = 512
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CORPUS = [
    "The capital of France is Paris.",
    "What is the capital of France? Answer in one word.",
    "You are a careful assistant. Be brief.",
    "Two lines: first and second. Name a color: blue.",
    "12 + 30 = 42, and the sky is blue. Thanks! Got it.",
    "Hello, how are you today?",
]
# No tiny dense Qwen2 or Llama-3-style model in hone.core.models.shapes: same sizes as tiny-dense.
_SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
)
TINY_SHAPES = {
    "tiny-dense": SHAPES["tiny-dense"],  # Qwen3: q/k norms, tied embeddings
    "tiny-llama": SHAPES["tiny-llama"],  # untied embeddings
    "tiny-qwen2": Shape(
        "qwen2",
        dict(_SMALL, rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=False),
        "tiny Qwen2 (q/k/v biases)",
    ),
    "tiny-llama3": Shape(
        "llama",
        dict(
            _SMALL,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
        "tiny Llama 3.2 (llama3 rope scaling, tied embeddings)",
    ),
    "tiny-mistral-swa": SHAPES["tiny-mistral-swa"],  # an architecture GGUF export does not support
}
# Scale of the random LoRA B entries: big enough that the adapter moves the logits by ~10% of their range, small
# enough to keep the tiny model's outputs in a normal range.
B_STD = 0.05


def build_tiny_tokenizer(folder):
    """A byte-level BPE tokenizer (GPT-2 style pre-tokenizer) with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def tiny_dense_run(root):
    """A run folder under `root` (runs/my-run) with a random LoRA on a tiny dense base saved beside it (root/base,
    with the tiny tokenizer)."""
    import shutil

    from hone.core.models.shapes import build_model

    tokenizer = build_tiny_tokenizer(root / "tokenizer")
    base = root / "base"
    build_model(TINY_SHAPES["tiny-dense"], seed=0, vocab_size=TINY_VOCAB).save_pretrained(base)
    for f in tokenizer.iterdir():
        shutil.copy(f, base / f.name)
    return write_run(root / "runs" / "my-run", str(base))


def write_run(
    run_dir,
    model_name: str,
    *,
    r: int = 8,
    alpha: float = 16.0,
    rslora: bool = False,
    qlora: bool = False,
    targets: tuple[str, ...] = ("all-linear",),
    seed: int = 1,
    model=None,
    tokenizer=None,
):
    """Write a run folder whose adapter is a real peft LoRA with random (seeded) A and B matrices."""
    import torch

    from hone.core.config import LoraConfig, ModelConfig, RunConfig
    from hone.core.models.load import info_from_config, load_model
    from hone.core.train.adapter_dir import save_adapter
    from hone.core.train.lora import apply_lora

    config = RunConfig(
        model=ModelConfig(name_or_path=model_name),
        lora=LoraConfig(r=r, alpha=alpha, rslora=rslora, qlora=qlora, targets=list(targets)),
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(run_dir / "config.toml")
    if model is None:
        loaded = load_model(config.model, device="cpu", for_training=False)
        model, tokenizer = loaded.model, loaded.tokenizer
    info = info_from_config(model.config, model_name, "folder", 0)
    peft_model, _ = apply_lora(model, config.lora, info)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * B_STD)
    save_adapter(peft_model, tokenizer, run_dir / "adapter", config, steps=10, final_loss=1.0)
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "run_dir": str(run_dir),
                "name": run_dir.name,
                "model": model_name,
                "status": "finished",
                "step": 10,
                "total_steps": 10,
                "final_loss": 1.0,
            }
        )
    )
    return run_dir


class Reference:
    """Independent references for the export checks: plain transformers + peft, and LoRA arithmetic by hand."""

    @staticmethod
    def base(run_dir):
        """The run's base model straight from its folder, float32, eval."""
        import torch
        from transformers import AutoModelForCausalLM

        from hone.core.config import RunConfig

        name = RunConfig.load(run_dir / "config.toml").model.name_or_path
        return AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32).eval()

    @staticmethod
    def lora_deltas(adapter_dir) -> dict[str, object]:
        """module name -> alpha / r * B @ A (alpha / sqrt(r) with rsLoRA), float32, from the files alone."""

        from safetensors.torch import load_file

        config = json.loads((adapter_dir / "adapter_config.json").read_text())
        r, alpha = config["r"], config["lora_alpha"]
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        weights = load_file(adapter_dir / "adapter_model.safetensors")
        deltas = {}
        for key, a in weights.items():
            if ".lora_A." in key:
                module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                deltas[module] = scale * (weights[key.replace(".lora_A.", ".lora_B.")].float() @ a.float())
        return deltas

    @classmethod
    def merged(cls, run_dir):
        """The base with the adapter's deltas added by hand (no peft)."""
        import torch

        model = cls.base(run_dir)
        with torch.no_grad():
            for module, delta in cls.lora_deltas(run_dir / "adapter").items():
                model.get_submodule(module).weight += delta
        return model

    @staticmethod
    def ids(run_dir):
        """Token ids of a conversation (not the exporters' probe), (1, T)."""
        import torch
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hello, how are you today?"}, {"role": "assistant", "content": "Blue."}],
            tokenize=False,
        )
        return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])

    @staticmethod
    def logits(model, ids):
        import torch

        with torch.no_grad():
            return model(input_ids=ids).logits[0].float()


def rel_diff(a, b) -> float:
    """max |a - b| / max |b| (the absolute difference when b is all zeros)"""
    return float((a - b).abs().max() / (b.abs().max() or 1.0))


# Chat templates of other families, for the template rewriting tests.
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' "
    "+ m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
ZEPHYR = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = '<<SYS>>\\n' + messages[0]['content'] + "
    "'\\n<</SYS>>\\n\\n' %}{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}"
    "{% endif %}{% for m in msgs %}{% if m['role'] == 'user' %}{{ '[INST] ' + (sys if loop.first else '') + "
    "m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + ' </s>' }}{% endif %}{% endfor %}"
)
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
)


ARCH = {"tiny-dense": "qwen3", "tiny-llama": "llama", "tiny-qwen2": "qwen2", "tiny-llama3": "llama"}


def read(path):
    """{key: value} and {name: tensor} through gguf.GGUFReader (the package's reader, not Hone's)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items()}, {t.name: t for t in reader.tensors}


def values(tensor):
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))


def gguf_name_of(name, config, arch):
    """Where llama.cpp's name table (the gguf package's, not the exporter's) puts a Hugging Face tensor."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_id = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    module, _, suffix = name.rpartition(".")
    return f"{get_tensor_name_map(arch_id, config.num_hidden_layers).get_name(module)}.{suffix}"


def undo_llama_permutation(gguf_name, array, config):
    """llama's q/k rows back in Hugging Face order, by transformers' own GGUF loader code."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    processor = LlamaTensorProcessor(
        config={"num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads}
    )
    return torch.from_numpy(np.ascontiguousarray(processor.process(array.numpy(), gguf_name).weights))
