"""Plain-Python stand-ins for library functions the interpreter cannot step through.

A *polyfill* is ordinary Python that does what a C function, an introspective
stdlib function or one of torch's compiler hooks does, written so that ember's
interpreter can trace it. When traced code calls a function that has one, the
interpreter inlines the polyfill instead (``calls.call_value``). Polyfills live
in one module per module they stand in for (``polyfills/dataclasses.py`` for
``dataclasses``, ``polyfills/torch_compiler.py`` for ``torch.compiler`` and
``torch._dynamo``) and register with :func:`polyfill`, keyed by the real function,
or by its ``"module.qualname"`` where ember must not import the module
(``torch._dynamo``).

>>> import dataclasses
>>> lookup(dataclasses.fields).__module__
'ember.capture.polyfills.dataclasses'
>>> lookup(len) is None
True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["POLYFILLS", "lookup", "polyfill"]

F = TypeVar("F", bound=Callable[..., Any])

# real function (or "module.qualname") -> the polyfill that is traced in its place
POLYFILLS: dict[Any, Callable[..., Any]] = {}


def polyfill(*reals: Any) -> Callable[[F], F]:
    """Register the decorated function as the polyfill of each of ``reals``."""

    def register(fn: F) -> F:
        for real in reals:
            if real in POLYFILLS:
                raise ValueError(f"{real!r} already has a polyfill: {POLYFILLS[real]!r}")
            POLYFILLS[real] = fn
        return fn

    return register


def qualified_name(fn: Any) -> str:
    """``module.qualname`` of a function (``""`` for objects without them)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return ""
    return f"{module}.{qualname}"


def lookup(fn: Any) -> Callable[..., Any] | None:
    """The polyfill traced in place of ``fn``, or None."""
    _load()
    try:
        found = POLYFILLS.get(fn)
    except TypeError:  # unhashable
        return None
    if found is None and hasattr(fn, "__qualname__"):
        found = POLYFILLS.get(qualified_name(fn))
    return found


_MODULES = ("builtins", "collections_abc", "dataclasses", "torch_compiler")
_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in _MODULES:
            importlib.import_module(f"{__name__}.{name}")
