"""Answers to a few prompts at each evaluation (train.sample_prompts), saved to RUN_DIR/samples.jsonl.

The prompts are train.sample_prompts' strings (each one user turn) or, for an integer N, the first N rows of the
evaluation split (the tokens before the row's first trained token: its prompt, the assistant's turn opened). At each
evaluation the model answers each greedily, up to train.sample_max_new_tokens tokens, with the adapter as trained so
far, in eval mode and without gradients. Training does not notice: the model goes back to train mode and every RNG
back to its state before (greedy decoding draws nothing, but a model's forward may), so a run's losses are the same,
bit for bit, with and without samples. The file's format and its resume rule: samples_file.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from hone.core.data.template import render_conversation
from hone.core.errors import HoneError
from hone.core.speed.host_tables import tables_on_device
from hone.core.train import checkpoints as ckpt
from hone.core.train.samples_file import SamplesFile

# Stands for the user's text when the template is rendered around it (never in a real prompt: a control character).
_MARK = "\x07"


@dataclass(frozen=True)
class SamplePrompt:
    """One prompt to answer: `text` as shown (the user's words where they can be told apart from the template),
    `ids` the prompt through the chat template with the assistant's turn opened, and the images of an evaluation
    row whose prompt shows some (`source` names the row)."""

    text: str
    ids: tuple[int, ...]
    images: tuple = ()  # ImageRefs, in the order of their placeholder tokens in `ids`
    source: str = ""

    @property
    def input_ids(self) -> list[int]:  # read as a row is by the vision collator
        return list(self.ids)


def build_prompts(setting: list[str] | int, tokenizer, eval_set) -> list[SamplePrompt]:
    """The prompts train.sample_prompts names: its strings, or the first N rows of `eval_set` (None: no
    evaluation split).

    Raises:
        HoneError: N rows asked of a run without evaluation rows, or of one whose rows hold no prompt tokens.
    """
    tok = getattr(tokenizer, "tokenizer", tokenizer)  # a vision model's processor holds its tokenizer
    if isinstance(setting, list):
        out = []
        for text in setting:
            rendered = render_conversation(tokenizer, [{"role": "user", "content": text}], add_generation_prompt=True)
            out.append(SamplePrompt(text, tuple(tok(rendered, add_special_tokens=False)["input_ids"])))
        return out
    if not setting:
        return []
    if eval_set is None or len(eval_set) == 0:
        raise HoneError(
            f"train.sample_prompts = {setting} answers the first {setting} evaluation rows, and this run has none",
            "set data.eval (or data.eval_fraction), or give train.sample_prompts as a list of prompts",
        )
    prefix, suffix = _template_around(tokenizer)
    out = []
    for index in range(min(setting, len(eval_set))):
        row = eval_set[index]
        if not hasattr(row, "input_ids"):  # a preference pair, a labelled answer: no one prompt to answer
            raise HoneError(
                f"train.sample_prompts = {setting} answers evaluation rows, and this run's rows are not prompts",
                "give train.sample_prompts as a list of prompts instead",
            )
        ids = _prompt_ids(row)
        if not ids:
            raise HoneError(
                f"train.sample_prompts: evaluation row {getattr(row, 'source', index)} has no prompt before its answer",
                "give train.sample_prompts as a list of prompts instead",
            )
        images = tuple(getattr(row, "images", None) or ())[: _images_in(ids, tokenizer)]
        out.append(SamplePrompt(_shown_text(tok, ids, prefix, suffix), tuple(ids), images, getattr(row, "source", "")))
    return out


def _images_in(ids: list[int], tokenizer) -> int:
    """How many images a prompt's ids show: runs of the processor's image token (0 without one)."""
    token = getattr(tokenizer, "image_token_id", None)
    if token is None:
        return 0
    return sum(1 for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token))


def _prompt_ids(row) -> list[int]:
    """A row's prompt tokens: a supervised row's up to its first trained token; a GRPO prompt row's all of them."""
    labels = getattr(row, "labels", None)
    ids = list(row.input_ids)
    if labels is None or all(label == -100 for label in labels):
        return ids
    first = next(i for i, label in enumerate(labels) if label != -100)
    return ids[:first]


def _template_around(tokenizer) -> tuple[str, str]:
    """What the chat template writes before and after a lone user turn's text (with the assistant's turn opened)."""
    try:
        rendered = render_conversation(tokenizer, [{"role": "user", "content": _MARK}], add_generation_prompt=True)
    except (ValueError, TypeError):
        return "", ""
    before, _, after = rendered.partition(_MARK)
    return before, after


def _shown_text(tok, ids: list[int], prefix: str, suffix: str) -> str:
    """The user's words of a one-turn prompt (the template's text around them taken off); a prompt of several turns
    or its own system message shows whole, without the template's special tokens."""
    text = tok.decode(ids, skip_special_tokens=False)
    if prefix and suffix and text.startswith(prefix) and text.endswith(suffix) and len(text) > len(prefix + suffix):
        return text[len(prefix) : len(text) - len(suffix)]
    return tok.decode(ids, skip_special_tokens=True).strip()


class SampleAnswers:
    """Answers the prompts at each evaluation and appends them to samples.jsonl (process 0 writes).

    Args:
        prompts: what to answer.
        tokenizer: the run's tokenizer (or processor).
        max_new_tokens: train.sample_max_new_tokens.
        file: samples.jsonl, or None on a process that does not write.
        autocast_dtype: the dtype the training step computes in under autocast on CUDA (None: none).
    """

    def __init__(
        self, prompts: list[SamplePrompt], tokenizer, max_new_tokens: int, file, autocast_dtype=None, config=None
    ):
        self.prompts = prompts
        self.processor = tokenizer
        self.config = config  # the RunConfig: how a vision prompt's images are scaled and processed
        self._collator = None  # the vision collator that turns a prompt's images into pixels, made at first use
        self.tok = getattr(tokenizer, "tokenizer", tokenizer)
        self.max_new_tokens = max_new_tokens
        self.file = file
        self.autocast_dtype = autocast_dtype

    @classmethod
    def for_run(cls, config, tokenizer, eval_set, run_dir: Path, step: int, main: bool, autocast_dtype=None):
        """The run's samples (None when train.sample_prompts asks for none); samples.jsonl opened on process 0 and,
        on a resume from `step`, its lines of later steps dropped."""
        prompts = build_prompts(config.train.sample_prompts, tokenizer, eval_set)
        if not prompts:
            return None
        file = SamplesFile(run_dir) if main else None
        if file is not None:
            file.forget_steps_after(step)
        return cls(prompts, tokenizer, config.train.sample_max_new_tokens, file, autocast_dtype, config)

    def record(self, model, step: int) -> None:
        """Answer every prompt with `model` as it is at `step` and append the line (on the writing process)."""
        answers = self.answers(model)
        if self.file is not None:
            self.file.append(step, [(p.text, a) for p, a in zip(self.prompts, answers, strict=True)])

    @torch.no_grad()
    def answers(self, model) -> list[str]:
        """Greedy answers, one prompt at a time (no padding: each answer is what the prompt alone gives), the model
        left in the mode it was in and every RNG as it was."""
        device = next(model.parameters()).device
        eos = self.tok.eos_token_id
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
        state = ckpt.rng_state()
        was_training = model.training
        model.eval()
        out = []
        try:
            with self._autocast(device), tables_on_device(model):  # no vocabulary-table copy per token
                for prompt in self.prompts:
                    ids = torch.tensor([prompt.ids], dtype=torch.long, device=device)
                    generated = model.generate(
                        input_ids=ids,
                        attention_mask=torch.ones_like(ids),
                        **self._image_inputs(model, prompt, device),
                        do_sample=False,
                        max_new_tokens=self.max_new_tokens,
                        pad_token_id=pad,
                        eos_token_id=eos_ids or None,
                    )
                    out.append(self.tok.decode(generated[0, ids.shape[1] :], skip_special_tokens=True).strip())
        finally:
            if was_training:
                model.train()
            ckpt.set_rng_state(state)
        return out

    def _image_inputs(self, model, prompt: SamplePrompt, device) -> dict[str, torch.Tensor]:
        """The pixels (and companions) of a prompt's images, processed as the training batches' are."""
        if not prompt.images:
            return {}
        if self._collator is None:
            from hone.core.vision.collate import collator_for

            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            self._collator = collator_for(model, self.processor, self.config, dtype=base.dtype)
        return {k: v.to(device) for k, v in self._collator.prompt_inputs(prompt).items()}

    def _autocast(self, device: torch.device):
        if self.autocast_dtype is None or device.type != "cuda":
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda", dtype=self.autocast_dtype)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
