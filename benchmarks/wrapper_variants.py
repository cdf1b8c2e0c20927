"""An inductor wrapper bound other ways, for before/after timings in one process.

:func:`watch_wrappers` puts every C++ wrapper compiled afterwards behind a
:class:`Switch` (the graph cache is turned off, so that each graph's schedule is at
hand); :func:`rebind` binds the same schedule and kernels as

- ``"twin"``: with the Python twins of the C++ launcher (``ember.inductor.wrapper_launch``),
  as where ``ember.inductor._launch`` is not built;
- a git ref: by that ref's ``inductor/wrapper.py`` (the wrapper before a change).

A benchmark swaps ``switch.call`` between its timed rounds (``bench_optim.py
--wrappers``, ``bench_overhead.py --wrappers``).
"""

from __future__ import annotations

import subprocess
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Switch:
    """A compiled graph's wrapper, swappable between the rounds of one process."""

    def __init__(self, graph: Any, call: Callable[..., Any]) -> None:
        self.graph, self.call = graph, call

    def __call__(self, *args: Any) -> Any:
        return self.call(*args)


_SEEN: list[Switch] = []


def watch_wrappers() -> list[Switch]:
    """Every inductor wrapper bound from the first call on, behind a :class:`Switch`, in
    the order bound (one list for the process: take what follows its length before)."""
    from ember.inductor import compile as inductor_compile
    from ember.inductor import settings

    finish = inductor_compile.CompiledGraph._finish
    if getattr(finish, "watched", False):
        return _SEEN
    settings.section.set(graph_cache=False)  # every graph compiled here: its schedule at hand

    def watched(graph: Any) -> Any:
        _SEEN.append(Switch(graph, finish(graph)))
        return _SEEN[-1]

    watched.watched = True  # type: ignore[attr-defined]
    inductor_compile.CompiledGraph._finish = watched  # type: ignore[method-assign]
    return _SEEN


def rebind(switch: Switch, how: str) -> Callable[..., Any]:
    """The wrapper of ``switch``'s graph bound as ``how`` (see the module docstring)."""
    from ember.inductor import cache, settings, wrapper

    graph = switch.graph
    if graph._build is None or graph.schedule is None:  # not C++ kernels: as it is
        return switch.call
    lib = cache.load(graph._build.result()[0])
    if how == "twin":
        with settings.section.patch(pure_launch=True):
            source, consts = wrapper.wrapper_source(graph.schedule, graph.kernel_args)
            return wrapper.bind(source, consts, graph.kernel_args, lib)
    text = subprocess.run(
        ["git", "show", f"{how}:packages/inductor/src/ember/inductor/wrapper.py"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parent,
    ).stdout  # fmt: skip
    ref = types.ModuleType(f"wrapper_at_{how}")
    ref.__file__ = wrapper.__file__
    exec(compile(text, f"wrapper.py at {how}", "exec"), ref.__dict__)
    source, consts = ref.wrapper_source(graph.schedule, graph.kernel_args)
    bound: Callable[..., Any] = ref.bind(source, consts, graph.kernel_args, lib)
    return bound
