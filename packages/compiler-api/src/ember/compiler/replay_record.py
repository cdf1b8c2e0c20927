"""Replay records: a frame that failed to compile, saved so that its compile can run again.

With ``compile(..., options={"replay_record": True})`` or ``EMBER_REPLAY_RECORD=1``, each
frame that fails to compile (it ran eagerly, or raised under ``fullgraph=True``) writes a
record to ``EMBER_REPRO_DIR`` (default ``./ember_repro``): its code (``marshal``), its
module's name, the argument values and their metadata, the globals its code names and its
closure's values (``pickle``; a value that does not pickle is left out, and the module's
own value is used on replay), and the backend. :func:`replay` compiles that frame again,
alone, and returns what happened.

>>> import torch, ember.compiler, tempfile, pathlib
>>> def picky(gm, example_inputs):
...     raise RuntimeError("this backend takes nothing")
>>> folder = tempfile.mkdtemp()
>>> f = ember.compiler.compile(lambda x: x.cos() + 1, backend=picky,
...                            options={"replay_record": True, "repro_dir": folder})
>>> _ = f(torch.ones(2))
>>> [path] = pathlib.Path(folder).glob("replay_*.pkl")
>>> stats = ember.compiler.replay(path, backend=picky)
>>> stats.failures[0].reason.split(": ", 1)[1]
'RuntimeError: this backend takes nothing'
"""

from __future__ import annotations

import builtins
import functools
import importlib
import itertools
import logging
import marshal
import os
import pickle
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.capture.frame_compiler import Failure, FrameCompiler, Stats
from ember.capture.hook import Frame, MadeFrame
from ember.compiler.configuration import config
from ember.compiler.repro_settings import ReproSettings

log = logging.getLogger("ember.compiler.replay")


@dataclass(frozen=True, slots=True)
class _ModuleRef:
    """A global that is a module: imported again on replay."""

    name: str


@dataclass(frozen=True, slots=True)
class _Pickled:
    """One value, pickled on its own: a value that does not load again (a function of another
    process's ``__main__``) costs only itself, not the whole record."""

    data: bytes

    def load(self) -> Any:
        return pickle.loads(self.data)


def _value(kept: Any) -> Any:
    """A recorded value as it was (modules imported again)."""
    if isinstance(kept, _ModuleRef):
        return importlib.import_module(kept.name)
    return kept.load() if isinstance(kept, _Pickled) else kept


@dataclass(frozen=True, slots=True)
class ReplayRecord:
    """What a replay record holds (pickled as one object).

    >>> ReplayRecord(b"", "m", "f", (), {}, {}, (), "eager", None, False, "why").name
    'f'
    """

    code: bytes  # marshal.dumps of the frame's code object
    module: str  # its module's __name__: the base of its globals on replay
    name: str
    args: Any  # the frame's arguments (as the hook sees them), pickled
    globals: dict[str, Any]  # the globals its code names that pickled, each on its own
    missing: dict[str, str]  # names that did not pickle -> why
    closure: tuple[Any, ...]  # the closure's cell contents, each pickled on its own
    backend: Any  # a registered name, the backend callable (pickled by reference), or None
    options: dict[str, Any] | None
    fullgraph: bool
    reason: str  # the failure recorded then
    defaults: tuple[Any, ...] | None = None
    inputs: list[str] = field(default_factory=list)  # the arguments' metadata, in words

    def values(self) -> dict[str, Any]:
        """The recorded globals, loaded (those that load in this process).

        >>> ReplayRecord(b"", "m", "f", (), {"k": _Pickled(pickle.dumps(2))}, {}, (),
        ...              "eager", None, False, "why").values()
        {'k': 2}
        """
        loaded = {}
        for name, kept in self.globals.items():
            try:
                loaded[name] = _value(kept)
            except Exception as e:  # its module's own value is used instead
                log.warning("ember replay: global %s does not load (%s)", name, e)
        return loaded


def record_failures(
    compiler: FrameCompiler, backend: Any, options: dict[str, Any] | None, settings: ReproSettings
) -> None:
    """Make ``compiler`` write a replay record for each frame that fails (if settings say so)."""
    if not settings.replay_record:
        return
    counter = itertools.count()

    def on_failure(frame: Frame, failure: Failure) -> None:
        try:
            record = _record(frame, failure, backend, options, compiler.fullgraph)
            folder = Path(settings.directory)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"replay_{frame.code.co_name}_{os.getpid()}_{next(counter)}.pkl"
            path.write_bytes(pickle.dumps(record))
            log.warning("ember: %s failed to compile; replay record: %s", failure.code, path)
        except Exception as bug:  # a record is a help, never a new failure
            log.warning("ember could not write a replay record: %s: %s", type(bug).__name__, bug)

    compiler.on_failure = on_failure


def _names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the code objects nested in it may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _picklable(value: Any) -> tuple[Any, str]:
    if isinstance(value, types.ModuleType):
        return _ModuleRef(value.__name__), ""
    if isinstance(value, str | None):
        return value, ""
    try:
        return _Pickled(pickle.dumps(value)), ""
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def _record(
    frame: Frame, failure: Failure, backend: Any, options: dict[str, Any] | None, fullgraph: bool
) -> ReplayRecord:
    glb, missing = {}, {}
    for name in sorted(_names(frame.code) & set(frame.globals)):
        glb[name], why = _picklable(frame.globals[name])
        if why:
            missing[name] = why
            del glb[name]
    cells = tuple(_picklable(c.cell_contents)[0] for c in frame.function.__closure__ or ())
    kept_backend, why = _picklable(backend)  # None if it does not: replay(backend=...)
    if why:
        missing["<backend>"] = f"{backend!r}: {why}"
    return ReplayRecord(
        marshal.dumps(frame.code),
        str(frame.globals.get("__name__", "__main__")),
        frame.function.__name__,
        _Pickled(pickle.dumps(tuple(frame.args))),
        glb,
        missing,
        cells,
        kept_backend,
        options,
        fullgraph,
        failure.reason,
        _picklable(frame.function.__defaults__)[0],
        [_describe(a) for a in frame.args],
    )


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"{type(value).__name__}{tuple(shape)} {value.dtype} stride={value.stride()}"
    return type(value).__name__


def load(path: str | os.PathLike[str]) -> ReplayRecord:
    """Read a replay record (a pickle: load only records you wrote)."""
    record = pickle.loads(Path(path).read_bytes())
    if not isinstance(record, ReplayRecord):
        raise TypeError(f"{path} is not an ember replay record")
    return record


def replay(path: str | os.PathLike[str], *, backend: Any = None) -> Stats:
    """Compile the frame of the replay record at ``path`` again, alone, with its backend
    (or ``backend``), and return the stats: a failure that reproduces is in
    ``stats.failures`` (under ``fullgraph=True`` it raises
    :class:`ember.compiler.FullGraphError`, as it did). The frame is compiled, not run.

    >>> replay("no-such-record.pkl")
    Traceback (most recent call last):
    FileNotFoundError: [Errno 2] No such file or directory: 'no-such-record.pkl'
    """
    from ember.compiler.wrap import _configured

    record = load(path)
    code = marshal.loads(record.code)
    glb = _globals(record)
    closure = tuple(types.CellType(_value(v)) for v in record.closure) or None
    fn = types.FunctionType(code, glb, record.name, _value(record.defaults), closure)
    chosen = backend if backend is not None else _loaded_backend(record)
    if chosen is None:
        raise ValueError(
            f"the backend of this record does not load here ({record.missing.get('<backend>')}); "
            "pass it: replay(path, backend=...)"
        )
    made = _configured(chosen, None, record.options)
    scope = functools.partial(config.patch, made.settings) if made.settings else None
    compiler = FrameCompiler(
        made.backend, made.name, fullgraph=record.fullgraph, entry_codes=(code,), scope=scope
    )
    compiler(MadeFrame(code, fn, glb, _builtins(glb), _value(record.args)))
    return compiler.stats


def _globals(record: ReplayRecord) -> dict[str, Any]:
    """The frame's globals: its module's (when it imports), with the recorded values over them."""
    try:
        glb = dict(vars(importlib.import_module(record.module)))
    except Exception:
        glb = {"__name__": record.module, "__builtins__": builtins}
    glb.update(record.values())
    return glb


def _loaded_backend(record: ReplayRecord) -> Any:
    try:
        return _value(record.backend)
    except Exception as e:  # a backend of another process's __main__, say
        return record.missing.setdefault("<backend>", f"{type(e).__name__}: {e}") and None


def _builtins(glb: dict[str, Any]) -> dict[str, Any]:
    b = glb.get("__builtins__", builtins)
    return b if isinstance(b, dict) else vars(b)
