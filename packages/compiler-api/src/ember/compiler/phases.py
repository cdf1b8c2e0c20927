"""``compile_times()``: where compile time went, per phase, over every frame compiled so far.

Each layer times its own phases with the recorder it owns (``ember.<pkg>.timing.TIMES``);
this module only reads them, so no package imports compiler-api. ``backend`` is timed
here, around each backend call ``compile()`` makes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ember.aotgraph import timing as aotgraph_timing
from ember.capture import timing as capture_timing
from ember.guards import timing as guards_timing
from ember.guards.timing import Recorder
from ember.inductor import cache as inductor_cache
from ember.inductor import timing as inductor_timing

#: This package's phase: ``backend``, the whole backend call (the phases below it run
#: inside it, except the ones a backend defers to the graph's first call).
TIMES = Recorder()

Row = tuple[int, float, float]  # calls, total seconds, longest call in seconds


class _Recorder(Protocol):  # what each layer's ``timing.TIMES`` offers (the class is its own)
    def snapshot(self) -> dict[str, Row]: ...
    def clear(self) -> None: ...


# (phase, its recorder, whether it runs inside the backend call), in pipeline order.
PHASES: tuple[tuple[str, _Recorder, bool], ...] = (
    ("capture", capture_timing.TIMES, False),
    ("guards", guards_timing.TIMES, False),
    ("backend", TIMES, False),
    ("aot trace", aotgraph_timing.TIMES, True),
    ("partition", aotgraph_timing.TIMES, True),
    ("lowering", inductor_timing.TIMES, True),
    ("scheduling", inductor_timing.TIMES, True),
    ("codegen", inductor_timing.TIMES, True),
    ("C++ build", inductor_timing.TIMES, False),
    ("load", inductor_timing.TIMES, False),
)


@dataclass(frozen=True, slots=True)
class CompileTimes:
    """Calls, total and longest time per compile phase. ``str()`` is a table;
    ``times["capture"]`` (or ``times.phases``) gives ``(calls, total_s, max_s)``.

    >>> t = CompileTimes({"capture": (2, 0.5, 0.3)})
    >>> t["capture"], t["load"]
    ((2, 0.5, 0.3), (0, 0.0, 0.0))
    >>> print(t)  # doctest: +NORMALIZE_WHITESPACE
    phase          calls   total (s)   max (s)
    capture            2       0.500     0.300
    total (capture + guards + backend + C++ build + load): 0.500 s
    """

    phases: dict[str, Row]

    def __getitem__(self, phase: str) -> Row:
        if phase not in self.phases and phase not in _NAMES:
            raise KeyError(f"no phase {phase!r}; the phases are {', '.join(_NAMES)}")
        return self.phases.get(phase, (0, 0.0, 0.0))

    def __iter__(self) -> Iterator[str]:
        return iter(self.phases)

    def __str__(self) -> str:
        lines = [f"{'phase':<14} {'calls':>5} {'total (s)':>11} {'max (s)':>9}"]
        for name, (calls, total, most) in self.phases.items():
            label = f"  {name}" if _NESTED.get(name, False) else name
            lines.append(f"{label:<14} {calls:>5} {total:>11.3f} {most:>9.3f}")
        top = [n for n in _NAMES if not _NESTED[n]]
        outer = sum(self[n][1] for n in top)
        lines.append(f"total ({' + '.join(top)}): {outer:.3f} s")
        if any(_NESTED.get(n, False) for n in self.phases):
            lines.append("(indented phases run inside the backend call and are part of its time)")
        return "\n".join(lines)


_NAMES = tuple(name for name, _, _ in PHASES)
_NESTED = {name: nested for name, _, nested in PHASES}


def compile_times(*, all_phases: bool = False) -> CompileTimes:
    """Time spent compiling, per phase, summed over every frame and graph so far.

    The phases: ``capture`` (bytecode to graph), ``guards`` (compiling the checks),
    ``backend`` (the backend call, with its own phases ``aot trace``, ``partition``,
    ``lowering``, ``scheduling``, ``codegen`` inside it), ``C++ build`` (a run of the
    C++ compiler, on a pool thread) and ``load`` (loading a library at a graph's
    first call). Work found in a disk cache is not done again, so its phase does not
    count. Phases that never ran are left out unless ``all_phases``.
    ``ember.compiler.reset()`` starts the counts again.

    >>> import torch, ember.compiler
    >>> ember.compiler.reset()
    >>> f = ember.compiler.compile(lambda x: x.sin() + 1, backend="aot_eager")
    >>> _ = f(torch.ones(3))
    >>> times = ember.compiler.compile_times()
    >>> [times[p][0] for p in ("capture", "guards", "backend")]
    [1, 1, 1]
    >>> times["lowering"]  # aot_eager does not lower (and "aot trace" is 0 on a disk-cache hit)
    (0, 0.0, 0.0)
    """
    recorded: dict[str, Row] = {}
    for recorder in {id(r): r for _, r, _ in PHASES}.values():
        recorded |= recorder.snapshot()
    names = [*_NAMES, *sorted(set(recorded) - set(_NAMES))]  # a layer's new phase shows too
    return CompileTimes(
        {n: recorded.get(n, (0, 0.0, 0.0)) for n in names if all_phases or n in recorded}
    )


def clear() -> None:
    """Forget every layer's times (``ember.compiler.reset()`` calls it), once the C++
    builds already submitted have finished: a queued one records its time when it runs."""
    inductor_cache.wait_for_builds()
    for _, recorder, _ in PHASES:
        recorder.clear()


def timed_backend(backend: Callable[..., Any]) -> Callable[..., Any]:
    """``backend``, each call recorded as one run of the ``backend`` phase."""

    @functools.wraps(backend)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with TIMES.timed("backend"):
            return backend(*args, **kwargs)

    return timed
