"""lm-eval's Hugging Face model class (`HFLM`) over a model Hone loaded, so lm-eval's tasks score Hone's own base and
fine-tune: the same loader, dtype, GGUF conversion and adapter as `hone chat` and `hone eval`, and lm-eval's own
log-likelihood, rolling log-likelihood and generation code, so the numbers compare with lm-eval's published ones.

HFLM takes an already loaded model (`pretrained=<model object>`) and tokenizer; `HoneLM` adds what lm-eval's own
command line has no need of: a progress count per request instead of its progress bars, and a model description
that asks the Hub nothing (HFLM looks `pretrained` up on the Hub as a model id). Imports lm-eval and torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lm_eval.api.model import CacheHook
from lm_eval.models.huggingface import HFLM

Progress = Callable[[str, int, int], None]  # (what is being scored, requests done, requests in all)


class HoneLM(HFLM):
    """An lm-eval model over `model` (a causal LM, or a peft model: its adapter on unless the caller switches it off)
    and its `tokenizer`.

    Args:
        model: the loaded model, in eval mode, on its device.
        tokenizer: its text tokenizer (a processor's `.tokenizer` for a vision model).
        batch_size: requests per forward pass.
        who: what `progress` calls this model ("the base model").
        progress: called with (f"{who}: {kind}", done, total) as each kind of request runs.
    """

    def __init__(self, model, tokenizer, *, batch_size: int, who: str = "", progress: Progress | None = None):
        # HFLM warns that a model passed as an object ignores its loading arguments and multi-process launch: true,
        # and meant for users of lm-eval's own command line, not for this caller.
        logger = logging.getLogger("lm_eval.models.huggingface")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            super().__init__(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size)
        finally:
            logger.setLevel(level)
        self.who = who
        self.progress = progress
        self._label = ""
        self._done = 0
        self._total = 0
        self.set_cache_hook(_Ticks(self))

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records of the model: its size and dtype (HFLM would also ask the Hub for `pretrained`'s
        commit, which here is an object, not an id)."""
        return {
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "model_dtype": str(self.model.dtype),
        }

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        with self._counting("log-likelihoods", len(requests)):
            return super().loglikelihood(requests, disable_tqdm=True)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        with self._counting("rolling log-likelihoods", len(requests)):
            return super().loglikelihood_rolling(requests, disable_tqdm=True)

    def generate_until(self, requests, disable_tqdm: bool = False):
        with self._counting("generations", len(requests)):
            return super().generate_until(requests, disable_tqdm=True)

    @contextmanager
    def _counting(self, kind: str, total: int) -> Iterator[None]:
        self._label, self._done, self._total = f"{self.who}: {kind}", 0, total
        self._tell()
        yield

    def tick(self) -> None:
        """One request done (HFLM reports each finished request to its cache hook)."""
        self._done = min(self._done + 1, self._total)
        self._tell()

    def _tell(self) -> None:
        if self.progress is not None and self._total:
            self.progress(self._label, self._done, self._total)


class _Ticks(CacheHook):
    """lm-eval's hook for caching each request's result, used to count them: HFLM calls it once per request."""

    def __init__(self, lm: HoneLM):
        super().__init__(None)
        self.lm = lm

    def add_partial(self, attr: str, req: Any, res: Any) -> None:
        self.lm.tick()
