"""Compile-time phases of this package, recorded for ``ember.compiler.compile_times()``.

Each package owns a :class:`Recorder` (``ember.<pkg>.timing.TIMES``) and times its own
phases with it; compiler-api reads them all, so no package imports compiler-api. This
module is the seam: small, dependency-free, and cheap when nothing reads it (two clock
reads and a dict update per phase, at compile time only, never per call).

>>> rec = Recorder()
>>> with rec.timed("guards"):
...     pass
>>> calls, total, most = rec.snapshot()["guards"]
>>> calls, total >= 0.0, most == total
(1, True, True)
>>> rec.clear(); rec.snapshot()
{}
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["TIMES", "Recorder"]


class Recorder:
    """Calls, total and longest time per named phase, summed over the process.

    >>> rec = Recorder()
    >>> rec.add("capture", 0.5); rec.add("capture", 0.25)
    >>> rec.snapshot()
    {'capture': (2, 0.75, 0.5)}
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a C++ build finishes on a pool thread
        self._phases: dict[str, list[float]] = {}  # phase -> [calls, total, max]
        #: ``(phase, start)`` of the blocks running now, innermost last: what a compile
        #: that takes long is doing (ember.compiler's progress lines read it)
        self.active: list[tuple[str, float]] = []

    def add(self, phase: str, seconds: float) -> None:
        """Record one run of ``phase`` that took ``seconds``."""
        with self._lock:
            row = self._phases.setdefault(phase, [0, 0.0, 0.0])
            row[0] += 1
            row[1] += seconds
            row[2] = max(row[2], seconds)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Time the block as one run of ``phase`` (recorded even if it raises)."""
        start = time.perf_counter()
        self.active.append((phase, start))
        try:
            yield
        finally:
            self.active.remove((phase, start))
            self.add(phase, time.perf_counter() - start)

    def snapshot(self) -> dict[str, tuple[int, float, float]]:
        """``{phase: (calls, total_s, max_s)}`` so far."""
        with self._lock:
            return {k: (int(v[0]), v[1], v[2]) for k, v in self._phases.items()}

    def clear(self) -> None:
        """Forget every phase (``ember.compiler.reset()`` calls it)."""
        with self._lock:
            self._phases.clear()


#: This package's phases: ``guards`` (compiling a guard set into its check).
TIMES = Recorder()
