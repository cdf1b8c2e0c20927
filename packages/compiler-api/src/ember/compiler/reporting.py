"""``report(path)``: one self-contained HTML page about everything compiled in this run.

``compile()`` registers each compiled callable here and wraps its backend in an
:class:`_Observer`, which keeps, per captured graph, the backend's time, the code the
backend generated (aten graphs; inductor's C++ kernels and Python wrapper) and, while
calls are counted, how often the graph served a call. :func:`report` reads these
records, the callables' ``stats``, the guard caches (recompilations) and
:func:`~ember.compiler.compile_times`, and :mod:`ember.compiler.report_html` writes
the page. With ``EMBER_REPORT=dir`` the page is written into ``dir`` at exit.

Counting calls costs about a microsecond per call of a compiled graph, so it is on
only with ``EMBER_REPORT`` set or after :func:`count_calls`; the page says so when off.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ember.capture.frame_compiler import FrameCompiler
from ember.compiler.settings import section as debug_section

#: The environment variable naming the folder the exit report goes to.
ENV = "EMBER_REPORT"


@dataclass
class Generated:
    """One graph a backend compiled inside its call (``stage``: forward, backward,
    inference): its code, and inductor's C++ source. Only text is kept, and the compiled
    object weakly (its Python wrapper is written at its first call): the report must not
    keep a dropped program's kernels or constants alive."""

    stage: str
    code: str
    source: str | None  # inductor's C++ (None: none, or it came from the graph cache)
    kernels: bool  # an inductor CompiledGraph
    compiled: Callable[[], Any]  # a weak reference, or a function returning None

    @property
    def wrapper(self) -> str:
        """Inductor's Python wrapper around the kernels, once the graph has run."""
        wrapper = getattr(self.compiled(), "wrapper", "")
        return wrapper if isinstance(wrapper, str) else ""


class Calls:
    """How many calls a compiled graph served (its first call compiled it)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


@dataclass
class GraphRecord:
    """What the report keeps about one captured graph beyond the stats."""

    backend_seconds: float = 0.0
    generated: list[Generated] = field(default_factory=list)
    calls: Calls | None = None  # None: calls were not counted when it compiled


class _Counted:
    """A compiled graph that counts its calls in ``calls`` (the report keeps only that)."""

    __slots__ = ("calls", "fn")

    def __init__(self, fn: Callable[..., Any], calls: Calls) -> None:
        self.fn, self.calls = fn, calls

    def __call__(self, *args: Any) -> Any:
        self.calls.n += 1
        return self.fn(*args)


_local = threading.local()  # .notes: a stack of lists, one per backend call in progress
_counting = False


def count_calls(enabled: bool = True) -> None:
    """Count, from now on, how often each newly compiled graph serves a call, for the report
    (about 1 us per call; ``EMBER_REPORT`` turns it on at startup).

    >>> count_calls(True); count_calls(False)
    """
    global _counting
    _counting = enabled


class _Observer:
    """The backend as ``compile()`` calls it: the same result, with a record per graph."""

    def __init__(self, backend: Callable[..., Any]) -> None:
        self.backend = backend
        self.graphs: weakref.WeakKeyDictionary[torch.fx.GraphModule, GraphRecord] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        notes: list[Generated] = []
        stack = _local.__dict__.setdefault("notes", [])
        stack.append(notes)
        start = time.perf_counter()
        try:
            compiled = self.backend(gm, example_inputs, **kwargs)
        finally:
            stack.pop()
        record = GraphRecord(time.perf_counter() - start, notes)
        if _counting and callable(compiled):
            record.calls = Calls()
            compiled = _Counted(compiled, record.calls)
        self.graphs[gm] = record
        return compiled


def note(stage: str, graph: torch.fx.GraphModule, compiled: Any) -> None:
    """Called by a backend for each graph it compiles inside its call (``aot_eager``,
    ``inductor``): the report shows its code under the captured graph.

    >>> note("forward", torch.fx.symbolic_trace(lambda x: x), None)  # outside a backend call
    """
    stack = getattr(_local, "notes", None)
    if not stack:
        return
    source = getattr(compiled, "source", None)
    try:
        ref: Callable[[], Any] = weakref.ref(compiled)
    except TypeError:  # not weakly referable: no wrapper to show
        ref = _nothing
    code = graph.code if isinstance(graph, torch.fx.GraphModule) else repr(graph)
    kernels = hasattr(compiled, "kernel_args")
    text = source if isinstance(source, str) else None
    stack[-1].append(Generated(stage, code, text, kernels, ref))


def _nothing() -> None:
    return None


def noting(stage: str, compiler: Callable[..., Any]) -> Callable[..., Any]:
    """``compiler`` (an aotgraph fw/bw/inference compiler) that notes what it compiles.

    >>> noting("forward", lambda gm, inputs: gm)(torch.fx.symbolic_trace(lambda x: x), []).code
    '\\n\\n\\ndef forward(self, x):\\n    return x\\n    '
    """

    def compile_noted(graph: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        compiled = compiler(graph, inputs)
        note(stage, graph, compiled)
        return compiled

    compile_noted.__wrapped__ = compiler  # type: ignore[attr-defined]  # repro scripts import it
    return compile_noted


@dataclass
class Watched:
    """One compiled callable: its label, backend name, frame compiler and observer."""

    label: str
    backend: str
    compiler_ref: Callable[[], FrameCompiler | None]
    observer: _Observer
    keep: FrameCompiler | None = None  # a strong reference, for the latest KEEP_DROPPED


_WATCHED: list[Watched] = []
_LOCK = threading.Lock()


def observe(backend: Callable[..., Any]) -> _Observer:
    """Wrap ``backend`` for the report (``compile()`` calls it; see :func:`watch`)."""
    return _Observer(backend)


#: How many of the latest compiled callables the report keeps after the program drops
#: them (a loop that compiles a fresh callable per step still shows its frames; older
#: dropped ones leave the report, with their graphs, instead of growing memory).
KEEP_DROPPED = 256


def watch(label: str, backend: str, compiler: FrameCompiler) -> FrameCompiler:
    """Register a compiled callable's frame compiler, whose backend is an observer
    (``compile()`` calls it); return the compiler. The latest :data:`KEEP_DROPPED` are held
    strongly; older ones while the program holds them."""
    observer = compiler.backend
    assert isinstance(observer, _Observer)
    with _LOCK:
        _WATCHED.append(Watched(label, backend, weakref.ref(compiler), observer, compiler))
        for w in _WATCHED[:-KEEP_DROPPED]:
            w.keep = None
        _WATCHED[:] = [w for w in _WATCHED if w.compiler_ref() is not None]
    return compiler


def watched() -> list[tuple[Watched, FrameCompiler]]:
    """The registered callables still alive, in compile order."""
    with _LOCK:
        alive = [(w, w.compiler_ref()) for w in _WATCHED]
    return [(w, c) for w, c in alive if c is not None]


def clear() -> None:
    """Forget every registered callable (``ember.compiler.reset()`` calls it)."""
    with _LOCK:
        _WATCHED.clear()


def report(path: str | os.PathLike[str] | None = None) -> Path:
    """Write the compile report of this run, one self-contained HTML file; return its path.

    The page shows each compiled frame (its source with the captured lines marked, its
    graphs, graph breaks with reason and hint, guards, recompilations and why), the code
    generated for each graph, the time per compile phase (:func:`compile_times`), how
    often each graph served a call (see :func:`count_calls`) and a plot of compile time
    per frame. ``path`` is the file if it ends in ``.html``, else a folder to write
    ``ember-report-<pid>.html`` in (default: the current folder). The page loads nothing
    from elsewhere and reads without JavaScript.

    >>> import tempfile, torch, ember.compiler
    >>> f = ember.compiler.compile(lambda x: x.relu() + 1, backend="eager")
    >>> _ = f(torch.ones(2))
    >>> page = ember.compiler.report(tempfile.mkdtemp())
    >>> page.name.startswith("ember-report-"), "Time per phase" in page.read_text()
    (True, True)
    """
    from ember.compiler.report_html import render

    target = Path(path) if path is not None else Path.cwd()
    if target.suffix.lower() not in (".html", ".htm"):  # a folder, made if need be
        target = target / f"ember-report-{os.getpid()}.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(), encoding="utf-8")
    return target


@contextmanager
def _quiet_errors() -> Iterator[None]:
    try:
        yield
    except Exception as e:  # the program has ended: a failed report must not hide its result
        print(f"ember: could not write the compile report: {e!r}", file=sys.stderr)


def _at_exit() -> None:
    folder = debug_section.get().report
    if folder:
        with _quiet_errors():
            Path(folder).mkdir(parents=True, exist_ok=True)
            print(f"ember: compile report written to {report(folder)}", file=sys.stderr)


if debug_section.get().report:  # EMBER_REPORT
    count_calls(True)
    atexit.register(_at_exit)
