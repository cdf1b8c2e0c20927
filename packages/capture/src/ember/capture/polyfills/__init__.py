"""Plain-Python stand-ins for library code ember cannot step through, traced like user code.

One module per standard-library module (``polyfills.contextlib``). Each fills
:data:`POLYFILLS`, keyed by the real callable, with the function or class the
translator calls in its place; :func:`lookup` also finds callables that are one of
many made by a library function (each ``@contextlib.contextmanager`` function is its
own ``helper`` closure). Polyfill code is inlined even though it lives in ember's
package (see ``calls.is_library_file``).

>>> import contextlib
>>> lookup(contextlib.nullcontext).__name__
'NullContext'
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["FOLDER", "POLYFILLS", "contextmanager_parts", "lazy_builtin", "lookup"]

FOLDER = os.path.join(os.path.dirname(__file__), "")

POLYFILLS: dict[Any, Any] = {}


def lookup(obj: Any) -> Any:
    """The polyfill called in place of ``obj``, or None."""
    try:
        return POLYFILLS.get(obj)
    except TypeError:  # unhashable
        return None


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


def _load() -> None:
    from ember.capture.polyfills import contextlib  # noqa: F401 (fills POLYFILLS)


_load()
