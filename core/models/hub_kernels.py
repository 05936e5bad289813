"""Hub kernels stay off: Hone's own kernels are its speed path, and nothing is fetched from the Hub to run.

From transformers 5.25 every `from_pretrained` swaps layers for kernels downloaded from the Hugging Face Hub (remote
code) unless `use_kernels=False` is passed, and raises where the `kernels` package is missing. bitsandbytes, imported
by peft, asks the Hub for a CPU kernel when the processor has AVX512-BF16 and prints a warning when it cannot.
Hone passes `from_pretrained_options()` to every model load and imports bitsandbytes without `kernels` in sight
(`guard_bitsandbytes_import`). A user who wants Hub kernels sets USE_HUB_KERNELS=1, and both are left as they are.

Stdlib only: the CLI and the Studio install the import guard before anything imports torch.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys

__all__ = ["ENV", "from_pretrained_options", "guard_bitsandbytes_import", "hub_kernels_requested"]

ENV = "USE_HUB_KERNELS"  # transformers' own switch; Hone reads it as "the user asks for Hub kernels"
_TRUE = {"1", "ON", "YES", "TRUE"}
# bitsandbytes' warning when its CPU kernel cannot be fetched: with `kernels` hidden it would say so on every import.
_BNB_LOGGER = "bitsandbytes.backends.cpu.ops"
_BNB_WARNING = "Failed to load CPU gemm_4bit_forward"


def hub_kernels_requested(environ: dict[str, str] | None = None) -> bool:
    """Whether the user set USE_HUB_KERNELS to a true value (1, on, yes, true): only then may the Hub supply kernels."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    return value.strip().upper() in _TRUE


def from_pretrained_options() -> dict[str, bool]:
    """Keyword arguments for every `from_pretrained` of a model (transformers >= 5.17 takes `use_kernels`)."""
    guard_bitsandbytes_import()
    return {"use_kernels": hub_kernels_requested()}


def guard_bitsandbytes_import() -> None:
    """Make the process's first import of bitsandbytes run with `kernels` unimportable and its fetch warning dropped.

    Lazy and idempotent: nothing is imported now. Does nothing when the user asked for Hub kernels or bitsandbytes is
    already imported."""
    if hub_kernels_requested() or "bitsandbytes" in sys.modules:
        return
    if not any(isinstance(finder, _BitsandbytesFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BitsandbytesFinder())


class _BitsandbytesFinder(importlib.abc.MetaPathFinder):
    """Finds bitsandbytes as the other finders would, with a loader that runs its code offline; steps aside once it
    has run (a `find_spec` that only asks whether bitsandbytes is installed leaves it in place)."""

    def __init__(self):
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "bitsandbytes" or self._finding:
            return None
        self._finding = True  # the other finders are asked through importlib, which asks this one again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _OfflineLoader(spec.loader, self)
        return spec


class _OfflineLoader(importlib.abc.Loader):
    """Runs the wrapped loader's module code with `kernels` hidden; everything else is the wrapped loader's."""

    def __init__(self, loader, finder: _BitsandbytesFinder):
        self._loader, self._finder = loader, finder

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self._finder)
        if hub_kernels_requested():
            self._loader.exec_module(module)
            return
        with _kernels_hidden(), _without_fetch_warning():
            self._loader.exec_module(module)


@contextlib.contextmanager
def _kernels_hidden():
    """`import kernels` raises ImportError inside (bitsandbytes then keeps its own CPU code); restored after."""
    absent = object()
    saved = sys.modules.get("kernels", absent)
    sys.modules["kernels"] = None
    try:
        yield
    finally:
        if saved is absent:
            sys.modules.pop("kernels", None)
        else:
            sys.modules["kernels"] = saved


def _drop_fetch_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_BNB_WARNING)


@contextlib.contextmanager
def _without_fetch_warning():
    logger = logging.getLogger(_BNB_LOGGER)
    logger.addFilter(_drop_fetch_warning)
    try:
        yield
    finally:
        logger.removeFilter(_drop_fetch_warning)
