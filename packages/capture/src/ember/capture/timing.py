"""Compile-time phases of ember.capture, for ``ember.compiler.compile_times()``.

``capture``: translating a frame's bytecode into a graph (twice at a graph break: up to
the break, then again up to just before it). The recorder class is ember.guards'.

>>> from ember.capture.timing import TIMES
>>> isinstance(TIMES.snapshot(), dict)
True
"""

from __future__ import annotations

from ember.guards.timing import Recorder

__all__ = ["TIMES"]

#: This package's phases.
TIMES = Recorder()
