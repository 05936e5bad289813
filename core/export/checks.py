"""Read-back checks: a log of named numbers with tolerances and verdicts, and logit comparisons.

Logit differences are reported both absolute and relative to the largest reference logit, and tolerances apply to
the relative number: a tiny random-init model has logits around 1, a real one around 20, and the same weight
rounding moves both by the same fraction.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from hone.core.data.template import render_conversation

# A conversation every check feeds through the models (rendered with the chat template when there is one): a
# system turn, a question and an answer, about 60 tokens with the template's special tokens.
PROBE_MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is the capital of France? Answer in one word."},
    {"role": "assistant", "content": "Paris."},
]
PROBE_TEXT = "The capital of France is Paris. 12 + 30 = 42, and the sky is blue."


@dataclass
class CheckLog:
    """Collects check results: numbers with tolerances, plain notes, and pass/fail verdicts."""

    checks: dict[str, float | str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def note(self, name: str, value: float | str) -> None:
        """Record a number or text that informs but does not decide."""
        self.checks[name] = (
            float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
        )

    def within(self, name: str, value: float, tolerance: float, what: str) -> bool:
        """Record `value` and its tolerance; a value above the tolerance (or NaN) is a failure."""
        self.checks[name] = float(value)
        stem = name.rsplit(".", 1)[0] if "." in name else name
        self.checks[f"{stem}.tolerance"] = float(tolerance)
        ok = value <= tolerance  # NaN compares False
        if not ok:
            self.failures.append(f"{what}: {value:.3g} exceeds the tolerance {tolerance:.3g} ({name})")
        return ok

    def require(self, name: str, ok: bool, failure: str) -> bool:
        """Record a yes/no check: "ok", or the failure sentence."""
        self.checks[name] = "ok" if ok else f"FAILED: {failure}"
        if not ok:
            self.failures.append(failure)
        return ok

    @property
    def passed(self) -> bool:
        return not self.failures


def probe_text(tokenizer) -> tuple[str, bool]:
    """The probe conversation rendered by the chat template (or plain text when there is none), and whether the
    tokenizer should add its special tokens when encoding it (only for plain text)."""
    if getattr(tokenizer, "chat_template", None):
        return render_conversation(tokenizer, PROBE_MESSAGES), False
    return PROBE_TEXT, True


def probe_ids(tokenizer, text: tuple[str, bool] | None = None):
    """Token ids of the probe, shape (1, T) int64. `text`: encode this probe_text() result instead of rendering
    with this tokenizer (to compare two tokenizers on the same text)."""
    import torch

    text, special = text or probe_text(tokenizer)
    return torch.tensor([tokenizer(text, add_special_tokens=special)["input_ids"]], dtype=torch.long)


def logits_of(model, ids):
    """Float32 logits of one forward pass, shape (T, V)."""
    import torch

    with torch.no_grad():
        return model(input_ids=ids.to(model.device)).logits[0].float().cpu()


def compare_logits(log: CheckLog, name: str, got, reference, tolerance: float, what: str) -> bool:
    """Record max |got - reference| (absolute and relative to max |reference|) and top-1 agreement.

    Args:
        got, reference: float32 logits, shape (T, V).
        tolerance: bound on the relative difference. The mean KL divergence is recorded alongside: it weighs the
            differences by probability, the number to read for quantized files.
    """
    diff = (got - reference).abs().max().item()
    scale = reference.abs().max().item() or 1.0
    log.note(f"{name}.max_abs_diff", diff)
    log.note(f"{name}.top1_agreement", (got.argmax(-1) == reference.argmax(-1)).float().mean().item())
    log.note(f"{name}.mean_kl", mean_kl(reference, got))
    return log.within(f"{name}.max_rel_diff", diff / scale, tolerance, what)


def mean_kl(reference, got) -> float:
    """Mean over positions of KL(softmax(reference) || softmax(got)), in nats; logits (T, V) float32."""
    import torch

    log_p, log_q = torch.log_softmax(reference, -1), torch.log_softmax(got, -1)
    return float((log_p.exp() * (log_p - log_q)).sum(-1).mean().clamp_min(0.0))


@contextlib.contextmanager
def quiet_transformers():
    """No progress bars or info logs from transformers while an export reads files back (the export's own
    progress bar is running), nor their deprecation notices. The GGUF loader's bar is a plain tqdm, swapped for a
    pass-through and restored."""
    import warnings

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    gguf_bar = getattr(gguf_utils, "tqdm", None)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if gguf_bar is not None:
        gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if gguf_bar is not None:
            gguf_utils.tqdm = gguf_bar
