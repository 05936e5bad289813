"""A stand-in for the `unsloth` package in CPU tests of the benchmark's peer processes (Unsloth itself needs a CUDA
GPU): the loader and LoRA calls the peer makes, with their keywords, done by transformers and peft. It patches
nothing, so a peer run on it is TRL's own run on the same model; the tests check the plumbing around it."""

from __future__ import annotations

__version__ = "stand-in"


class FastLanguageModel:
    @staticmethod
    def from_pretrained(*, model_name, max_seq_length, dtype, load_in_4bit=False):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if load_in_4bit:
            raise NotImplementedError("the stand-in loads no 4-bit weights")
        model = AutoModelForCausalLM.from_pretrained(model_name, dtype=dtype)
        model.max_seq_length = max_seq_length
        return model, AutoTokenizer.from_pretrained(model_name)

    @staticmethod
    def get_peft_model(model, *, r, lora_alpha, lora_dropout, bias, target_modules, use_gradient_checkpointing,
                       random_state):  # fmt: skip
        import torch
        from peft import LoraConfig, get_peft_model

        assert use_gradient_checkpointing == "unsloth"
        torch.manual_seed(random_state)
        config = LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, bias=bias,
                            target_modules=target_modules)  # fmt: skip
        return get_peft_model(model, config)
