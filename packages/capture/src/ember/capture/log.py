"""Logging of ember.capture: its logger and its artifact channels.

Standard :mod:`logging`: facts go to the logger ``ember.capture``; each artifact (a piece of
text a person reads on its own) goes to the child logger ``ember.capture.<name>``, at DEBUG.
Artifacts of this package:
``graph_code`` (each captured FX graph), ``bytecode`` (the frame's bytecode before and
after, as ``dis`` prints it), ``graph_breaks`` (reason and line of each break) and ``perf``
(seconds per compiled frame).
``ember.compiler.set_logs`` (or ``EMBER_LOGS``) turns them on; this module never imports
compiler-api. An artifact's text is built only when its channel is on.

>>> artifact("graph_code", lambda: "def forward(self, x): ...")  # off: not called
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from ember.guards.log import Channels

__all__ = ["LOG", "artifact", "compiling", "enabled", "set_compile_watcher", "set_debug_function"]

_CHANNELS = Channels("ember.capture")
#: The package's logger (facts: what was compiled, what ran eagerly and why).
LOG = _CHANNELS.log
enabled = _CHANNELS.enabled  # whether an artifact of this package is on
artifact = _CHANNELS.artifact  # log an artifact's text, built only when it is on


# Only frames of functions with this name are compiled (None: all). ember.compiler sets
# it from EMBER_DEBUG_FUNCTION; capture never reads the environment itself.
_debug_function: str | None = None
Watcher = Callable[[str], AbstractContextManager[object]]
_watcher: Watcher | None = None  # ember.compiler's progress lines


def set_debug_function(name: str | None) -> None:
    """Compile only frames whose function is named ``name`` (its ``co_name``); frames of
    other functions run as they are, while the functions they call are still looked at
    (as ``TORCHDYNAMO_DEBUG_FUNCTION`` does). None: compile every frame.

    >>> set_debug_function("forward"); debug_function_skips("helper")
    True
    >>> set_debug_function(None); debug_function_skips("helper")
    False
    """
    global _debug_function
    _debug_function = name or None


def debug_function_skips(co_name: str) -> bool:
    """Whether :func:`set_debug_function` leaves a frame of function ``co_name`` uncompiled."""
    return _debug_function is not None and co_name != _debug_function


def set_compile_watcher(watcher: Watcher | None) -> None:
    """Install ``watcher(frame_name)``, a context manager entered around each frame's
    compile (ember.compiler's progress lines use it); None removes it.

    >>> set_compile_watcher(None)
    """
    global _watcher
    _watcher = watcher


@contextlib.contextmanager
def compiling(name: str) -> Iterator[None]:
    """The block compiles frame ``name``: the watcher, if any, sees it start and end.

    >>> with compiling("f (m.py:1)"):
    ...     pass
    """
    watcher = _watcher
    if watcher is None:
        yield
        return
    with watcher(name):
        yield
