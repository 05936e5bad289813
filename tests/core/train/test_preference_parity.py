"""DPO and SimPO losses and gradients equal TRL's on a tiny model for the same pairs (float32), through Hone's packed
batches and chunked log-probabilities; the reference is the same weights with the adapter off."""

from __future__ import annotations

import types

import pytest
import torch

from hone.core.config import PreferenceConfig, RunConfig, SpeedConfig, TrainConfig
from hone.core.data.collate import IGNORE_INDEX, collate_packed
from hone.core.data.preference import PairRow
from hone.core.data.tokenized import TokenizedRow
from hone.core.models.shapes import build_model
from hone.core.speed import attention
from hone.core.train.objectives import DirectPreferenceOptimization, SimplePreferenceOptimization
from hone.core.train.objectives.logprobs import sequence_logprobs

trl = pytest.importorskip("trl", reason="TRL is the reference these losses are checked against (dev extra)")

RTOL = 1e-4


def _pairs(vocab: int, seed: int = 0) -> list[dict]:
    """Prompt and answer token ids of 4 pairs, lengths varied (answers of different lengths within a pair)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 4, 7), (9, 3, 3), (2, 8, 5), (6, 6, 2)]
    return [
        {name: torch.randint(3, vocab, (n,), generator=g).tolist() for name, n in zip(names, sizes, strict=True)}
        for sizes, names in zip(shapes, [("prompt_ids", "chosen_ids", "rejected_ids")] * 4, strict=True)
    ]


def _pair_row(example: dict) -> PairRow:
    def sequence(answer: list[int]) -> TokenizedRow:
        prompt = example["prompt_ids"]
        return TokenizedRow(prompt + answer, [IGNORE_INDEX] * len(prompt) + answer, "pairs.jsonl:1")

    return PairRow((sequence(example["chosen_ids"]), sequence(example["rejected_ids"])), "pairs.jsonl:1")


LORA = dict(r=4, lora_alpha=8, target_modules="all-linear")


def _randomize_adapter(model, seed: int, only: str = "") -> None:
    """Random LoRA weights (B too; of the modules whose names hold `only`), so the policy differs from the base
    model that is DPO's reference."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name and only in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _peft_model():
    """A tiny Qwen3 with a LoRA adapter whose weights are all random."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_model("tiny-dense", seed=1), LoraConfig(**LORA))
    _randomize_adapter(model, 2)
    return model


def _lora_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def _hone_loss(objective, model, examples) -> torch.Tensor:
    batch = collate_packed([s for e in examples for s in _pair_row(e).sequences])
    return objective.loss_sum(model, batch) / objective.units(batch)


def _trl_dpo(examples, tokenizer, tmp_path, **settings):
    """TRL's DPO trainer on the tiny model with a fresh LoRA of its own making (its reference is then the base
    model, adapters disabled, as Hone's), the adapter randomized as `_peft_model`'s; returns the trainer."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=str(tmp_path),
        report_to=[],
        per_device_train_batch_size=len(examples),
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        **settings,
    )
    dummy = Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])
    trainer = DPOTrainer(
        model=build_model("tiny-dense", seed=1),
        args=args,
        train_dataset=dummy,
        processing_class=tokenizer,
        peft_config=LoraConfig(**LORA),
    )
    _randomize_adapter(trainer.model, 2)
    trainer.model.train()
    return trainer


@pytest.mark.parametrize(
    "loss, smoothing",
    [("sigmoid", 0.0), ("ipo", 0.0), ("robust", 0.1)],
)
def test_dpo_loss_and_gradients_equal_trl(loss, smoothing, smollm2_tokenizer, tmp_path):
    examples = _pairs(smollm2_tokenizer.vocab_size)
    trainer = _trl_dpo(examples, smollm2_tokenizer, tmp_path, beta=0.3, loss_type=[loss], label_smoothing=smoothing)
    theirs = trainer.model
    trl_loss = trainer._compute_loss(theirs, trainer.data_collator(examples), return_outputs=False)
    trl_loss.backward()
    policy = _peft_model()

    config = RunConfig(
        train=TrainConfig(method="dpo"), preference=PreferenceConfig(beta=0.3, loss=loss, label_smoothing=smoothing)
    )
    attention.configure(policy, SpeedConfig(attention="auto"), "cpu")  # Hone's packed attention, as a run has it
    policy.train()
    ours = _hone_loss(DirectPreferenceOptimization(config), policy, examples)
    ours.backward()

    torch.testing.assert_close(ours, trl_loss.detach().float(), rtol=RTOL, atol=1e-6)
    want, got = _lora_grads(theirs), _lora_grads(policy)
    assert want.keys() == got.keys() and len(got) > 0
    for name in want:
        scale = float(want[name].abs().max())
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=RTOL * scale, msg=name)


def test_simpo_loss_equals_trls_cpo_with_the_simpo_loss():
    """SimPO's loss against TRL's CPO trainer's (loss_type simpo, cpo_alpha 0: pure SimPO) on the same per-token
    average log-probabilities, which Hone computes from its packed batch and TRL from padded logits."""
    from trl.experimental.cpo import CPOTrainer

    model = _peft_model()
    examples = _pairs(49152, seed=5)
    config = RunConfig(
        train=TrainConfig(method="simpo"), preference=PreferenceConfig(beta=2.0, simpo_gamma=0.7, label_smoothing=0.05)
    )
    objective = SimplePreferenceOptimization(config)
    batch = collate_packed([s for e in examples for s in _pair_row(e).sequences])
    with torch.no_grad():
        pairs = objective.pair_logprobs(model, batch)
        ours = objective.pair_losses(pairs).losses

        stub = types.SimpleNamespace(
            alpha=0.0, loss_type="simpo", simpo_gamma=0.7, beta=2.0, label_smoothing=0.05,
            accelerator=types.SimpleNamespace(device="cpu"),
        )  # fmt: skip
        chosen, rejected = [], []
        for e in examples:
            for answer, out in ((e["chosen_ids"], chosen), (e["rejected_ids"], rejected)):
                ids = torch.tensor([e["prompt_ids"] + answer])
                labels = torch.tensor([[IGNORE_INDEX] * len(e["prompt_ids"]) + answer])
                logits = model(input_ids=ids).logits
                out.append(CPOTrainer.get_batch_logps(logits, labels, average_log_prob=True))
        theirs, _, _ = CPOTrainer.cpo_loss(stub, torch.cat(chosen), torch.cat(rejected))
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=1e-6)


def test_chunked_log_probabilities_equal_the_plain_forward_with_gradients():
    model = _peft_model()
    examples = _pairs(49152, seed=9)
    batch = collate_packed([s for e in examples for s in _pair_row(e).sequences])
    attention.configure(model, SpeedConfig(attention="auto"), "cpu")
    grads = {}
    for mode in ("plain", "chunked"):
        model.zero_grad()
        sums, counts = sequence_logprobs(model, batch, mode=mode)
        (sums * torch.linspace(1, 2, len(sums))).sum().backward()
        grads[mode] = (sums.detach(), counts, _lora_grads(model))
    torch.testing.assert_close(grads["chunked"][0], grads["plain"][0], rtol=1e-5, atol=1e-5)
    assert grads["chunked"][1].tolist() == [len(e[k]) for e in examples for k in ("chosen_ids", "rejected_ids")]
    for name, want in grads["plain"][2].items():
        torch.testing.assert_close(grads["chunked"][2][name], want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_the_reference_is_the_base_model_with_every_adapter_off_moe_experts_included():
    """DPO's reference forward switches the adapter off: on an MoE model with LoRA on its experts (Hone's split
    expert LoRA and its backends) it must equal the model before any adapter was applied."""
    from hone.core.config import LoraConfig as HoneLora
    from hone.core.models.load import info_from_config
    from hone.core.speed import moe
    from hone.core.train.lora import apply_lora
    from hone.core.train.objectives.preference import adapter_off

    base = build_model("tiny-moe-qwen3", seed=3)
    examples = _pairs(base.config.vocab_size, seed=11)
    batch = collate_packed([s for e in examples for s in _pair_row(e).sequences])
    with torch.no_grad():
        want, _ = sequence_logprobs(base, batch)
    info = info_from_config(base.config, "tiny-moe-qwen3", "folder", 0)
    model, _ = apply_lora(base, HoneLora(r=4, experts=True), info)
    moe.configure(model, "torch", "cpu")
    _randomize_adapter(model, 4, only=".experts.")  # the other adapters keep B = 0: only the experts' act
    with torch.no_grad():
        tuned, _ = sequence_logprobs(model, batch)
        with adapter_off(model):
            off, _ = sequence_logprobs(model, batch)
    assert (tuned - want).abs().max() > 1e-2  # the experts' adapters change the answers' log-probabilities
    torch.testing.assert_close(off, want, rtol=1e-5, atol=1e-5)
