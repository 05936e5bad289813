"""The Chat page's worker: lives on the chat thread, loads the models once, then streams replies and runs
evaluations. Every slot reports back by signal; nothing here touches a widget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from hone.app.workers import describe_exception


class ChatEngine(QObject):
    """Lives on the chat thread: loads the models once, then streams replies. Every slot reports back by signal."""

    loaded = Signal(object)  # (description, has_adapter, why the template takes no system prompt or "")
    piece = Signal(object)  # (side, text)
    reply_done = Signal()
    failed = Signal(object)  # TaskError
    eval_progress = Signal(object)  # (prompts done, prompts in all)
    evaluated = Signal(object)  # (hone.core.inference.evaluate.Comparison, rows skipped) or None after a failure

    def __init__(self):
        super().__init__()
        self.models = None

    @Slot(object)
    def load(self, source: dict[str, Any]) -> None:
        try:
            from hone.core.api import ChatModels

            self.models = None
            if source.get("run_dir"):
                self.models = ChatModels.for_run(source["run_dir"])
                text = f"{Path(source['run_dir']).name}: base model and its adapter"
            else:
                self.models = ChatModels.load(source["model"], source.get("adapter"))
                text = f"{source['model']}" + (" with adapter" if source.get("adapter") else " (base only)")
            self.loaded.emit((text, self.models.has_adapter, self.models.system_prompt_refusal()))
        except Exception as e:
            self.failed.emit(describe_exception(e))

    @Slot(object)
    def generate(self, request: dict[str, Any]) -> None:
        try:
            from hone.core.api import GenerationSettings

            settings = GenerationSettings(**request["settings"])
            stream = self.models.stream_both(
                request["base"], settings, request["stop"], tuned_messages=request["tuned"]
            )
            for side, text in stream:
                self.piece.emit((side, text))
        except Exception as e:
            self.failed.emit(describe_exception(e))
        finally:
            self.reply_done.emit()

    @Slot(object)
    def evaluate(self, request: dict[str, Any]) -> None:
        """Answer the held-out rows of request["path"] (the first request["rows"]) with both models and score them;
        for a preference run (request["config"]), rank its held-out pairs with both instead."""
        if request.get("config") is not None:
            self._rank_pairs(request)
            return
        result = None
        try:
            from hone.core.api import compare, read_prompts, with_references

            prompts, skipped = read_prompts(Path(request["path"]))
            prompts = with_references(prompts, request["rows"] or None)
            comparison = compare(
                self.models,
                prompts,
                stop=request["stop"],
                progress=lambda done, total: self.eval_progress.emit((done, total)),
            )
            result = (comparison, skipped)
        except Exception as e:
            self.failed.emit(describe_exception(e))
        finally:
            self.evaluated.emit(result)

    def _rank_pairs(self, request: dict[str, Any]) -> None:
        result = None
        try:
            from hone.core.api import held_out_pairs, score_pairs

            pairs = held_out_pairs(request["config"], self.models.tokenizer, request.get("path"))
            result = score_pairs(
                self.models,
                pairs,
                limit=request["rows"] or None,
                progress=lambda done, total: self.eval_progress.emit((done, total)),
            )
        except Exception as e:
            self.failed.emit(describe_exception(e))
        finally:
            self.evaluated.emit(result)
