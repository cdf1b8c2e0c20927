"""Entries made in another process: a frame's translation served without translating it.

A portable pack (``ember.compiler.load_artifacts``) registers, per user code object, the
entries another process compiled for it. A code is named by what survives a new process
(:func:`code_key`: qualified name, first line and a hash of its bytecode, names and
constants), never by ``id``. On a cache miss the frame compiler asks :func:`ready` before
it translates: each registered builder gets the frame and the frame compiler's backend, and
returns the entry's compiled guards (whose objects it re-resolved by name from this frame)
and function when those guards pass on this frame, else None. The first entry that fits is
installed as a translation would be; a frame no entry fits is translated as usual.

>>> def f(x):
...     return x + 1
>>> key = code_key(f.__code__)
>>> key.split("@")[0], key == code_key(f.__code__)
('f', True)
>>> register(key, lambda frame, backend: None)
>>> len(_PACKED[key]); clear()
1
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Iterator
from typing import Any

from ember.capture.hook import Frame
from ember.guards import CompiledGuards

__all__ = ["Builder", "clear", "code_key", "ready", "register"]

# (frame, the frame compiler's backend) -> (checked guards, the entry's function) or None
Builder = Callable[[Frame, Callable[..., Any]], "tuple[CompiledGuards, Any] | None"]

_PACKED: dict[str, list[Builder]] = {}


def _digest(code: types.CodeType, h: Any) -> None:
    """Feed what makes ``code`` the same code in any process (not its file's path: the
    program may run from another folder)."""
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _digest(const, h)
        else:
            h.update(repr(const).encode())


def code_key(code: types.CodeType) -> str:
    """How a pack names a code object: ``qualname@firstline:hash``."""
    h = hashlib.sha256()
    _digest(code, h)
    return f"{code.co_qualname}@{code.co_firstlineno}:{h.hexdigest()[:24]}"


def register(key: str, builder: Builder) -> None:
    """Add a packed entry for the code named ``key``."""
    _PACKED.setdefault(key, []).append(builder)


def ready(frame: Frame, backend: Callable[..., Any]) -> Iterator[tuple[CompiledGuards, Any]]:
    """The packed entries of this frame's code that build for it, in pack order. A builder
    that built is dropped (its entry now lives in the code's cache); one that did not stays,
    for another frame of the code."""
    if not _PACKED:
        return
    builders = _PACKED.get(code_key(frame.code))
    if not builders:
        return
    for builder in list(builders):
        made = builder(frame, backend)
        if made is not None:
            builders.remove(builder)
            yield made


def clear() -> None:
    """Forget every packed entry not installed yet."""
    _PACKED.clear()
