"""How lm-eval's prompts reach a run's models: as raw text, lm-eval's default and what published leaderboards score,
or through the run's chat template (`hone eval --task --chat-template`), the way a chat fine-tune is used.

With the chat template lm-eval builds each prompt as a conversation (the system instruction, if given, as a system
message; each solved example as a user turn and an assistant turn; the question as the last user turn) and renders it
with the tokenizer's `apply_chat_template`, the assistant's turn opened. The base model gets the same prompts as the
fine-tune, so the change between them is the fine-tune's doing.

    check_task_prompts(run_dir, config, chat_template=, system_instruction=)
                        before any weights load: the settings go together, the run's tokenizer has a template
    require_chat_template(tokenizer, run, system_instruction)
                        the same on a tokenizer already loaded (score_tasks)

Light to import: transformers loads when `check_task_prompts` reads the tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hone.core.errors import HoneError

_NO_TEMPLATE_ADVICE = "leave --chat-template out: lm-eval then gives the models raw text, as it does base models"


def text_tokenizer(tokenizer: Any) -> Any:
    """The text tokenizer lm-eval is given: a vision model's processor holds it as `.tokenizer`."""
    return getattr(tokenizer, "tokenizer", tokenizer)


def run_tokenizer(run_dir: str | Path, config) -> Any:
    """The text tokenizer `ChatModels.for_run` gives the run's models, read without their weights: the one saved with
    the adapter (it carries the chat template the run trained with), else the base's; a vision model's processor
    stays the base's, as there."""
    from hone.core.models.load import load_tokenizer, tokenizer_for

    base = tokenizer_for(config.model)
    adapter_dir = Path(run_dir) / "adapter"
    if hasattr(base, "tokenizer") or not (adapter_dir / "tokenizer_config.json").is_file():
        return text_tokenizer(base)
    return load_tokenizer(str(adapter_dir), None, config.model)


def check_task_prompts(
    run_dir: str | Path, config, *, chat_template: bool = False, system_instruction: str | None = None
) -> None:
    """What `--chat-template` and `--system-instruction` need, checked before any weights load: the two go together;
    the run's tokenizer has a chat template; the template takes a system message when one is given.

    Raises:
        HoneError: as `check_prompt_settings` and `require_chat_template`, naming the run and what to do.
    """
    check_prompt_settings(chat_template, system_instruction)
    if chat_template:
        require_chat_template(run_tokenizer(run_dir, config), Path(run_dir).name, system_instruction)


def check_prompt_settings(chat_template: bool, system_instruction: str | None) -> None:
    """A system instruction is text, and comes with the chat template.

    Raises:
        HoneError: an empty instruction; one without the chat template (lm-eval would paste it, with no separator,
            in front of each prompt's raw text).
    """
    if system_instruction is None:
        return
    if not system_instruction.strip():
        raise HoneError(
            "--system-instruction is empty", "give the instruction's text, or leave --system-instruction out"
        )
    if not chat_template:
        raise HoneError(
            "--system-instruction goes with --chat-template: without it lm-eval pastes the instruction in front of "
            "each prompt's raw text",
            "add --chat-template, or leave --system-instruction out",
        )


def require_chat_template(tokenizer: Any, run: str, system_instruction: str | None = None) -> None:
    """The chat template checks of `check_task_prompts` on a tokenizer already loaded (`run`: the run's name, for
    the message).

    lm-eval itself would fail on the first prompt without a template, after the model loaded, and would drop a system
    message the template refuses with no more than a log line: here both are said before anything is scored.
    """
    from hone.core.inference.chat import system_prompt_refusal

    tokenizer = text_tokenizer(tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise HoneError(f"run {run}'s tokenizer has no chat template to give lm-eval's prompts", _NO_TEMPLATE_ADVICE)
    if system_instruction is not None:
        refusal = system_prompt_refusal(tokenizer)
        if refusal:
            raise HoneError(
                f"--system-instruction cannot reach run {run}'s models: {refusal}",
                "leave --system-instruction out (lm-eval would drop it from every prompt)",
            )
