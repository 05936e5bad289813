"""`hone bench tiny-dpo` on the CPU: Hone's DPO and TRL's DPOTrainer with peft train the same generated pairs with the
same trainable parameters, both start at DPO's log 2 (parity), tokens/s and the speed ratio are in the JSON, and the
options the preference scenarios do not take are refused."""

from __future__ import annotations

import json
import math

import pytest

from hone.core.bench.preference import make_pairs, part_tokens
from hone.core.cli import main

pytest.importorskip("trl", reason="TRL's DPOTrainer is the baseline of the preference benchmark (dev extra)")


def test_tiny_dpo_trains_all_three_and_compares_like_for_like(tmp_path, smollm2_tokenizer_dir, stand_in_unsloth):
    """TRL, Hone and the peer (its child process on the stand-in package: TRL's trainer on a model the peer's
    loader and LoRA calls made, without TRL's adapter or checkpointing) on the same pairs."""
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "tiny-dpo", "--tokens", "512", "--steps", "1", "--warmup", "1", "--peer", "unsloth", "--tokenizer",
         str(smollm2_tokenizer_dir), "--json", str(out)]
    )  # fmt: skip
    data = json.loads(out.read_text())
    assert code == 0, data["runs"]
    runs = {r["name"]: r for r in data["runs"]}
    assert set(runs) == {"trl", "hone", "unsloth"} and data["baseline"] == "trl"
    trl, hone, peer = runs["trl"], runs["hone"], runs["unsloth"]
    assert trl["status"] == hone["status"] == peer["status"] == "ok", peer["reason"]
    assert trl["trainable_params"] == hone["trainable_params"] == peer["trainable_params"] > 0
    assert hone["first_loss"] == pytest.approx(math.log(2), abs=1e-4) == trl["first_loss"] == peer["first_loss"]
    assert hone["parity"] is True and hone["speed_ratio"] == pytest.approx(hone["tokens_per_s"] / trl["tokens_per_s"])
    assert peer["parity"] is True and peer["kind"] == "peer"
    assert hone["speed_ratios"]["unsloth"] == pytest.approx(hone["tokens_per_s"] / peer["tokens_per_s"])
    # the same pairs a step: the peer's batches hold TRL's tokens
    assert peer["tokens"] == trl["tokens"] > 0 and hone["tokens"] > 0
    assert "stand-in" in peer["speed_paths"]["peer"] and "unsloth" in peer["speed_paths"]["checkpoint"].lower()
    pairs = data["pairs"]
    assert pairs["trl_pairs_per_step"] >= 1 and pairs["count"] >= 2 * pairs["trl_pairs_per_step"]
    assert hone["speed_paths"]  # what Hone's Trainer chose, as it said in RunStarted


def test_generated_pairs_are_seeded_and_within_their_lengths(smollm2_tokenizer):
    pairs = make_pairs(50, 4, 64, seed=3)
    assert pairs == make_pairs(50, 4, 64, seed=3) and pairs != make_pairs(50, 4, 64, seed=4)
    words = [len(p[part].split()) for p in pairs for part in ("prompt", "chosen", "rejected")]
    assert min(words) >= 4 and max(words) <= 64
    assert all(p > 0 and c > 0 and r > 0 for p, c, r in part_tokens(pairs, smollm2_tokenizer))


@pytest.mark.parametrize("flags", [["--only", "hone"], ["--qlora"], ["--profile"], ["--tokens", "100"]])
def test_options_the_preference_scenarios_do_not_take_are_refused(tmp_path, flags, smollm2_tokenizer_dir, capsys):
    args = ["bench", "tiny-dpo", *flags, "--tokenizer", str(smollm2_tokenizer_dir), "--json", str(tmp_path / "x")]
    assert main(args) == 2
    said = capsys.readouterr()
    assert flags[0] in said.out + said.err and not (tmp_path / "x").exists()


def test_a_peer_that_is_not_installed_is_a_failed_run_and_the_others_stand(tmp_path, smollm2_tokenizer_dir,
                                                                            monkeypatch):  # fmt: skip
    from hone.core.bench import peer_unsloth_trl

    monkeypatch.setattr(peer_unsloth_trl, "unsloth_available", lambda: False)
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "tiny-dpo", "--tokens", "512", "--steps", "1", "--warmup", "0", "--layers", "1", "--peer",
         "unsloth", "--tokenizer", str(smollm2_tokenizer_dir), "--json", str(out)]
    )  # fmt: skip
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    assert code == 1 and runs["hone"]["status"] == runs["trl"]["status"] == "ok"
    assert runs["unsloth"]["status"] == "failed" and "unsloth is not installed" in runs["unsloth"]["reason"]
