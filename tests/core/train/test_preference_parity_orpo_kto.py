"""ORPO and KTO losses and gradients equal TRL's trainers' on a tiny model for the same rows (float32), through
Hone's packed batches and chunked log-probabilities; KTO's reference is the same weights with the adapter off."""

from __future__ import annotations

import pytest
import torch

from hone.core.config import DataConfig, PreferenceConfig, RunConfig, SpeedConfig, TrainConfig
from hone.core.data.collate import IGNORE_INDEX, collate_packed, collate_padded
from hone.core.data.tokenized import TokenizedRow
from hone.core.data.unpaired import LabeledRow
from hone.core.models.shapes import build_model
from hone.core.speed import attention
from hone.core.train.objectives import KahnemanTverskyOptimization, OddsRatioPreferenceOptimization
from hone.core.train.objectives.kto import mismatched_batch

trl = pytest.importorskip("trl", reason="TRL is the reference these losses are checked against (dev extra)")

RTOL = 1e-4
LORA = dict(r=4, lora_alpha=8, target_modules="all-linear")


def _ids(g: torch.Generator, vocab: int, n: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def _randomize_adapter(model, seed: int) -> None:
    """Random LoRA weights (B too), so the policy differs from the base model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _peft_model(seed: int = 2):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_model("tiny-dense", seed=1), LoraConfig(**LORA))
    _randomize_adapter(model, seed)
    return model


def _lora_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def _assert_same_gradients(theirs, ours) -> None:
    want, got = _lora_grads(theirs), _lora_grads(ours)
    assert want.keys() == got.keys() and len(got) > 0
    for name in want:
        scale = float(want[name].abs().max())
        assert scale > 0, name
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=RTOL * scale, msg=name)


def _hone_policy(seed: int = 2):
    policy = _peft_model(seed)
    attention.configure(policy, SpeedConfig(attention="auto"), "cpu")  # Hone's packed attention, as a run has it
    policy.train()
    return policy


def _trainer(trainer_cls, args, dataset, tokenizer, seed: int = 2):
    """TRL's trainer on the tiny model with a LoRA of its own making (its reference is then the base model,
    adapters disabled, as Hone's), the adapter randomized as `_peft_model`'s."""
    from peft import LoraConfig

    trainer = trainer_cls(
        model=build_model("tiny-dense", seed=1),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(**LORA),
    )
    _randomize_adapter(trainer.model, seed)
    trainer.model.train()
    return trainer


def _padded(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


# ---- ORPO ----


def _orpo_pairs(vocab: int) -> list[dict]:
    """Prompt and answer ids of 4 pairs. Prompts are one token: TRL's ORPO trainer takes the NLL over the whole
    chosen sequence, prompt included, where the paper and Hone take it over the answer; after a one-token prompt
    (never itself predicted) the two are the same."""
    g = torch.Generator().manual_seed(3)
    return [
        {"prompt": _ids(g, vocab, 1), "chosen": _ids(g, vocab, c), "rejected": _ids(g, vocab, r)}
        for c, r in [(4, 7), (3, 3), (8, 5), (6, 2)]
    ]


def _orpo_trl_batch(pairs: list[dict]) -> dict:
    batch = {}
    for side in ("chosen", "rejected"):
        ids = [p["prompt"] + p[side] for p in pairs]
        labels = [[IGNORE_INDEX] * len(p["prompt"]) + p[side] for p in pairs]
        batch[f"{side}_input_ids"] = _padded(ids, 0)
        batch[f"{side}_attention_mask"] = _padded([[1] * len(r) for r in ids], 0)
        batch[f"{side}_labels"] = _padded(labels, IGNORE_INDEX)
    return batch


def test_orpo_loss_gradients_and_rewards_equal_trl(smollm2_tokenizer, tmp_path):
    from datasets import Dataset
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    pairs = _orpo_pairs(smollm2_tokenizer.vocab_size)
    args = ORPOConfig(
        output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=len(pairs), beta=0.25,
        gradient_checkpointing=False, use_cpu=True, bf16=False,
    )  # fmt: skip
    dummy = Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])
    trainer = _trainer(ORPOTrainer, args, dummy, smollm2_tokenizer)
    trl_loss, metrics = trainer.get_batch_loss_metrics(trainer.model, _orpo_trl_batch(pairs))
    trl_loss.backward()

    policy = _hone_policy()
    objective = OddsRatioPreferenceOptimization(
        RunConfig(train=TrainConfig(method="orpo"), preference=PreferenceConfig(orpo_lambda=0.25, beta=3.0))
    )
    sequences = [
        TokenizedRow(p["prompt"] + p[side], [IGNORE_INDEX] * len(p["prompt"]) + p[side], "pairs.jsonl:1")
        for p in pairs
        for side in ("chosen", "rejected")
    ]
    batch = collate_packed(sequences)
    ours = objective.loss_sum(policy, batch) / objective.units(batch)
    ours.backward()

    torch.testing.assert_close(ours, trl_loss.detach().float(), rtol=RTOL, atol=1e-6)
    _assert_same_gradients(trainer.model, policy)
    step = objective.step_metrics()
    assert step["reward_margin"] == pytest.approx(float(metrics["rewards/margins"]), rel=RTOL, abs=1e-6)
    assert step["reward_accuracy"] == pytest.approx(float(metrics["rewards/accuracies"]))
    assert 0 < step["reward_accuracy"] < 1  # the random adapter ranks some pairs right and some wrong
    assert step["nll"] == pytest.approx(metrics["nll_loss"], rel=RTOL)
    assert step["log_odds_ratio"] == pytest.approx(metrics["log_odds_chosen"], rel=RTOL)  # TRL's name for the mean


# ---- KTO ----


def _kto_rows(vocab: int, seed: int) -> list[dict]:
    """5 prompts and answers of varied lengths, 3 desirable and 2 not."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 4, True), (9, 3, False), (2, 8, True), (6, 6, True), (3, 2, False)]
    return [{"prompt_ids": _ids(g, vocab, p), "completion_ids": _ids(g, vocab, c), "label": y} for p, c, y in shapes]


def _labeled_rows(rows: list[dict]) -> list[LabeledRow]:
    return [
        LabeledRow(
            r["prompt_ids"] + r["completion_ids"],
            [IGNORE_INDEX] * len(r["prompt_ids"]) + r["completion_ids"],
            "rows.jsonl:1",
            desirable=r["label"],
        )
        for r in rows
    ]


@pytest.mark.parametrize("seed, kl_positive", [(0, False), (5, True)])  # the KL estimate clamped at 0, or not
def test_kto_loss_and_gradients_equal_trl(seed, kl_positive, smollm2_tokenizer, tmp_path):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    rows = _kto_rows(smollm2_tokenizer.vocab_size, seed)
    settings = dict(beta=0.3, desirable_weight=1.3, undesirable_weight=0.8)
    args = KTOConfig(
        output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=len(rows), gradient_checkpointing=False,
        use_cpu=True, bf16=False, **settings,
    )  # fmt: skip
    dummy = Dataset.from_list(
        [{"prompt": "a", "completion": " b", "label": True}, {"prompt": "c", "completion": " d", "label": False}]
    )
    trainer = _trainer(KTOTrainer, args, dummy, smollm2_tokenizer, seed=2 + seed)
    # TRL's mismatched sequences: each prompt with the completion before it (the first with the last)
    completions = [r["completion_ids"] for r in rows]
    examples = [dict(r, KL_completion_ids=c) for r, c in zip(rows, completions[-1:] + completions[:-1], strict=True)]
    trl_loss = trainer._compute_loss(trainer.model, trainer.data_collator(examples), return_outputs=False)
    trl_loss.backward()
    kl = trainer._metrics["train"]["kl"][-1]
    assert (kl > 0) == kl_positive

    policy = _hone_policy(2 + seed)
    objective = KahnemanTverskyOptimization(
        RunConfig(train=TrainConfig(method="kto"), preference=PreferenceConfig(**settings))
    )
    batch = collate_packed(_labeled_rows(rows))
    ours = objective.loss_sum(policy, batch) / objective.units(batch)
    ours.backward()

    torch.testing.assert_close(ours, trl_loss.detach().float(), rtol=RTOL, atol=1e-6)
    _assert_same_gradients(trainer.model, policy)
    assert objective.step_metrics()["kl"] == pytest.approx(kl, rel=RTOL, abs=1e-6)


def test_the_kl_sequences_pair_each_prompt_with_the_answer_before_it():
    rows = _kto_rows(500, 1)
    batch = collate_packed(_labeled_rows(rows))
    kl = mismatched_batch(batch, max_length=12)
    want = [(r["prompt_ids"] + rows[i - 1]["completion_ids"])[:12] for i, r in enumerate(rows)]
    assert kl.seq_lens == [len(w) for w in want]
    assert kl.input_ids.flatten().tolist() == [t for w in want for t in w]
    # scored: the other row's answer tokens that are left after the cut
    scored = [min(len(rows[i - 1]["completion_ids"]), 12 - len(r["prompt_ids"])) for i, r in enumerate(rows)]
    assert kl.num_trained == sum(scored)
    # embedding rows a host table gathered for the batch are gathered again for the KL sequences, token by token
    table = torch.randn(500, 3)
    for source in (batch, collate_padded(_labeled_rows(rows), pad_id=0)):
        source.input_rows = table[source.input_ids]
        kl = mismatched_batch(source, max_length=12)
        real = kl.attention_mask.bool() if hasattr(kl, "attention_mask") else kl.input_ids >= 0  # padding aside
        torch.testing.assert_close(kl.input_rows[real], table[kl.input_ids][real])


def test_kto_on_padded_rows_equals_packed_rows():
    """speed.packing = false gives padded batches (their KL batch padded too): the same loss and rewards."""
    rows = _labeled_rows(_kto_rows(49152, 4))
    config = RunConfig(
        train=TrainConfig(method="kto"), data=DataConfig(max_length=64), preference=PreferenceConfig(beta=0.5)
    )
    objective = KahnemanTverskyOptimization(config)
    model = _peft_model(5)
    model.eval()
    attention.configure(model, SpeedConfig(attention="auto"), "cpu")
    with torch.no_grad():
        packed, _, _ = objective.losses(model, collate_packed(rows))
        padded, _, _ = objective.losses(model, collate_padded(rows, pad_id=0))
    torch.testing.assert_close(padded.losses, packed.losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(padded.kl, packed.kl, rtol=1e-5, atol=1e-6)
    assert packed.rewards.abs().min() > 0
