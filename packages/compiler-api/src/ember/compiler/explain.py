"""``explain(fn)(*args, **kwargs)``: run ``fn`` once under ember and report what it captured.

Every graph, every graph break with where and why it happened (and how to avoid
it), the ops in each graph, the guards that protect it, and the time spent
compiling: all breaks of the run in one pass, since resume functions are
compiled as the run reaches them.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ember.capture import hook
from ember.capture.frame_compiler import Failure, FrameCompiler, code_cache
from ember.guards import GuardSet
from ember.guards.state import BACKEND_VAR

_SERIAL = itertools.count()


@dataclass(frozen=True, slots=True)
class BreakReason:
    """One graph break (or a frame that ran eagerly): where, why, and how to avoid it."""

    reason: str
    category: str
    filename: str
    lineno: int | None
    source: str  # the text of that line
    hint: str

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno}"
        hint = f"\n    hint: {self.hint}" if self.hint else ""
        return f"{self.reason}\n    {where}: {self.source}{hint}"


@dataclass(frozen=True, slots=True)
class ExplainOutput:
    """What ``explain`` found. ``str()`` gives a readable report.

    ``eager_frames`` are frames that could not be captured or broken at all and
    ran eagerly (their reasons are in ``break_reasons`` too).
    """

    graphs: tuple[torch.fx.GraphModule, ...]
    graph_count: int
    graph_break_count: int
    break_reasons: tuple[BreakReason, ...]
    ops_per_graph: tuple[tuple[str, ...], ...]
    guards: tuple[GuardSet, ...]
    compile_time: float
    eager_frames: int

    def __str__(self) -> str:
        lines = [
            f"Graph count: {self.graph_count}",
            f"Graph break count: {self.graph_break_count}",
            f"Frames run eagerly: {self.eager_frames}",
            f"Compile time: {self.compile_time:.3f} s",
            "Break reasons:",
        ]
        lines += [f"  {i}. {r}" for i, r in enumerate(self.break_reasons, 1)] or ["  (none)"]
        lines.append("Ops per graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  graph {i}: {', '.join(ops) or '(no ops)'}")
        lines.append("Guards:")
        for i, guards in enumerate(self.guards, 1):
            lines.append(f"  graph {i}: {len(guards.guards)} guards")
        return "\n".join(lines)


def break_reason(f: Failure) -> BreakReason:
    """A break (or eager frame) as the stats record it, as explain and the profiler show it."""
    w = f.where
    return BreakReason(
        f.reason,
        f.category,
        w.filename if w else "?",
        w.lineno if w else None,
        w.text if w else "",
        f.hint,
    )


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", repr(target))


def explain(fn: Callable[..., Any]) -> Callable[..., ExplainOutput]:
    """``explain(fn)(*args, **kwargs)``: run ``fn`` once under ember and report what happened.

    >>> import torch
    >>> def toy_example(a, b):
    ...     x = a / (torch.abs(a) + 1)
    ...     if b.sum() < 0:
    ...         b = b * -1
    ...     return x * b
    >>> out = explain(toy_example)(torch.ones(3), torch.ones(3))
    >>> out.graph_count, out.graph_break_count
    (2, 1)
    >>> print(out.break_reasons[0].reason)
    data-dependent jump (`if b.sum() < 0:`)
    """

    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        graphs: list[torch.fx.GraphModule] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
            graphs.append(gm)
            return gm.forward

        # A backend name of its own: entries made for other backends are not served to
        # this run (every frame is translated again), and this run's entries are
        # removed afterwards, so explaining leaves the caches as they were.
        name = f"ember.explain#{next(_SERIAL)}"
        target = getattr(fn, "__func__", fn)  # as compile() does: fn's own frame is compiled
        entry = (target.__code__,) if isinstance(target, types.FunctionType) else ()
        compiler = FrameCompiler(backend, name, track=True, entry_codes=entry)
        runner = hook.bound_call(compiler, fn, BACKEND_VAR, name)
        try:
            runner(*args, **kwargs)
        finally:
            _forget(compiler)
        return _report(compiler, graphs)

    return run


def _report(compiler: FrameCompiler, graphs: list[torch.fx.GraphModule]) -> ExplainOutput:
    stats = compiler.stats
    reasons = tuple(break_reason(f) for f in [*stats.breaks, *stats.failures])
    ops = tuple(
        tuple(_op_name(n) for n in c.graph.graph.nodes if n.op in ("call_function", "call_method"))
        for c in stats.compiled
    )
    return ExplainOutput(
        graphs=tuple(graphs),
        graph_count=stats.graphs,
        graph_break_count=len(stats.breaks),
        break_reasons=reasons,
        ops_per_graph=ops,
        guards=tuple(c.guards for c in stats.compiled),
        compile_time=sum(c.seconds for c in stats.compiled),
        eager_frames=len(stats.failures),
    )


def _forget(compiler: FrameCompiler) -> None:
    """Remove the entries this explain run added (they are guarded on its own backend)."""
    for code, entry, cache_entry in compiler.made:
        hook.remove_entry(code, entry)
        code_cache(code).remove(cache_entry)
