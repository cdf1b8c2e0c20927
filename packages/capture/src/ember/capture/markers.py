"""Functions user code calls to steer ember: ``graph_break``, ``is_compiling``, and friends.

At run time they do (almost) nothing; the translator gives them meaning when it
meets a call to them (see the rules in ``pyrules.py`` and ``calls.py``).

>>> graph_break(), is_compiling()
(None, False)
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from ember.capture import _eval_frame, hook

F = TypeVar("F", bound=Callable[..., Any])

# code objects disabled with disable(fn, recursive=False): a call from traced code breaks
_DISABLED_CODES: weakref.WeakSet[Any] = weakref.WeakSet()

# id -> function, for functions whose result ember may treat as a constant
_ASSUMED_CONSTANT: dict[int, Callable[..., Any]] = {}


def graph_break() -> None:
    """End the current graph here and start a new one after this call (for debugging).

    >>> graph_break()
    """


def checkpoint_region(enter: bool) -> None:
    """Mark where a ``torch.utils.checkpoint`` region starts (``True``) and ends while ember
    captures it (its polyfill calls this): the region's nodes are tagged for recompute in
    backward. Does nothing when the code runs normally.

    >>> checkpoint_region(True)
    """


def is_compiling() -> bool:
    """True while ember is capturing the calling code, False when it runs normally.

    Code can branch on it to keep debugging aids out of graphs.

    >>> is_compiling()
    False
    """
    return False


def assume_constant_result(fn: F) -> F:
    """Let ember call ``fn`` once while capturing and use its result as a constant.

    No guard protects that result: use it only for functions whose result never
    changes for the same (constant) arguments, such as reading a configuration.

    >>> @assume_constant_result
    ... def width():
    ...     return 64
    >>> is_assumed_constant(width)
    True
    """
    _ASSUMED_CONSTANT[id(fn)] = fn
    return fn


def is_disabled_code(code: object) -> bool:
    """Whether ``code`` was disabled with ``disable(fn, recursive=False)``.

    >>> is_disabled_code(is_disabled_code.__code__)
    False
    """
    return code in _DISABLED_CODES


def is_assumed_constant(fn: object) -> bool:
    """Whether ``fn`` was marked with :func:`assume_constant_result`.

    >>> is_assumed_constant(len)
    False
    """
    return _ASSUMED_CONSTANT.get(id(fn)) is fn


class Disabled(functools.partial[Any]):
    """A function that always runs without ember (what :func:`disable` returns)."""

    def __repr__(self) -> str:
        return f"<ember.disable({self.args[-1]!r})>"


def disable(fn: Any = None, *, recursive: bool = True) -> Any:
    """Run ``fn`` without ember: never captured, and (``recursive=True``) nor is what it calls.

    With ``recursive=False`` only ``fn``'s own frame is skipped; functions it calls
    are still captured. Calling a disabled function from compiled code breaks the
    graph there. Use it as a decorator, with or without arguments.

    >>> def noisy(x):
    ...     return x
    >>> quiet = disable(noisy)
    >>> quiet(3)
    3
    """
    if fn is None:
        return functools.partial(disable, recursive=recursive)
    if not recursive:
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if code is None:
            raise TypeError(f"disable(recursive=False) needs a Python function, not {fn!r}")
        hook.skip(code)
        _DISABLED_CODES.add(code)
        return fn
    disabled = Disabled(_eval_frame.call_with_callback, None, None, None, fn)
    functools.update_wrapper(disabled, fn)
    return disabled
