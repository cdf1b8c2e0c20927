"""Compile-time phases of ember.inductor, for ``ember.compiler.compile_times()``.

``lowering`` (decompose, aten to loop IR, dead code, simplification), ``scheduling``
(fusion and memory plan), ``codegen`` (the C++ source), ``C++ build`` (a run of the C++
compiler, on a pool thread; a library found in the disk cache is no build) and ``load``
(loading a library, at the graph's first call). The recorder class is aotgraph's.

>>> from ember.inductor.timing import TIMES
>>> isinstance(TIMES.snapshot(), dict)
True
"""

from __future__ import annotations

from ember.aotgraph.timing import Recorder

__all__ = ["TIMES"]

#: This package's phases.
TIMES = Recorder()
