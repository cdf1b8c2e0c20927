"""Which Python side effects of an exported function its program holds, and which are none.

An exported graph holds tensor operations only. A side effect that capture recorded (an
attribute or global store, a list append) is an ``ExportError`` under ``strict``, else
dropped with a warning (:func:`check`), except:

* a buffer rebound to a tensor, which the program holds as a buffer mutation
  (``exporting._rebound_buffers``, with :func:`rebinding` and :func:`layout`);
* effects nobody can observe after the call (:func:`unobservable`): writes into the
  frame's own ``**kwargs`` dict, and a flag of another module set and restored.

>>> layout(torch.ones(2, 3))
((2, 3), torch.float32)
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ember.capture.export_program import ExportError, InputKind, InputSpec
from ember.capture.translate import Translation
from ember.guards import BUFFERS, Local, ModuleChild, Source
from ember.guards.sources import ModuleGlobal, read_module_global

__all__ = ["check", "holds_now", "layout", "rebinding", "unobservable"]


def layout(value: Any) -> Any:
    return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else None


def rebinding(effect: tuple[Any, ...], by_source: dict[Source, InputSpec]) -> InputSpec | None:
    """The buffer input a ``setattr`` effect rebinds, or None."""
    if effect[0] != "setattr":
        return None
    spec = by_source.get(ModuleChild(effect[1], effect[2], BUFFERS))
    return spec if spec is not None and spec.kind is InputKind.BUFFER else None


def check(t: Translation, strict: bool, handled: set[int]) -> None:
    """A Python side effect (an attribute or global store, a list append) is an error
    (``strict``), or is dropped with a warning: a graph holds tensor operations only.
    ``handled``: effects the signature holds (buffers rebound, as buffer mutations).
    Effects nobody can observe are not effects: see :func:`unobservable`."""
    handled = handled | unobservable(t)
    effects = [e for k, e in enumerate(t.effects) if k not in handled]
    dropped = [f"{e[0]} {' '.join(str(x) for x in e[1:-1])}".strip() for e in effects]
    if dropped and strict:
        raise ExportError(
            "the function has Python side effects an exported graph cannot hold: "
            + "; ".join(dropped)
            + " (export(..., strict=False) drops them)"
        )
    if dropped:
        warnings.warn(f"export dropped side effects: {'; '.join(dropped)}", stacklevel=4)


def unobservable(t: Translation) -> set[int]:
    """The effects (positions in ``t.effects``) that leave nothing changed after the call:
    writes to the frame's own ``**kwargs`` dict (made afresh for each call), and attribute
    stores on another module's object whose last value is the one it holds now (a flag
    set and restored inside the call, as transformers' output capturing does)."""
    code = t.code
    varkw = (
        code.co_varnames[code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4)]
        if code.co_flags & 8
        else None
    )
    last: dict[tuple[Source, str], tuple[Any, ...]] = {}
    for effect in t.effects:
        if effect[0] == "setattr":
            last[(effect[1], effect[2])] = effect
    restored = {key for key, effect in last.items() if holds_now(effect)}
    return {
        k
        for k, e in enumerate(t.effects)
        if (e[0] == "dict" and varkw is not None and e[1] == Local(varkw))
        or (e[0] == "setattr" and (e[1], e[2]) in restored)
    }


def holds_now(effect: tuple[Any, ...]) -> bool:
    """Whether a ``setattr`` effect stores the constant its object's attribute holds now
    (the object a global of another module, found by name)."""
    _, source, name, (kind, *payload) = effect
    if kind != "const" or not isinstance(source, ModuleGlobal):
        return False
    try:
        obj = read_module_global(source.module, source.name)
    except KeyError:
        return False
    now = getattr(obj, name, _ABSENT)
    return now is payload[0] or (type(now) is type(payload[0]) and now == payload[0])


_ABSENT = object()
