"""Stances: how compiled callables behave, process-wide, as in ``torch.compiler.set_stance``.

========================  ==============================================================
stance                    a compiled call ...
========================  ==============================================================
``default``               serves cached graphs, compiles on a miss
``force_eager``           runs the original code: no cached graph, no compile
``eager_on_recompile``    serves cached graphs; on a miss runs eagerly, compiling nothing
``fail_on_recompile``     serves cached graphs; a miss that would compile raises
                          :class:`RecompileError`
``eager_then_compile``    runs each code eagerly the first time, compiles it the second
========================  ==============================================================

The stance is one process-wide value: set in one thread, it holds for all. A switch
is one assignment (and, for ``force_eager``, one flag in the C hook) under the GIL, so
it is safe while other threads call compiled code: each call sees the stance in effect
when it reaches a cache miss (or, for ``force_eager``, when it starts).

>>> previous = set_stance("eager_on_recompile")
>>> current()
'eager_on_recompile'
>>> set_stance(previous)
'eager_on_recompile'
"""

from __future__ import annotations

import threading
import types
import weakref

from ember.capture import _eval_frame

__all__ = ["STANCES", "RecompileError", "current", "first_call", "set_stance"]

STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile",
           "eager_then_compile")  # fmt: skip


class RecompileError(RuntimeError):
    """A compile was needed under the ``fail_on_recompile`` stance."""


_stance = "default"
_lock = threading.Lock()  # between writers only: readers read one global
# codes that ran once under "eager_then_compile" (their next miss compiles)
_seen: weakref.WeakSet[types.CodeType] = weakref.WeakSet()


def current() -> str:
    """The stance in effect.

    >>> current()
    'default'
    """
    return _stance


def set_stance(stance: str) -> str:
    """Make ``stance`` the process's stance; return the one it replaces.

    >>> set_stance("sometimes")
    Traceback (most recent call last):
    ValueError: unknown stance 'sometimes'; the stances are default, force_eager, \
eager_on_recompile, fail_on_recompile, eager_then_compile
    """
    global _stance
    if stance not in STANCES:
        raise ValueError(f"unknown stance {stance!r}; the stances are {', '.join(STANCES)}")
    with _lock:
        previous, _stance = _stance, stance
        _eval_frame.set_force_eager(stance == "force_eager")
    return previous


def first_call(code: types.CodeType) -> bool:
    """Under ``eager_then_compile``: whether this is ``code``'s first miss (it runs eagerly).

    >>> first_call(first_call.__code__), first_call(first_call.__code__)
    (True, False)
    """
    with _lock:
        if code in _seen:
            return False
        _seen.add(code)
        return True


def reset() -> None:
    """Forget which codes ran once (``eager_then_compile``)."""
    _seen.clear()
