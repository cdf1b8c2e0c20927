"""The heap that existed before a compile, frozen while it runs (issue 19).

A full collection scans every object the garbage collector tracks. In a process that
imported torch and transformers that is about 400,000 objects, 0.15-0.2 s a scan, and
a compile allocates enough to start one or two: which depth of model pays for the next one
is a step function of its size, and at hf-gpt2's 12 layers one landed in the aot trace
(0.35 of its 0.9 s of thread CPU). :func:`frozen_heap` moves the objects that exist when
a compile starts to CPython's permanent generation (``gc.freeze``) and back when it ends
(``gc.unfreeze``), so the collections that run meanwhile scan only what the compile made.
Nothing is kept alive or lost: a cycle among the old objects is collected by the first
full collection after the compile, as it would have been by the one the compile started.

It stays out of the way of a program that uses ``gc.freeze`` itself (a server freezing
its heap before forking workers): if anything is frozen when the compile starts, it does
nothing. With collections disabled (``gc.disable()``), or the ``freeze_heap`` setting off
(``EMBER_CAPTURE_FREEZE_HEAP=0``), it does nothing either. Nested compiles (a backend that
runs a compiled function) and compiles on other threads share the outermost freeze.

>>> import gc
>>> before = gc.get_freeze_count()
>>> with frozen_heap():
...     gc.get_freeze_count() > 0
True
>>> gc.get_freeze_count() == before
True
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

from ember.capture import settings

__all__ = ["frozen_heap"]

_LOCK = threading.Lock()
_open = [0]  # compiles inside a frozen_heap block now (nested and on other threads)
_froze = [False]  # whether the outermost block froze the heap (and so unfreezes it)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the objects that exist now for the block (see the module docstring).

    >>> import gc
    >>> gc.freeze()  # the program froze its own heap: left as it is
    >>> with frozen_heap():
    ...     _froze[0]  # (the count itself moves: a frozen object freed leaves it)
    False
    >>> gc.get_freeze_count() > 0  # still the program's freeze
    True
    >>> gc.unfreeze()
    """
    with _LOCK:
        if _open[0] == 0:
            _froze[0] = (
                settings.section.get().freeze_heap and gc.isenabled() and gc.get_freeze_count() == 0
            )
            if _froze[0]:
                gc.freeze()
        _open[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _open[0] -= 1
            if _open[0] == 0 and _froze[0]:
                gc.unfreeze()
                _froze[0] = False
