"""Plain-Python stand-ins for library code the interpreter cannot step through.

A *polyfill* is ordinary Python that does what a C function, an introspective
stdlib function or one of torch's compiler hooks does, written so that ember's
interpreter can trace it. When traced code calls a callable that has one, the
interpreter calls the polyfill instead (``calls.call_value``): a function is
inlined, a class (``contextlib.nullcontext``'s stand-in) is instantiated like any
user class. Polyfills live in one module per module they stand in for
(``polyfills/dataclasses.py`` for ``dataclasses``, ``polyfills/torch_compiler.py``
for ``torch.compiler`` and ``torch._dynamo``) and register with :func:`polyfill`,
keyed by the real callable, by its ``"module.qualname"`` where ember must not
import the module (``torch._dynamo``), or by its code object where a library makes
many functions of one code (each namedtuple class's ``_replace``). :func:`lookup` also
finds callables that are one of many made by a library function (each ``@contextlib.contextmanager``
function is its own ``helper`` closure: :func:`contextmanager_parts`). Polyfill code
is traced although it lives in ember's package (its trace rule says so).

>>> import contextlib, dataclasses
>>> lookup(contextlib.nullcontext).__name__, lookup(dataclasses.fields).__module__
('NullContext', 'ember.capture.polyfills.dataclasses')
>>> lookup(len) is None
True
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "FOLDER",
    "POLYFILLS",
    "contextmanager_parts",
    "lazy_builtin",
    "lookup",
    "polyfill",
    "qualified_name",
]

F = TypeVar("F", bound=Callable[..., Any])

FOLDER = os.path.join(os.path.dirname(__file__), "")

# real callable (or "module.qualname") -> the polyfill called in its place
POLYFILLS: dict[Any, Any] = {}


def polyfill(*reals: Any) -> Callable[[F], F]:
    """Register the decorated function or class as the polyfill of each of ``reals``."""

    def register(fn: F) -> F:
        for real in reals:
            if real in POLYFILLS:
                raise ValueError(f"{real!r} already has a polyfill: {POLYFILLS[real]!r}")
            POLYFILLS[real] = fn
        return fn

    return register


def qualified_name(fn: Any) -> str:
    """``module.qualname`` of a function (``""`` for objects without them).

    >>> qualified_name(os.path.join)
    'posixpath.join'
    """
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return ""
    return f"{module}.{qualname}"


def lookup(fn: Any) -> Any:
    """The polyfill called in place of ``fn``, or None."""
    _load()
    try:
        found = POLYFILLS.get(fn)
    except TypeError:  # unhashable
        return None
    if found is None and isinstance(fn, types.FunctionType):
        found = POLYFILLS.get(fn.__code__)  # one of many functions a library makes (namedtuple's)
    if found is None and hasattr(fn, "__qualname__"):
        found = POLYFILLS.get(qualified_name(fn))
    return found


def contextmanager_parts(fn: Any) -> tuple[Any, int] | None:
    """For a function made by ``@contextlib.contextmanager``: the polyfill that calls
    it and the index of the decorated generator function in its closure; else None."""
    from ember.capture.polyfills import contextlib as polyfill

    code = getattr(fn, "__code__", None)
    if code is not polyfill.HELPER_CODE:
        return None
    return polyfill.contextmanager_call, code.co_freevars.index("func")


def lazy_builtin(obj: Any) -> Any:
    """The generator version of ``enumerate``/``zip``/``map``/``filter`` (None for others)."""
    from ember.capture.polyfills import builtins

    return builtins.LAZY.get(obj)


_MODULES = (
    "builtins", "collections", "collections_abc", "contextlib", "copy", "dataclasses",
    "torch_compiler", "torch_nn",
)  # fmt: skip
_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in _MODULES:
            importlib.import_module(f"{__name__}.{name}")
