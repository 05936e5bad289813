"""Per-instance, undoable forward swaps, the mechanism behind `hone.core.speed.fused.apply`.

A swap binds a new `forward` on one module instance (never on its class, so other models are untouched) and
returns an `Undo` that restores exactly what was there before. Transformers wraps some forwards in decorators
that carry behaviour (5.18+ checkpoints decoder layers inside a `forward` wrapper, and renames deprecated
keyword arguments in another), so a swap replaces only the innermost function and rebuilds the wrapper chain
around it: checkpointing and argument handling keep working exactly as in the original.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch


class UnsupportedForward(Exception):
    """The module's forward is not shaped the way a swap expects; the module is left as it is."""


_ABSENT = object()
# (module, replaced names and objects) -> the module holding that snapshot of the module's globals (with_globals)
_SNAPSHOTS: dict[tuple, types.ModuleType] = {}


@dataclass
class Undo:
    """Restores one module attribute (a child module, or an instance `forward`) to what it was."""

    owner: torch.nn.Module
    name: str
    previous: object  # the old value, or _ABSENT when there was none (the class's forward applied)
    installed: object  # what the swap put there: undone only while it is still in place
    is_child: bool
    label: str = ""

    def __call__(self) -> bool:
        """Undo the swap; False (and nothing changed) when something else has replaced it since."""
        store = self.owner._modules if self.is_child else self.owner.__dict__
        if store.get(self.name, _ABSENT) is not self.installed:
            return False
        if self.previous is _ABSENT:
            del store[self.name]
        else:
            store[self.name] = self.previous
        return True


def replace_child(parent: torch.nn.Module, name: str, new: torch.nn.Module, label: str) -> Undo:
    """Put `new` in place of `parent.<name>` (a registered child module)."""
    old = parent._modules[name]
    parent._modules[name] = new
    return Undo(parent, name, old, new, is_child=True, label=label)


def swap_forward(module: torch.nn.Module, function: Callable, label: str) -> Undo:
    """Bind `function(self, ...)` as this instance's forward."""
    previous = module.__dict__.get("forward", _ABSENT)
    bound = types.MethodType(function, module)
    module.__dict__["forward"] = bound
    return Undo(module, "forward", previous, bound, is_child=False, label=label)


def _copy_function(
    fn: types.FunctionType, *, globals_: dict | None = None, closure: tuple | None = None
) -> types.FunctionType:
    new = types.FunctionType(
        fn.__code__,
        fn.__globals__ if globals_ is None else globals_,
        fn.__name__,
        fn.__defaults__,
        fn.__closure__ if closure is None else closure,
    )
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    new.__dict__.update(fn.__dict__)
    return new


def innermost(fn: Callable) -> types.FunctionType:
    """The function at the bottom of a `functools.wraps` chain."""
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    if not isinstance(fn, types.FunctionType):
        raise UnsupportedForward(f"{fn!r} is not a plain Python function")
    return fn


def replace_innermost(fn: Callable, make_inner: Callable[[types.FunctionType], Callable]) -> Callable:
    """A copy of the decorator chain `fn` whose innermost function is `make_inner(innermost)`.

    Every wrapper must hold the function it wraps in exactly one closure cell (as `functools.wraps` decorators
    do); that cell is pointed at the rebuilt inner function, all other cells are shared with the original.
    """
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        if not isinstance(fn, types.FunctionType):
            raise UnsupportedForward(f"{fn!r} is not a plain Python function")
        return make_inner(fn)
    cells = fn.__closure__ or ()
    hits = [i for i, cell in enumerate(cells) if _contents(cell) is inner]
    if len(hits) != 1:
        raise UnsupportedForward(f"cannot see through the decorator around {fn.__qualname__}")
    new_inner = replace_innermost(inner, make_inner)
    new_cells = tuple(types.CellType(new_inner) if i == hits[0] else cell for i, cell in enumerate(cells))
    new = _copy_function(fn, closure=new_cells)
    new.__wrapped__ = new_inner
    return new


def with_globals(fn: types.FunctionType, replacements: dict[str, object]) -> types.FunctionType:
    """A copy of `fn` that resolves the given global names to other objects (a snapshot of its module's globals
    with those names replaced; the module itself is not touched).

    The snapshot is a module of its own in `sys.modules`: torch.compile guards a function's globals through the
    module named by its `__name__`, and with the original module's name it would guard the original objects (with
    the `kernels` package installed, a module where a function was, which fails to compile).
    """
    missing = [name for name in replacements if name not in fn.__code__.co_names]
    if missing:
        raise UnsupportedForward(f"{fn.__qualname__} does not use {', '.join(missing)}")
    key = (fn.__module__, tuple(sorted((name, id(value)) for name, value in replacements.items())))
    if key not in _SNAPSHOTS:
        name = f"hone.core.speed.fused.patched.{fn.__module__}.{len(_SNAPSHOTS)}"
        snapshot = types.ModuleType(name)
        snapshot.__dict__.update({**fn.__globals__, **replacements, "__name__": name})
        sys.modules[name] = _SNAPSHOTS[key] = snapshot
    return _copy_function(fn, globals_=_SNAPSHOTS[key].__dict__)


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None
