"""``CompilationProfiler``: find the graph breaks and recompilations of a whole program.

Pass one as the backend of every ``compile()`` of the program, run the program as
usual, then print ``report()``. The profiler runs each graph as captured (an observing
backend, like ``"eager"``) and acts as if the cache limit were 1: a code object that
already has a graph is never compiled again. Each later cache miss runs that call
eagerly and is recorded as a recompilation, with the guard that failed and the line of
user code whose value the guard protects. Graph breaks come from the same records
``explain()`` reads.
"""

from __future__ import annotations

import itertools
import linecache
import types
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ember.capture.frame_compiler import FrameCompiler, code_cache
from ember.capture.hook import CacheEntry, Decision, Frame
from ember.compiler.backends import Backend, lookup_backend
from ember.compiler.explain import BreakReason, break_reason
from ember.guards import CodeCache

_SERIAL = itertools.count()


@dataclass(frozen=True, slots=True)
class Recompile:
    """One cache miss on a code object that already had a graph: the guard that failed.

    ``guard`` is the failed guard's kind and source (``"TENSOR_MATCH x"``), ``where`` the
    user ``file:line`` that needed it, ``failure`` the words of the failure.
    """

    code: str  # "qualname (file:line)" of the recompiling code
    guard: str
    where: str | None
    failure: str


@dataclass(frozen=True, slots=True)
class RecompileGroup:
    """Recompilations of one code object caused by the same guard, counted."""

    code: str
    guard: str
    where: str | None
    source: str  # the text of the line at ``where``
    last_failure: str
    count: int

    def __str__(self) -> str:
        lines = [f"{self.count}x  {self.code}", f"    guard failed: {self.last_failure}"]
        if self.where is not None:
            lines.append(f"    guard set at {self.where}: {self.source}".rstrip(": "))
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class BreakGroup:
    """Graph breaks (or frames run eagerly) with the same reason at the same line, counted."""

    reason: BreakReason
    count: int
    eager: bool  # the whole frame ran eagerly: no graph break was possible there

    def __str__(self) -> str:
        r = self.reason
        where = f"    {r.filename}:{r.lineno}: {r.source}"
        lines = [f"{self.count}x  {r.reason} [{r.category}]", where]
        return "\n".join(lines + ([f"    hint: {r.hint}"] if r.hint else []))


@dataclass(frozen=True, slots=True)
class ProfileReport:
    """What a :class:`CompilationProfiler` saw; ``str()`` is the readable report.

    >>> print(ProfileReport(graphs=1, ops=2, breaks=(), recompiles=()))
    Graphs: 1 (2 ops); graph breaks: 0; frames run eagerly: 0; recompilations: 0
    No graph breaks.
    No recompilations (as if cache_size_limit were 1).
    """

    graphs: int
    ops: int
    breaks: tuple[BreakGroup, ...]
    recompiles: tuple[RecompileGroup, ...]

    @property
    def graph_break_count(self) -> int:
        return sum(g.count for g in self.breaks if not g.eager)

    @property
    def recompile_count(self) -> int:
        return sum(g.count for g in self.recompiles)

    def __str__(self) -> str:
        eager = sum(g.count for g in self.breaks if g.eager)
        lines = [
            f"Graphs: {self.graphs} ({self.ops} ops); graph breaks: {self.graph_break_count};"
            f" frames run eagerly: {eager}; recompilations: {self.recompile_count}"
        ]
        lines += _section("Graph breaks", [g for g in self.breaks if not g.eager], NO_BREAKS)
        lines += _section("Frames run eagerly", [g for g in self.breaks if g.eager], "")
        lines += _section(RECOMPILES, self.recompiles, NO_RECOMPILES)
        return "\n".join(lines)


NO_BREAKS = "No graph breaks."
RECOMPILES = "Recompilations (as if cache_size_limit were 1)"
NO_RECOMPILES = "No recompilations (as if cache_size_limit were 1)."


def _section(title: str, groups: Iterable[object], none: str) -> list[str]:
    """A titled list of groups, indented; ``none`` (if any) when there are none."""
    shown = [str(g).replace("\n", "\n  ") for g in groups]
    if not shown:
        return [none] if none else []
    return [f"{title}, most frequent first:", *(f"  {s}" for s in shown)]


class CompilationProfiler:
    """A backend that records every graph break and recompilation of a program.

    Use the same profiler as the backend of each ``compile()`` to profile, run the
    program, then read ``report()``. Graphs go to ``backend`` (default ``"eager"``: run
    as captured), and a code object is compiled at most once, as if ``cache_size_limit``
    were 1: every later miss runs that call eagerly and is reported with the guard that
    failed and where the guarded value was read.

    >>> import torch, ember.compiler
    >>> prof = ember.compiler.CompilationProfiler()
    >>> def f(x):
    ...     return x * 2
    >>> fn = ember.compiler.compile(f, backend=prof)
    >>> for n in (2, 3, 4):
    ...     _ = fn(torch.ones(n))
    >>> report = prof.report()
    >>> report.graphs, report.recompile_count
    (1, 2)
    >>> print(report.recompiles[0].last_failure)
    x: size[0] expected 2, got 4
    """

    def __init__(self, backend: str | Backend = "eager") -> None:
        self.backend = lookup_backend(backend)
        self.__name__ = self.__qualname__ = f"CompilationProfiler#{next(_SERIAL)}"
        self.__module__ = "ember.compiler.profiler"
        self.compilers: list[ProfilingCompiler] = []
        self.recompiles: list[Recompile] = []
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        """The observing backend: keep the graph, compile it with ``backend``."""
        self.graphs.append(gm)
        return self.backend(gm, example_inputs)

    def frame_compiler(self, backend: Any, name: str, **kwargs: Any) -> ProfilingCompiler:
        """The frame compiler ``compile(..., backend=self)`` installs (called by compile)."""
        compiler = ProfilingCompiler(self, backend, name, **kwargs)
        self.compilers.append(compiler)
        return compiler

    def report(self) -> ProfileReport:
        """Breaks and recompilations so far, grouped and counted, most frequent first."""
        stats = [c.stats for c in self.compilers]
        breaks = Counter(
            (break_reason(f), eager)
            for s in stats
            for eager, failures in ((False, s.breaks), (True, s.failures))
            for f in failures
        )
        recompiles = Counter((r.code, r.guard, r.where) for r in self.recompiles)
        last = {(r.code, r.guard, r.where): r.failure for r in self.recompiles}
        return ProfileReport(
            graphs=sum(s.graphs for s in stats),
            ops=sum(c.ops for s in stats for c in s.compiled),
            breaks=tuple(BreakGroup(r, n, eager) for (r, eager), n in breaks.most_common()),
            recompiles=tuple(
                RecompileGroup(code, guard, where, _line(where), last[key], n)
                for key, n in recompiles.most_common()
                for code, guard, where in [key]
            ),
        )

    def _entries(self, code: types.CodeType, cache: CodeCache[Any]) -> list[Any]:
        """This profiler's live cache entries for ``code``."""
        live = {id(e) for e in cache.entries}
        return [e for c in self.compilers for k, _, e in c.made if k is code and id(e) in live]


class ProfilingCompiler(FrameCompiler):
    """The frame compiler of a :class:`CompilationProfiler`: compiles each code once."""

    def __init__(self, profiler: CompilationProfiler, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, track=True, **kwargs)
        self.profiler = profiler

    def _on_miss(self, frame: Frame) -> CacheEntry | Decision:
        cache = code_cache(frame.code)
        entries = self.profiler._entries(frame.code, cache)
        if not entries:
            return super()._on_miss(frame)
        self.profiler.recompiles.append(_recompile(cache.name, entries[0], frame.args))
        return Decision.RUN  # as if the cache were full: this call runs eagerly


OTHER_CLOSURE = "another closure of this code (its cells or globals differ from the compiled one's)"


def _recompile(code: str, entry: Any, args: tuple[Any, ...]) -> Recompile:
    """Which guard of ``entry`` fails for ``args``, as a :class:`Recompile`."""
    index, _ = entry.guards.explainer(*args)
    if index < 0:  # the guards pass: the entry was made for another closure or globals
        return Recompile(code, "CLOSURE", None, OTHER_CLOSURE)
    guard = entry.guards.guards.guards[index]
    failure = entry.guards.explain_failure(*args) or ""
    return Recompile(code, f"{guard.kind.name} {guard.source}", guard.where, failure)


def _line(where: str | None) -> str:
    """The text of the user's line at ``file:line``."""
    if where is None or ":" not in where:
        return ""
    filename, _, lineno = where.rpartition(":")
    return linecache.getline(filename, int(lineno)).strip() if lineno.isdigit() else ""
