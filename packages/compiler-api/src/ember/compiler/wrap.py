"""``compile()``: wrap a function or module so that its calls run through ember."""

from __future__ import annotations

import functools
import inspect
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import torch

from ember.capture import _eval_frame, hook
from ember.capture.frame_compiler import FrameCompiler, Stats
from ember.capture.shapes import Policy
from ember.compiler import ddp, reporting
from ember.compiler.backends import (
    Backend,
    automatic_dynamic,
    backend_name,
    lookup_backend,
    supports_dynamic,
)
from ember.compiler.configuration import MODE_OPTIONS, config
from ember.compiler.optimized import CompileSettings
from ember.compiler.optimized import OptimizedModule as OptimizedModule  # re-exported
from ember.compiler.phases import timed_backend
from ember.compiler.repro_settings import ReproSettings
from ember.guards.state import BACKEND_VAR

F = TypeVar("F", bound=Callable[..., Any])


class CompiledFunction(functools.partial[Any]):
    """What ``compile(fn)`` returns: call it like ``fn``; ``stats`` says what was captured.

    A ``functools.partial`` over ember's C entry point, so that calling it adds
    no Python frame: the call sets the thread's frame callback and the current
    backend, calls ``fn``, and restores both.

    >>> import ember.compiler
    >>> cf = ember.compiler.compile(lambda x: x + 1)
    >>> cf(1), cf.stats.graphs
    (2, 0)
    """

    _compiler: FrameCompiler

    def __new__(cls, fn: Callable[..., Any], compiler: FrameCompiler) -> CompiledFunction:
        self = super().__new__(cls, *_entry_args(compiler), fn)
        self._compiler = compiler
        functools.update_wrapper(self, fn)
        return self

    @property
    def stats(self) -> Stats:
        """Graphs compiled and frames that ran eagerly (with reasons), so far."""
        return self._compiler.stats

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<ember compiled {getattr(self, '__qualname__', self.func)!r}>"


def _entry_args(compiler: FrameCompiler) -> tuple[Any, ...]:
    """The leading arguments of ``call_with_callback`` for calls compiled by ``compiler``."""
    bound = hook.bound_call(compiler, _unused, BACKEND_VAR, compiler.guard_key)
    return (bound.func, *bound.args[:-1])


@dataclass(frozen=True, slots=True)
class Configured:
    """What ``compile()`` made of its ``backend``, ``mode`` and ``options``."""

    backend: Backend  # with its own options bound
    name: str  # what the backend guard compares: options and settings are part of it
    settings: dict[str, Any]  # ember settings ("section.name") for this object's compiles


def _configured(
    backend: str | Backend, mode: str | None, options: dict[str, Any] | None
) -> Configured:
    """Split ``options`` into the backend's own and ember's settings (``"section.name"``
    keys, under the ``mode``'s table), and bind the backend's. The name the guard compares
    holds both, so callables compiled with other options never share cache entries.

    Every option is checked here, so that a bad one is an error at ``compile()`` that
    names it, never a raw error at the first call.
    """
    fn, name, own = _backend_options(backend, mode, options)
    settings = (MODE_OPTIONS[mode] if mode else {}) | {
        k: v for k, v in (options or {}).items() if k not in own
    }
    config.split(settings)  # checks each value (the keys are known)
    if mode is not None:
        _warn_mode_once(mode, name)
    if settings:
        name = f"{name} settings={sorted(settings.items())!r}"
    return Configured(fn, name, settings)


# The backends a mode changes something for (by its settings), and why it does nothing for
# the others. reduce-overhead means CUDA graphs around inductor's graphs of CUDA tensors
# (the cudagraphs backend makes them around aten graphs); on CPU ember's per-call path (the
# C hook, one compiled guard check, the replacement function) has no costlier default that
# a mode could switch off, so it changes nothing there.
_MODE_REACH: dict[str, tuple[frozenset[str], str]] = {
    "default": (frozenset({"eager", "aot_eager", "inductor"}), ""),
    "reduce-overhead": (
        frozenset({"inductor"}),
        "it means CUDA graphs around inductor's graphs (backend='cudagraphs' makes them"
        " around aten graphs)",
    ),
    "max-autotune": (frozenset({"inductor"}), "it tunes inductor's generated kernels"),
    "max-autotune-no-cudagraphs": (frozenset({"inductor"}), "it tunes inductor's kernels"),
}
_warned_modes: set[tuple[str, str]] = set()


def _warn_mode_once(mode: str, backend: str) -> None:
    """Say once per (mode, backend) that the mode does nothing here, and why
    (``debug.warn_modes=False`` silences it)."""
    reach, why = _MODE_REACH[mode]
    base = backend.split("[", 1)[0]
    if base not in _MODE_REACH["default"][0]:
        return  # a user's backend gets options["mode"] and may act on it
    if base in reach or (mode, base) in _warned_modes or not config.debug.warn_modes:
        return
    _warned_modes.add((mode, base))
    message = f"mode {mode!r} has no effect with backend {base!r}: {why}"
    warnings.warn(message, UserWarning, stacklevel=4)


def _is_setting(key: Any) -> bool:
    try:
        return isinstance(key, str) and "." in key and bool(config.key(key))
    except KeyError:
        return False


def _backend_options(
    backend: str | Backend, mode: str | None, options: dict[str, Any] | None
) -> tuple[Backend, str, dict[str, Any]]:
    """The backend with its own options bound, its guard name, and those options."""
    if not isinstance(backend, str) and not callable(backend):
        raise TypeError(f"backend must be a registered name or a callable, not {backend!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(
            f"options must be a dict of option names to values, not {type(options).__name__}"
        )
    fn, name = lookup_backend(backend), backend_name(backend)
    if not isinstance(backend, str):
        fn = _CheckedBackend(fn, name)
    if bad := [key for key in options or {} if not isinstance(key, str)]:
        raise TypeError(f"backend {name!r}: option names must be strings, not {bad[0]!r}")
    known = getattr(fn, "known_options", None)  # a backend may list the options it reads
    try:
        takes_options = "options" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_options = False
    own = {
        k: v
        for k, v in (options or {}).items()
        if (k in known if known is not None else takes_options and not _is_setting(k))
    }
    _no_such(name, {k for k in options or {} if k not in own and not _is_setting(k)},
             known if takes_options else None)  # fmt: skip
    merged = own | ({"mode": mode} if mode is not None else {})
    if not takes_options or not merged:
        return fn, name, {}  # a mode means nothing to this backend
    _check_options(fn, name, own)
    bound: Backend = functools.partial(fn, options=merged)  # type: ignore[call-arg]
    return bound, f"{name}{sorted(merged.items())!r}", own


def _no_such(name: str, unknown: set[str], known: tuple[str, ...] | None) -> None:
    """An error naming options that are neither the backend's nor ember settings."""
    if not unknown:
        return
    settings = f"; ember's settings (written section.name) are {', '.join(config.list_options())}"
    if known is None:
        raise TypeError(f"backend {name!r} takes no options (got {sorted(unknown)}){settings}")
    raise ValueError(
        f"backend {name!r} has no option {', '.join(map(repr, sorted(unknown)))}; "
        f"its options are {', '.join(sorted(known))}{settings}"
    )


def _check_options(fn: Backend, name: str, options: dict[str, Any]) -> None:
    """Reject values the backend's rules refuse."""
    rules = getattr(fn, "option_rules", {})  # and how to check each value
    for key, value in options.items():
        if key in rules and (wrong := rules[key].check(value)):
            raise ValueError(f"backend {name!r}: option {key!r} {wrong}")


class _CheckedBackend:
    """A user's backend callable, held to the backend contract: it must return a callable,
    and that callable must return one value per graph output. A break of the contract is
    an error naming the backend (at compile time, the frame runs eagerly with it as the
    recorded reason), never a raw error or a wrong answer later.

    >>> import torch
    >>> bad = _CheckedBackend(lambda gm, inputs: 3, "mine")
    >>> bad(torch.fx.symbolic_trace(lambda x: (x,)), [])
    Traceback (most recent call last):
    TypeError: backend 'mine' returned 3, which is not callable
    """

    def __init__(self, fn: Backend, name: str) -> None:
        self.fn, self.name = fn, name
        functools.update_wrapper(self, fn)

    def __call__(self, gm: torch.fx.GraphModule, inputs: list[Any], **kw: Any) -> Any:
        compiled = self.fn(gm, inputs, **kw)
        if not callable(compiled):
            raise TypeError(f"backend {self.name!r} returned {compiled!r}, which is not callable")
        out = gm.graph.output_node().args[0]
        count = len(out) if isinstance(out, tuple | list) else None
        return compiled if count is None else _CountedOutputs(compiled, count, self.name)


class _CountedOutputs:
    """What a user's backend compiled, checked on each call to return ``count`` outputs."""

    __slots__ = ("compiled", "count", "name")

    def __init__(self, compiled: Callable[..., Any], count: int, name: str) -> None:
        self.compiled, self.count, self.name = compiled, count, name

    def __call__(self, *args: Any) -> Any:
        result = self.compiled(*args)
        if not isinstance(result, tuple | list) or len(result) != self.count:
            got = len(result) if isinstance(result, tuple | list) else type(result).__name__
            raise RuntimeError(
                f"backend {self.name!r} compiled a graph with {self.count} outputs into a "
                f"callable that returned {got}: the backend breaks the contract "
                "(gm, example_inputs) -> callable returning the graph's outputs"
            )
        return result


def _unused() -> None:  # pragma: no cover - only a placeholder fn for bound_call's arguments
    raise AssertionError


MODES = tuple(MODE_OPTIONS)


@overload
def compile(  # type: ignore[overload-overlap] # a Module is callable too; it wins
    model: torch.nn.Module,
    *,
    backend: str | Backend = ...,
    fullgraph: bool = ...,
    dynamic: bool | None = ...,
    mode: str | None = ...,
    options: dict[str, Any] | None = ...,
) -> OptimizedModule: ...
@overload
def compile(
    model: F,
    *,
    backend: str | Backend = ...,
    fullgraph: bool = ...,
    dynamic: bool | None = ...,
    mode: str | None = ...,
    options: dict[str, Any] | None = ...,
) -> CompiledFunction: ...
@overload
def compile(
    model: None = ...,
    *,
    backend: str | Backend = ...,
    fullgraph: bool = ...,
    dynamic: bool | None = ...,
    mode: str | None = ...,
    options: dict[str, Any] | None = ...,
) -> Callable[[F], CompiledFunction]: ...


def compile(
    model: Any = None,
    *,
    backend: str | Backend = "inductor",
    fullgraph: bool = False,
    dynamic: bool | None = None,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Compile a function or ``nn.Module`` with ember.

    Each call of the result runs the original code with ember's frame hook
    enabled on the calling thread: frames are captured into graphs, handed to
    ``backend`` (a registered name, or any ``(gm, example_inputs) -> callable``
    as for ``torch.compile``), guarded, cached and reused. A frame ember cannot
    capture as one graph runs eagerly, its reason recorded in ``.stats``; with
    ``fullgraph=True`` that raises :class:`ember.compiler.FullGraphError` naming
    the file and line instead.

    The other arguments are ``torch.compile``'s: ``options`` (a dict) goes to a
    backend that takes an ``options`` argument, with ``mode`` added to it as
    ``options["mode"]``; ``dynamic`` is accepted, but shapes are always
    specialized today (a new shape compiles again; floats are graph inputs). The
    ``options`` keys ``repro_after``, ``repro_level``, ``repro_dir`` and ``replay_record``
    are ember's own failure-reproduction tools (:class:`ReproSettings`), not the backend's.

    >>> import torch, ember.compiler
    >>> def f(x, y):
    ...     return torch.sin(x) + y * 2
    >>> cf = ember.compiler.compile(f)
    >>> x, y = torch.randn(4), torch.randn(4)
    >>> torch.allclose(cf(x, y), f(x, y))
    True
    >>> cf.stats.graphs
    1
    """
    if model is None:
        return lambda m: compile(
            m, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode, options=options
        )
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(MODES)}")
    if not isinstance(fullgraph, bool):
        raise TypeError(f"fullgraph must be a bool, not {type(fullgraph).__name__}")
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be a bool or None, not {type(dynamic).__name__}")
    new_compiler = _compiler_maker(backend, mode, options, fullgraph, dynamic)
    if isinstance(model, torch.nn.Module):
        settings = CompileSettings(backend, fullgraph, dynamic, mode, dict(options or {}))
        return _compile_module(model, new_compiler, settings)
    if not callable(model):
        raise TypeError(f"compile() needs a function or nn.Module, not {type(model).__name__}")
    target = getattr(model, "__func__", model)
    entry = (target.__code__,) if isinstance(target, types.FunctionType) else ()
    label = getattr(model, "__qualname__", type(model).__name__)
    return CompiledFunction(model, reporting.watch(label, new_compiler.name, new_compiler(entry)))


# Modules that wrap the user's module as ``.module`` and call it from a forward that runs
# natively (DistributedDataParallel's breaks at record_function): the wrapped module's
# forward is an entry code too, so that an ``nn.Sequential`` wrapped directly is captured
# although the trace rules leave torch.nn's frames to CPython.
_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel"})


def _compile_module(
    model: torch.nn.Module, new_compiler: _Maker, settings: CompileSettings
) -> OptimizedModule:
    """``compile(model)`` for a module: its class's ``forward`` is the entry code (with the
    wrapped module's, for DDP), and the wrapper calls the module itself (its hooks
    included) with the frame hook on."""
    forwards = [type(model).forward]
    if type(model).__name__ in _WRAPPERS and isinstance(inner := model.module, torch.nn.Module):
        forwards.append(type(inner).forward)  # torch.nn's own forward counts as the user's
    entry = tuple(f.__code__ for f in forwards if isinstance(f, types.FunctionType))
    compiler = reporting.watch(type(model).__name__, new_compiler.name, new_compiler(entry))
    call = functools.partial(_eval_frame.call_with_callback, *_entry_args(compiler)[1:], model)
    return OptimizedModule(model, compiler, call, settings)


@dataclass(frozen=True)
class _Maker:
    """Makes the frame compiler of one compiled object for its entry codes."""

    name: str  # the backend's
    make: Callable[[tuple[types.CodeType, ...]], FrameCompiler]

    def __call__(self, entry: tuple[types.CodeType, ...]) -> FrameCompiler:
        return self.make(entry)


def _compiler_maker(
    backend: str | Backend,
    mode: str | None,
    options: dict[str, Any] | None,
    fullgraph: bool,
    dynamic: bool | None = None,
) -> _Maker:
    """The backend configured (options checked; the repro tools, timing and the compile
    report around it), as a function that makes the frame compiler for the entry codes."""
    repro = ReproSettings.from_env()
    if isinstance(options, dict):  # the repro keys are ember's, not the backend's
        repro, options = repro.with_options(options)
    made = _configured(backend, mode, options)
    fn = made.backend
    # the repro tools, the replay records and the profiler are imported only where they are
    # used: ``import ember.compiler`` (a pack's warm start) does not pay for them
    if repro.after is not None:
        from ember.compiler import repro as repro_hooks
        from ember.compiler.repro_script import compiler_ref

        fn = repro_hooks.instrument(fn, lambda: compiler_ref(backend, options), repro)
    # compile_times() and the report see it; graphs captured inside DDP's forward are split
    observer = reporting.observe(timed_backend(ddp.split_backend(fn)))
    # a profiler installs a frame compiler of its own (it compiles each code once); a
    # CompilationProfiler's module is imported if ``backend`` is one
    profiler = sys.modules.get("ember.compiler.profiler")
    make = FrameCompiler
    if profiler is not None and isinstance(backend, profiler.CompilationProfiler):
        make = backend.frame_compiler
    scope = functools.partial(config.patch, made.settings) if made.settings else None
    policy = Policy(dynamic if supports_dynamic(backend) else False, automatic_dynamic(backend))

    def new(entry: tuple[types.CodeType, ...]) -> FrameCompiler:
        compiler = make(
            observer, made.name, fullgraph=fullgraph, entry_codes=entry, scope=scope,
            dynamic=policy,
        )  # fmt: skip
        if repro.replay_record:
            from ember.compiler import replay_record

            replay_record.record_failures(compiler, backend, options, repro)
        return compiler

    return _Maker(made.name, new)
