"""Unsloth as a peer (`hone bench ... --peer unsloth`), in a child process because it patches transformers globally
when imported (`python -m hone.core.bench.peer_unsloth SPEC.json RESULT.json`).

It follows Unsloth's documented API (`FastLanguageModel.from_pretrained / get_peft_model / for_training`) and its
packed-batch convention (a `packed_seq_lengths` int32 tensor next to `position_ids`). Unsloth needs a CUDA GPU and
is optional: no CPU test covers this runner, and any failure is recorded as this run's failure.
"""

from __future__ import annotations

import importlib.util
import sys

from hone.core.bench.measure import RunResult
from hone.core.bench.peer_process import PeerFailed, answer_child, run_child

PEER_NAME = "unsloth"


def unsloth_available() -> bool:
    return importlib.util.find_spec("unsloth") is not None


class UnslothRunner:
    """The peer run inside the child process (imports unsloth before anything imports transformers).

    It builds the same random-init weights (same shape, seed and device, so the same values), saves them with a
    synthetic tokenizer for Unsloth's loader, and runs the same token batch with Unsloth's defaults: its gradient
    checkpointing ("unsloth"), LoRA r on the same linear layers (alpha 2r, no dropout), fused AdamW, clipping at
    1.0. `_measure_peer` measures it with the same `measure_run` and answers with a RunResult as JSON.
    """

    kind = "peer"

    def __init__(self, spec: dict):
        self.name = PEER_NAME
        self.spec = spec
        self.model = self.optimizer = self.scaler = self.inputs = self.folder = None
        self.params: list = []

    def setup(self) -> None:
        import torch
        from unsloth import FastLanguageModel  # _measure_peer imported unsloth before anything loaded transformers

        from hone.core.bench.batch import make_batch
        from hone.core.bench.measure import loss_scaler
        from hone.core.bench.scenarios import get_scenario
        from hone.core.bench.weights import decoder_linear_names, saved_model_folder, vocab_size

        spec = self.spec
        scenario = get_scenario(spec["scenario"])
        dtype = getattr(torch, spec["dtype"])
        self.folder = saved_model_folder(
            scenario,
            spec["layers"],
            seed=spec["seed"],
            dtype=dtype,
            device=spec["device"],
            cache_dir=spec.get("model_cache"),
        )
        batch = make_batch(
            spec["tokens"], vocab_size(scenario), seed=spec["seed"], min_len=spec["min_len"], max_len=spec["max_len"]
        )
        model, _tokenizer = FastLanguageModel.from_pretrained(
            model_name=str(self.folder), max_seq_length=batch.tokens, dtype=dtype, load_in_4bit=spec["qlora"]
        )
        targets = decoder_linear_names(model)
        model = FastLanguageModel.get_peft_model(
            model,
            r=spec["lora_r"],
            lora_alpha=2 * spec["lora_r"],
            lora_dropout=0,
            bias="none",
            target_modules=targets,
            use_gradient_checkpointing="unsloth",
            random_state=spec["seed"],
        )
        FastLanguageModel.for_training(model)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=2e-4, fused=True)
        self.scaler = loss_scaler(dtype, spec["device"])  # float16: as Unsloth's trainers run it (fp16=True)
        inputs = {k: torch.from_numpy(v).to(spec["device"]) for k, v in batch.flattened().items()}
        inputs["packed_seq_lengths"] = torch.tensor(batch.lengths, dtype=torch.int32)
        self.inputs = inputs

    def _loss(self):
        import torch

        with torch.autocast("cuda", dtype=getattr(torch, self.spec["dtype"])):
            return self.model(**self.inputs, use_cache=False).loss

    def step(self):
        from hone.core.bench.measure import StepOutcome, optimizer_step

        loss = self._loss()
        grad_norm = optimizer_step(loss, self.params, self.optimizer, self.scaler, 1.0)
        return StepOutcome(loss=loss.item(), grad_norm=grad_norm)

    def forward_backward(self) -> None:
        self._loss().backward()
        self.optimizer.zero_grad(set_to_none=True)

    def teardown(self) -> None:
        from hone.core.bench.weights import remove_folder

        self.model = self.optimizer = self.scaler = self.inputs = None
        self.params = []
        if self.spec.get("model_cache") is None:
            remove_folder(self.folder)

    def describe(self) -> dict:
        import unsloth

        from hone.core.bench.scenarios import get_scenario
        from hone.core.bench.weights import active_params, adapted_names, architecture_facts

        facts = architecture_facts(get_scenario(self.spec["scenario"]), self.spec["layers"])
        return {
            "speed_paths": {
                "peer": f"unsloth {getattr(unsloth, '__version__', '?')}, its defaults",
                "adapted": ", ".join(adapted_names(self.model)),
            },
            "trainable_params": sum(p.numel() for p in self.params),
            "active_params": active_params(self.model, facts["experts"], facts["experts_per_token"]),
        }


def _measure_peer(spec: dict) -> dict:
    """In the child: the peer run measured as Hone's runs are, its RunResult as a dict."""
    try:
        import unsloth  # noqa: F401  (first, so it can patch transformers)
    except Exception as e:  # not installed, or it fails to import on this machine
        result = RunResult(name=PEER_NAME, kind="peer", status="skipped", reason=f"import unsloth failed: {e}")
    else:
        from hone.core.bench.measure import Settings, capped_memory, measure_run

        settings = Settings(
            warmup=spec["warmup"],
            steps=spec["steps"],
            device=spec["device"],
            tokens=spec["tokens"],
            peak_flops=spec.get("peak_flops"),
        )
        with capped_memory(spec["device"], spec.get("memory_cap")):
            result = measure_run(UnslothRunner(spec), settings, description="Unsloth with its defaults")
    return result.to_dict()


def run_unsloth_peer(spec: dict) -> RunResult:
    """Run the peer in a child process and read its RunResult; a crash becomes a failed run."""
    if not unsloth_available():
        return RunResult(name=PEER_NAME, kind="peer", status="skipped", reason="unsloth is not installed")
    try:
        data = run_child(__name__, spec, who="Unsloth")
    except PeerFailed as e:
        reason, _, details = str(e).partition("\n")
        return RunResult(name=PEER_NAME, kind="peer", status="failed", reason=reason, details=details[-20000:])
    known = set(RunResult.__dataclass_fields__)
    return RunResult(**{k: v for k, v in data.items() if k in known})


if __name__ == "__main__":
    raise SystemExit(answer_child(sys.argv[1:], _measure_peer))
