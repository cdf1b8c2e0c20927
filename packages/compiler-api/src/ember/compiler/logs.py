"""Logging switches: ``EMBER_LOGS``, :func:`set_logs`, ``EMBER_DEBUG_FUNCTION`` and the
progress lines of slow compiles.

Each package logs with the standard :mod:`logging` module to its own logger
(``ember.capture``, ``ember.guards``, ``ember.aotgraph``, ``ember.inductor``,
``ember.compiler``) and writes *artifacts*, pieces of text a person reads on their own,
to child loggers (``ember.capture.graph_code``, ...; see :data:`ARTIFACTS`). This module
only sets levels, as ``TORCH_LOGS`` does for torch:

* ``EMBER_LOGS="+capture,guards,-inductor,graph_code"``: ``+name`` is DEBUG, ``name``
  INFO, ``-name`` ERROR only, for a package (or ``all``: every package); an artifact
  named is on, ``-artifact`` off. ``guards`` is both a package and an artifact: the name
  sets both.
* Artifacts that are facts (``guards``, ``recompiles``, ``graph_breaks``, ``perf``) are
  also shown when their package is at DEBUG; artifacts that are code (``graph_code``,
  ``bytecode``, ``aot_graphs``, ``output_code``, ``schedule``) only when named.
* Once anything is on, one handler on the ``ember`` logger prints to stderr and the
  records stop there (they do not reach the root logger twice). ``set_logs()`` with no
  argument restores the default: no handler, nothing set, every logger as ``logging``
  leaves it.

The environment is read in one function, :func:`environment`, when ``ember.compiler``
is imported.

>>> import logging
>>> set_logs(capture=logging.DEBUG, graph_code=True)
>>> logging.getLogger("ember.capture").level == logging.DEBUG
True
>>> set_logs()  # back to the default
>>> settings = parse("+capture,guards,graph_code")
>>> settings.levels, sorted(settings.artifacts)
({'capture': 10, 'guards': 20}, ['graph_code', 'guards'])
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

from ember.aotgraph import log as aotgraph_log
from ember.capture import log as capture_log
from ember.compiler import phases
from ember.compiler.settings import section as debug_section

__all__ = [
    "ARTIFACTS",
    "COMPONENTS",
    "Artifact",
    "LogSettings",
    "apply_environment",
    "apply_settings",
    "environment",
    "parse",
    "set_debug_function",
    "set_logs",
    "set_progress",
]

#: The packages' loggers, by the name ``EMBER_LOGS`` and :func:`set_logs` use.
COMPONENTS: dict[str, str] = {
    "capture": "ember.capture",
    "guards": "ember.guards",
    "aotgraph": "ember.aotgraph",
    "inductor": "ember.inductor",
    "compiler": "ember.compiler",
}


@dataclass(frozen=True, slots=True)
class Artifact:
    """One artifact: the loggers that write it, and whether it is code (shown only when
    named) or a fact (also shown when its package logs at DEBUG).

    >>> ARTIFACTS["graph_code"].code, ARTIFACTS["recompiles"].loggers
    (True, ('ember.guards.recompiles',))
    """

    loggers: tuple[str, ...]
    code: bool
    doc: str


ARTIFACTS: dict[str, Artifact] = {
    "graph_code": Artifact(("ember.capture.graph_code",), True, "each captured FX graph"),
    "bytecode": Artifact(
        ("ember.capture.bytecode",), True, "a frame's bytecode before and after (dis)"
    ),
    "graph_breaks": Artifact(("ember.capture.graph_breaks",), False, "reason and line"),
    "guards": Artifact(("ember.guards.guards",), False, "each entry's guards, with lines"),
    "recompiles": Artifact(("ember.guards.recompiles",), False, "the guard that failed"),
    "aot_graphs": Artifact(("ember.aotgraph.aot_graphs",), True, "forward/backward graphs"),
    "output_code": Artifact(("ember.inductor.output_code",), True, "the generated C++"),
    "schedule": Artifact(("ember.inductor.schedule",), True, "inductor's kernels, fusion"),
    "perf": Artifact(("ember.capture.perf", "ember.inductor.perf"), False, "seconds spent"),
}

_OFF = logging.CRITICAL + 1  # a code artifact not named: never shown, whatever its parent


@dataclass(frozen=True, slots=True)
class LogSettings:
    """What to log: a level per package (``"all"``: the ``ember`` logger) and the
    artifacts that are on.

    >>> LogSettings({"capture": logging.INFO}, frozenset({"guards"})).is_default()
    False
    """

    levels: dict[str, int] = field(default_factory=dict)
    artifacts: frozenset[str] = frozenset()

    def is_default(self) -> bool:
        """Whether nothing is set (no handler is needed)."""
        return not self.levels and not self.artifacts


def parse(spec: str) -> LogSettings:
    """Read an ``EMBER_LOGS`` value. Raises ValueError naming an unknown name.

    >>> parse("-inductor, recompiles").levels, sorted(parse("recompiles").artifacts)
    ({'inductor': 40}, ['recompiles'])
    >>> parse("graphcode")
    Traceback (most recent call last):
    ...
    ValueError: EMBER_LOGS: unknown name 'graphcode'; valid: all, capture, guards, ...
    """
    levels: dict[str, int] = {}
    artifacts: set[str] = set()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        sign, name = (item[0], item[1:]) if item[0] in "+-" else ("", item)
        if name not in COMPONENTS and name not in ARTIFACTS and name != "all":
            valid = ", ".join(["all", *COMPONENTS, *(a for a in ARTIFACTS if a != "guards")])
            raise ValueError(f"EMBER_LOGS: unknown name {name!r}; valid: {valid}")
        if name in COMPONENTS or name == "all":
            levels[name] = {"+": logging.DEBUG, "-": logging.ERROR}.get(sign, logging.INFO)
        if name in ARTIFACTS:
            (artifacts.discard if sign == "-" else artifacts.add)(name)
    return LogSettings(levels, frozenset(artifacts))


_handler: logging.Handler | None = None


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the ``sys.stderr`` of the moment (pytest's capsys replaces it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def apply_settings(settings: LogSettings) -> None:
    """Set every ember logger's level from ``settings`` (what :func:`parse` returns); install
    the stderr handler, or remove it for the default settings.

    >>> apply_settings(parse("+capture")); apply_settings(LogSettings())
    """
    global _handler
    top = logging.getLogger("ember")
    top.setLevel(settings.levels.get("all", logging.NOTSET))
    for name, logger in COMPONENTS.items():
        logging.getLogger(logger).setLevel(settings.levels.get(name, logging.NOTSET))
    for name, artifact in ARTIFACTS.items():
        off = _OFF if artifact.code else logging.NOTSET  # facts follow their package
        for logger in artifact.loggers:
            on = name in settings.artifacts
            logging.getLogger(logger).setLevel(logging.DEBUG if on else off)
    if _handler is not None:
        top.removeHandler(_handler)
        _handler = None
    top.propagate = settings.is_default()
    if not settings.is_default():
        _handler = _Stderr()
        _handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s: %(message)s"))
        top.addHandler(_handler)


def set_logs(
    *,
    all: int | None = None,
    capture: int | None = None,
    guards: int | bool | None = None,
    aotgraph: int | None = None,
    inductor: int | None = None,
    compiler: int | None = None,
    graph_code: bool = False,
    bytecode: bool = False,
    graph_breaks: bool = False,
    recompiles: bool = False,
    aot_graphs: bool = False,
    output_code: bool = False,
    schedule: bool = False,
    perf: bool = False,
) -> None:
    """Set what ember logs, as ``EMBER_LOGS`` does; every setting not passed goes back to
    its default (``set_logs()`` resets all). Packages take a level (``logging.DEBUG``,
    ...), artifacts True/False; ``guards`` takes either (a level also turns on the guards
    artifact, unless it is ERROR or above).

    >>> import logging
    >>> set_logs(guards=logging.INFO, recompiles=True)
    >>> logging.getLogger("ember.guards.recompiles").level == logging.DEBUG
    True
    >>> set_logs()
    """
    levels = {"all": all, "capture": capture, "aotgraph": aotgraph, "inductor": inductor,
              "compiler": compiler}  # fmt: skip
    named = {"graph_code": graph_code, "bytecode": bytecode, "graph_breaks": graph_breaks,
             "recompiles": recompiles, "aot_graphs": aot_graphs, "output_code": output_code,
             "schedule": schedule, "perf": perf}  # fmt: skip
    if isinstance(guards, bool):
        named["guards"] = guards
    elif guards is not None:
        levels["guards"] = guards
        named["guards"] = guards < logging.ERROR
    set_levels = {k: v for k, v in levels.items() if v is not None}
    apply_settings(LogSettings(set_levels, frozenset(k for k, on in named.items() if on)))


# ---- progress of slow compiles -------------------------------------------------------

PROGRESS_AFTER_S = 2.0  # a compile still running after this long shows progress lines
_progress: bool | None = None  # set_progress's choice; None: EMBER_PROGRESS decides


def set_progress(enabled: bool | None) -> None:
    """Show (True) or hide (False) the stderr lines of compiles that take more than two
    seconds; None goes back to ``EMBER_PROGRESS`` (default: shown; ``0`` hides them).

    >>> set_progress(False); set_progress(None)
    """
    global _progress
    _progress = enabled
    on = environment().progress if enabled is None else enabled
    capture_log.set_compile_watcher(_Progress if on else None)


class _Progress:
    """Watches one frame's compile; after ``PROGRESS_AFTER_S`` prints what it is doing
    (graph n of m, the phase) whenever that changes, and the total when it ends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="ember-progress", daemon=True)

    def __enter__(self) -> _Progress:
        self.start = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _watch(self) -> None:
        if self.done.wait(PROGRESS_AFTER_S):
            return  # a fast compile: silent
        last = None
        while True:
            state = _now_compiling()
            if state != last:
                spent = time.perf_counter() - self.start
                _say(f"compiling {self.name}: {state} ({spent:.1f} s so far)")
                last = state
            if self.done.wait(0.25):
                break
        _say(f"compiled {self.name} in {time.perf_counter() - self.start:.1f} s")


def _now_compiling() -> str:
    """``graph n of m (what), phase NAME``: the graph aotgraph compiles now and the phase
    most recently entered in any layer's recorder."""
    n, of, what = aotgraph_log.current_graph() or (1, 1, "")
    recorders = {id(rec): rec for _, rec, _ in phases.PHASES}.values()
    running = [entry for rec in recorders for entry in getattr(rec, "active", ())]
    phase = max(running, key=lambda entry: entry[1])[0] if running else "starting"
    return f"graph {n} of {of}{f' ({what})' if what else ''}, phase {phase}"


def _say(line: str) -> None:
    print(f"ember: {line}", file=sys.stderr, flush=True)


# ---- the environment -----------------------------------------------------------------


def set_debug_function(name: str | None) -> None:
    """Compile only frames of functions named ``name``; the others run as they are (the
    functions they call are still compiled if so named), as torch's
    ``TORCHDYNAMO_DEBUG_FUNCTION``. Nothing is recorded in ``stats.failures``: it is the
    user's choice, not a failure. None: compile every frame.

    >>> set_debug_function("forward"); set_debug_function(None)
    """
    capture_log.set_debug_function(name)


@dataclass(frozen=True, slots=True)
class Environment:
    """The logging settings the environment holds."""

    logs: str = ""  # EMBER_LOGS
    debug_function: str | None = None  # EMBER_DEBUG_FUNCTION
    progress: bool = True  # EMBER_PROGRESS (0: off)


def environment() -> Environment:
    """The logging settings of ``config.debug`` (``EMBER_LOGS``, ``EMBER_DEBUG_FUNCTION``,
    ``EMBER_PROGRESS``): the one place they are read.

    >>> isinstance(environment(), Environment)
    True
    """
    debug = debug_section.get()
    return Environment(debug.logs, debug.debug_function or None, debug.progress)


def apply_environment() -> None:
    """Apply :func:`environment` (``ember.compiler`` does it at import). A bad
    ``EMBER_LOGS`` warns, naming the bad name, and logs nothing: it never stops the
    program.

    >>> apply_environment()
    """
    env = environment()
    try:
        settings = parse(env.logs)
    except ValueError as bad:
        warnings.warn(str(bad), stacklevel=2)
        settings = LogSettings()
    apply_settings(settings)
    set_debug_function(env.debug_function)
    set_progress(_progress)
