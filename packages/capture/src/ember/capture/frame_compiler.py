"""The hook's callback: decide, for each intercepted frame, whether and how to compile it.

A :class:`FrameCompiler` is what ``ember.compiler.compile`` installs for the
duration of a compiled call. On a cache miss it:

1. skips code whose module the trace rules say CPython runs (:mod:`ember.capture.trace_rules`:
   torch's and the standard library's own code, ember's), unless it is the code the user
   asked to compile;
2. asks the code's :class:`ember.guards.CodeCache` whether to recompile (and
   records why) or to run eagerly (cache limit reached);
3. translates the frame into a graph (:func:`ember.capture.translate.translate`);
4. hands the graph to the backend, generates the replacement function, and
   compiles the guards into the check that protects it.

A frame that cannot be captured runs eagerly with its reason recorded in
:attr:`FrameCompiler.stats`; with ``fullgraph=True`` it raises
:class:`FullGraphError` naming the user's file and line instead.

Which skip decisions are whose: a trace rule's (CPython runs this module) holds for every
compiled callable, so it is the hook's global skip flag. A failure's (translation or the
backend failed, and the callable has no entry for the code) belongs to the callable that
met it (:attr:`hook.Decision.SKIP_FOR_CALLBACK`): another callable, with another backend,
options or ``fullgraph=True``, still tries the frame, records its own reason, or raises.
"""

from __future__ import annotations

import contextlib
import dis
import inspect
import sys
import threading
import time
import traceback
import types
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ember.capture import (
    breaks,
    bytecode_311,
    gcpause,
    hook,
    log,
    markers,
    prebuilt,
    settings,
    shapes,
    stance,
    trace_rules,
)
from ember.capture.hook import CacheEntry, Decision, Frame
from ember.capture.shapes import MarkedDynamicError
from ember.guards import CodeCache, CompiledGuards, FrameSpec, GuardSet, WeakIdentity
from ember.guards import Decision as CacheDecision

if TYPE_CHECKING:
    from ember.capture import codegen
    from ember.capture.tracer import Location, Unsupported
    from ember.capture.translate import Translation

# The translator (and through it sympy) is imported by the first frame that translates, not
# here: a process served by a loaded pack (:mod:`ember.capture.prebuilt`) never needs it.

Backend = Callable[[torch.fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]


class FullGraphError(RuntimeError):
    """``fullgraph=True`` and a frame could not be captured as one graph."""


class InternalError(RuntimeError):
    """An error inside ember or a backend while compiling a frame, raised (naming the
    user's frame) because the ``suppress_errors`` setting is False; the original error is
    its ``__cause__``.

    >>> import torch
    >>> from ember.capture import hook, settings
    >>> def refuses(gm, inputs):
    ...     raise ValueError("no")
    >>> def f(x):
    ...     return x.cos()
    >>> compiler = FrameCompiler(refuses, "refuses", entry_codes=(f.__code__,))
    >>> with settings.section.patch(suppress_errors=False), hook.intercepting(compiler):
    ...     f(torch.ones(1))
    Traceback (most recent call last):
    ember.capture.frame_compiler.InternalError: backend ... failed: ValueError: no
    ...
    """


class FallbackWarning(UserWarning):
    """A frame ran eagerly (warned only under the ``verbose`` setting): reason and place.

    >>> import warnings, torch
    >>> from ember.capture import hook, settings
    >>> def refuses(gm, inputs):
    ...     raise ValueError("no")
    >>> def g(x):
    ...     return x.cos()
    >>> compiler = FrameCompiler(refuses, "refuses", entry_codes=(g.__code__,))
    >>> with settings.section.patch(verbose=True), warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     with hook.intercepting(compiler):
    ...         _ = g(torch.ones(1))
    >>> w[0].category.__name__, "runs eagerly" in str(w[0].message)
    ('FallbackWarning', True)
    """


@dataclass(frozen=True, slots=True)
class Failure:
    """Where and why translation stopped: a graph break, or a frame that ran eagerly."""

    code: str  # "qualname (file:line)" of the frame's code
    reason: str
    category: str
    location: str  # the user's file:line and source text where translation stopped
    hint: str = ""  # one line on how to avoid it
    where: Location | None = None  # the same place, as fields


@dataclass(frozen=True, slots=True)
class Compiled:
    """One successful translation, as the stats keep it."""

    code: str
    graph: torch.fx.GraphModule = field(repr=False)
    ops: int
    guards: GuardSet = field(repr=False)
    seconds: float
    replacement_source: str = field(repr=False)


@dataclass
class Stats:
    """What one compiled callable did: graphs made, frames that ran eagerly, and why."""

    compiled: list[Compiled] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    breaks: list[Failure] = field(default_factory=list)  # graph breaks, with their reasons
    skipped: list[str] = field(default_factory=list)  # frames with no tensor operations
    prebuilt: list[str] = field(default_factory=list)  # entries a pack gave (not compiled)

    @property
    def graphs(self) -> int:
        return len(self.compiled)


# The attribute of a replacement function that holds its captured graph (for packs).
GRAPH_ATTRIBUTE = "__ember_graph__"

_caches: weakref.WeakKeyDictionary[types.CodeType, CodeCache[Any]] = weakref.WeakKeyDictionary()


def code_cache(code: types.CodeType) -> CodeCache[Any]:
    """The cache policy object of ``code`` (created on first use)."""
    cache = _caches.get(code)
    if cache is None:
        cache = _caches[code] = CodeCache(code)
    return cache


class FrameCompiler:
    """The callback of one compiled callable: translates frames for ``backend``."""

    def __init__(
        self,
        backend: Backend,
        backend_name: str,
        *,
        fullgraph: bool = False,
        entry_codes: tuple[types.CodeType, ...] = (),
        track: bool = False,
        scope: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        dynamic: bool | shapes.Policy | None = False,
    ) -> None:
        self.backend = backend
        self.dynamic = dynamic  # the symbolic-size policy (ember.capture.shapes.Policy)
        # the settings this callable's compiles run under (compile(options=...)'s overrides)
        self.scope = scope or contextlib.nullcontext
        self.backend_name = backend_name
        # What the entries' backend guard compares (the compiled call sets the backend
        # variable to it): a fullgraph callable never serves a frame from an entry that a
        # lenient callable of the same backend made with a graph break in it.
        self.guard_key = f"{backend_name} fullgraph=True" if fullgraph else backend_name
        self.fullgraph = fullgraph
        self.entry_codes = entry_codes
        self.stats = Stats()
        self.track = track
        # (code, hook entry, cache entry) of every entry made, when tracking (explain)
        self.made: list[tuple[types.CodeType, CacheEntry, Any]] = []
        # codes this callable made an entry for: a failure there runs one call eagerly,
        # elsewhere it skips the code for this callable
        self._has_entries: weakref.WeakSet[types.CodeType] = weakref.WeakSet()
        self._told_full: weakref.WeakSet[types.CodeType] = weakref.WeakSet()  # in stats once
        # code -> calls run eagerly because they filled in state (FIRST_CALL), up to a limit
        self._first_calls: weakref.WeakKeyDictionary[types.CodeType, int] = (
            weakref.WeakKeyDictionary()
        )
        # code -> the reset() generation in which this callable skipped it: written under
        # the compile lock, so a thread that waited for it sees the skip the hook records
        # only once the failing thread's callback has returned
        self._skipped: weakref.WeakKeyDictionary[types.CodeType, int] = weakref.WeakKeyDictionary()
        for code in entry_codes:  # this callable compiles them whatever the trace rules say
            _ENTRY_CODES[code] = _ENTRY_CODES.get(code, 0) + 1
            if code in _RULE_SKIPPED and not markers.is_disabled_code(code):
                _RULE_SKIPPED.discard(code)  # another callable's trace-rule skip: lift it
                hook.skip(code, False)
        if entry_codes:
            weakref.finalize(self, _release, entry_codes)
        # called with (frame, failure) when a frame fails to compile: compiler-api's replay record
        self.on_failure: Callable[[Frame, Failure], None] | None = None

    def __call__(self, frame: Frame) -> CacheEntry | Decision:
        code = frame.code
        if code not in self.entry_codes and not trace_rules.compiles_frames(frame.globals):
            return _rule_skip(code)  # the trace rules say CPython runs this module's frames
        if log.debug_function_skips(code.co_name):  # EMBER_DEBUG_FUNCTION names another
            log.LOG.debug("not compiling %s: the debug function is another", code.co_name)
            return Decision.RUN  # asked again next call: the setting may change
        # Another thread may be compiling this very frame: wait for it. Its entry reaches
        # the hook's list only after its callback returns, so look (in the policy's list,
        # written under the lock) even without waiting.
        _COMPILE_LOCK.acquire()
        try:
            with self.scope():  # this callable's settings hold for the whole decision
                return self._decide(frame)
        finally:
            _COMPILE_LOCK.release()

    def _decide(self, frame: Frame) -> CacheEntry | Decision:
        """Serve, skip, follow the stance, or compile (with the compile lock held)."""
        try:
            if _served_now(frame):
                return Decision.RUN  # another thread's entry serves it: the next call hits
            if self._skipped.get(frame.code) == _generation:
                return Decision.SKIP_FOR_CALLBACK  # another thread failed it meanwhile
            if (eager := _STANCE_RULES[stance.current()](frame)) is not None:
                return eager
            # the heap from before the compile frozen: collections scan only what it makes
            with log.compiling(code_cache(frame.code).name), gcpause.frozen_heap():
                return self._on_miss(frame)
        except (FullGraphError, InternalError, stance.RecompileError, MarkedDynamicError):
            raise
        except Exception as bug:  # a bug in ember (guards, codegen) never reaches the user
            return self._failed(frame, code_cache(frame.code), _internal(bug))

    def _on_miss(self, frame: Frame) -> CacheEntry | Decision:
        """Compile the frame, or decide how it runs eagerly (with the compile lock held)."""
        cache = code_cache(frame.code)
        for checked, fn in prebuilt.ready(frame, self.build_graph):  # a pack: no translation
            self.stats.prebuilt.append(cache.name)
            return self._install(frame, cache, checked, fn)
        from ember.capture.tracer import FIRST_CALL, Unsupported
        from ember.capture.translate import translate

        if cache.on_miss(*frame.args) is CacheDecision.RUN_EAGER:
            return self._cache_full(frame, cache)
        try:
            translation = translate(
                frame, self.backend_name, guard_key=self.guard_key, dynamic=self.dynamic
            )
        except Unsupported as e:
            if e.category == FIRST_CALL and self._first_calls.get(frame.code, 0) < FIRST_CALLS:
                self._first_calls[frame.code] = self._first_calls.get(frame.code, 0) + 1
                return self._first_call(cache, e)  # state this call fills in: native, then again
            if self.fullgraph or e.top_index is None:
                return self._failed(frame, cache, e)
            try:
                return self._break(frame, cache, e, e.top_index)
            except (breaks.CannotBreak, Unsupported) as why:
                return self._failed(frame, cache, e, why=str(why).splitlines()[0])
            except MarkedDynamicError:
                raise
            except Exception as bug:  # a bug in ember must never reach the user's code
                return self._failed(frame, cache, _internal(bug))
        except MarkedDynamicError:
            raise  # the user's mark and the user's code disagree: theirs to settle
        except Exception as bug:
            return self._failed(frame, cache, _internal(bug))
        if translation.ops == 0 and not translation.effects:
            # Nothing for a backend to do: the frame runs as it is while its guards hold;
            # a call that breaks them (tensors where there were none) compiles again.
            self.stats.skipped.append(cache.name)
            return self._native(frame, cache, translation)
        try:
            compiled = self.backend(translation.graph_module, translation.example_inputs)
        except Exception as error:  # the backend refused the graph: the frame runs eagerly
            return self._failed(frame, cache, _backend_failed(self.backend_name, error))
        return self._compile(frame, cache, translation, compiled)

    def _failed(
        self, frame: Frame, cache: CodeCache[Any], e: Unsupported, why: str = ""
    ) -> Decision:
        code = frame.code  # where translation stopped, else the frame's own def line
        location = (
            str(e.location)
            if e.location is not None
            else f'File "{code.co_filename}", line {code.co_firstlineno}, in {code.co_name}'
        )
        reason = f"{e.reason} (and no graph break there: {why})" if why else e.reason
        failure = Failure(cache.name, reason, e.category, location, e.hint, e.location)
        self.stats.failures.append(failure)
        if self.on_failure is not None:
            self.on_failure(frame, failure)
        log.LOG.info("%s runs eagerly: %s\n%s", cache.name, reason, location)
        _report(failure, e)  # raises under suppress_errors=False, warns under verbose
        if self.fullgraph:
            hint = f"\nhint: {e.hint}" if e.hint else ""
            raise FullGraphError(
                f"ember could not capture {cache.name} as one graph: {e.reason}\n{location}{hint}"
            ) from None
        # Nothing cached yet by this callable: this code runs eagerly from now on, for it
        # (others still try it). Otherwise keep the entries it has and run just this call
        # eagerly.
        if frame.code in self._has_entries:
            return Decision.RUN
        self._skipped[frame.code] = _generation
        return Decision.SKIP_FOR_CALLBACK

    def _first_call(self, cache: CodeCache[Any], e: Unsupported) -> Decision:
        """The call fills in state the code reads (an optimizer's lazy state, on its first
        step): it runs natively, nothing is cached, and the next call compiles again (under
        fullgraph too: no part of the call was captured, and the next one is one graph).
        A code that keeps doing so (a new key on every call) fails as any other, after
        :data:`FIRST_CALLS` such calls."""
        where = str(e.location) if e.location is not None else cache.name
        reason = f"{e.reason} (this call runs eagerly; the next call is compiled again)"
        self.stats.failures.append(
            Failure(cache.name, reason, e.category, where, e.hint, e.location)
        )
        log.LOG.info("%s runs eagerly once: %s", cache.name, e.reason)
        return Decision.RUN

    def _cache_full(self, frame: Frame, cache: CodeCache[Any]) -> Decision:
        """The code's cache is full (every callable's entries count): this call runs
        eagerly. The reason goes to this callable's stats once per code; under fullgraph
        it is an error, as the frame is not captured."""
        from ember.capture.tracer import Unsupported

        if frame.code not in self._told_full or self.fullgraph:
            self._told_full.add(frame.code)
            e = Unsupported(
                f"cache_size_limit ({cache.limit}) reached for this code",
                "cache_limit",
                "each new input shape, type or constant compiles again (until the limit,"
                " then the frame runs eagerly): keep them stable",
            )
            self._failed(frame, cache, e)  # raises FullGraphError under fullgraph
        return Decision.RUN

    def _break(self, frame: Frame, cache: CodeCache[Any], e: Unsupported, index: int) -> CacheEntry:
        """Capture the frame up to instruction ``index``; run it natively; resume after it."""
        from ember.capture.translate import translate

        code = frame.code
        span = breaks.find_span(code, index)
        t = translate(
            frame, self.backend_name, stop_at=span.start, guard_key=self.guard_key,
            dynamic=self.dynamic,
        )  # fmt: skip
        assert t.layout is not None
        instrs, _ = bytecode_311.decode(code)
        after = breaks.slots_after(instrs, span, t.layout)
        if span.block_exit is not None and not _grad_block(t, span.block_exit):
            raise breaks.CannotBreak("the break is inside a with block of a context manager")
        prefix = self._prefix(frame, t)
        hook.own(prefix.__code__)  # the prefix is ember's: never intercepted
        resumes = tuple(
            hook.function_like(
                breaks.resume_code(code, target, after, t.layout.live, t.layout.cells),
                frame.function,
            )
            for target in breaks.resume_targets(code, span)
        )
        new_code = breaks.replacement_code(code, span, t.layout, prefix, resumes)
        fn = types.FunctionType(new_code, frame.function.__globals__, code.co_name, None,
                                frame.function.__closure__)  # fmt: skip
        location = str(e.location) if e.location is not None else "?"
        self.stats.breaks.append(
            Failure(cache.name, e.reason, e.category, location, e.hint, e.location)
        )
        log.artifact("graph_breaks", lambda: f"graph break in {cache.name}: {e.reason}\n{location}")
        return self._entry(frame, cache, t, fn, f"graph break at {location.splitlines()[0]}")

    def _prefix(self, frame: Frame, t: Translation) -> types.FunctionType:
        compiled = self.backend(t.graph_module, t.example_inputs) if t.ops else t.graph_module
        fn = _replacement(frame, t, compiled).fn
        fn.__dict__[GRAPH_ATTRIBUTE] = t.graph_module  # what a pack saves
        return fn

    def _compile(
        self, frame: Frame, cache: CodeCache[Any], t: Translation, compiled: Any
    ) -> CacheEntry:
        replacement = _replacement(frame, t, compiled)
        replacement.fn.__dict__[GRAPH_ATTRIBUTE] = t.graph_module  # what a pack saves
        return self._entry(frame, cache, t, replacement.fn, replacement.source)

    def build_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        """Run this callable's backend on a graph that a pack gave (on the graph's first
        call), under this callable's settings."""
        with self.scope():
            return self.backend(gm, example_inputs)

    def _native(self, frame: Frame, cache: CodeCache[Any], t: Translation) -> CacheEntry:
        """An entry that runs the frame's own code, natively, under the translation's guards."""
        return self._guarded(frame, cache, t, _native_function(frame.code, frame.function))[1]

    def _guarded(
        self, frame: Frame, cache: CodeCache[Any], t: Translation, fn: Any
    ) -> tuple[GuardSet, CacheEntry]:
        """``fn`` behind the translation's guards, in the code's cache."""
        t.seal()  # the shape guards, with those the backend's trace added
        guards = GuardSet(t.guards.guards)
        checked = guards.compile(FrameSpec.from_function(frame.function))
        return guards, self._install(frame, cache, checked, fn)

    def _install(
        self, frame: Frame, cache: CodeCache[Any], checked: CompiledGuards, fn: Any
    ) -> CacheEntry:
        """``fn`` behind ``checked`` in the code's cache (a translation's or a pack's)."""
        guards = checked.guards
        cache_entry = cache.add(checked, fn)
        entry = CacheEntry(checked.check, fn)
        self._has_entries.add(frame.code)
        if self.track:
            self.made.append((frame.code, entry, cache_entry))
        # A closure's entry serves only that closure's cells (its fn runs with them): it
        # goes when the closure does, with the objects its cells hold.
        closure = (frame.function,) if frame.code.co_freevars else ()
        _drop_when_freed(frame.code, cache, cache_entry, entry, guards, closure)
        return entry

    def _entry(
        self, frame: Frame, cache: CodeCache[Any], t: Translation, fn: Any, described: str
    ) -> CacheEntry:
        """Guard ``fn`` with the translation's guards, cache it, record it in the stats."""
        start = time.perf_counter()
        guards, entry = self._guarded(frame, cache, t, fn)
        seconds = t.seconds + time.perf_counter() - start
        self.stats.compiled.append(
            Compiled(cache.name, t.graph_module, t.ops, guards, seconds, described)
        )
        _log_entry(frame.code, cache.name, t, fn, seconds)
        return entry


def _log_entry(code: types.CodeType, name: str, t: Translation, fn: Any, seconds: float) -> None:
    """The graph_code, bytecode and perf artifacts of one entry (each built only when on)."""
    log.LOG.info("compiled %s: %d ops, %d guards", name, t.ops, len(t.guards.guards))
    gm = t.graph_module
    log.artifact("graph_code", lambda: f"graph of {name}:\n{gm.print_readable(False)}")
    new = getattr(fn, "__code__", None)
    log.artifact("bytecode", lambda: f"bytecode of {name}, original:\n{_dis(code)}\n"
                 f"transformed ({getattr(new, 'co_name', '?')}):\n{_dis(new)}")  # fmt: skip
    log.artifact("perf", lambda: f"{name}: {t.ops} ops, captured and guarded in {seconds:.3f} s")


def _dis(code: types.CodeType | None) -> str:
    return "(none)" if code is None else dis.Bytecode(code).dis()


# Entry codes of live callables (with how many name each) and the codes skipped by a trace
# rule for every callable: a callable compiles its entry code even when the trace rules
# skip its module, so another callable's rule skip of it is its own, not global.
_ENTRY_CODES: weakref.WeakKeyDictionary[types.CodeType, int] = weakref.WeakKeyDictionary()
_RULE_SKIPPED: weakref.WeakSet[types.CodeType] = weakref.WeakSet()
_generation = 0  # reset() count: skips recorded before the last reset() are forgotten


def _rule_skip(code: types.CodeType) -> Decision:
    """Skip a code the trace rules leave to CPython: for every callable, unless it is a
    live callable's entry code."""
    if code in _ENTRY_CODES:
        return Decision.SKIP_FOR_CALLBACK
    _RULE_SKIPPED.add(code)
    return Decision.SKIP


def _release(codes: tuple[types.CodeType, ...]) -> None:
    for code in codes:
        left = _ENTRY_CODES.get(code, 0) - 1
        if left > 0:
            _ENTRY_CODES[code] = left
        else:
            _ENTRY_CODES.pop(code, None)


# One compile at a time in the process: translation and the backends use torch state
# that is global (fx's tracing patcher, fake-tensor and dispatch modes), and two threads
# that miss on the same frame must compile it once, not once each up to the cache limit.
# Reentrant: a backend may call a compiled function on the thread that compiles.
_COMPILE_LOCK = threading.RLock()
FIRST_CALLS = 2  # calls of one code run eagerly to fill in state, before it fails for good


def _served_now(frame: Frame) -> bool:
    """Whether an entry made meanwhile by another thread serves the frame: the same test
    the C hook makes (entry_fits_function, then the check)."""
    fn = frame.function
    cache = _caches.get(frame.code)
    for check, entry_fn in cache.hook_entries if cache is not None else ():
        if isinstance(entry_fn, types.FunctionType) and (
            entry_fn.__globals__ is not fn.__globals__
            or not _same_cells(entry_fn.__closure__, fn.__closure__)
        ):
            continue
        try:
            if check(*frame.args):
                return True
        except Exception:  # a check that raises is a miss, as in the hook
            return False
    return False


def _same_cells(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _replacement(frame: Frame, t: Translation, compiled: Any) -> codegen.Replacement:
    """The generated function that runs ``compiled`` in place of the frame (or its prefix)."""
    from ember.capture import codegen

    return codegen.generate(
        frame.code,
        frame.function,
        compiled,
        t.input_sources,
        t.output,
        t.effects,
        restore_grad_mode=codegen.switches_grad_mode(t.graph_module.graph),
    )


def _native_function(code: types.CodeType, original: types.FunctionType) -> types.FunctionType:
    """``original``'s code as a function that takes every argument slot positionally (the
    hook's calling convention: ``*args`` as a tuple, ``**kwargs`` as a dict), built on a
    copy of the code: an entry must not hold its own code object (the cache lives in it,
    a cycle the collector cannot see)."""
    slots = len(hook.argument_names(code))
    copy = code.replace(
        co_argcount=slots,
        co_kwonlyargcount=0,
        co_flags=code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS),
    )
    fn = types.FunctionType(copy, original.__globals__, code.co_name, None, original.__closure__)
    fn.__qualname__ = original.__qualname__
    return fn


def _grad_block(t: Translation, block_exit: int) -> bool:
    """Whether the with block around the break is a grad-mode one ember rebuilds."""
    from ember.capture import codegen

    assert t.layout is not None
    if t.layout.stack[block_exit] == breaks.NULL_SLOT:
        return False
    index = sum(slot != breaks.NULL_SLOT for slot in t.layout.stack[:block_exit])
    kind, payload = t.output[1][index]
    return kind == "new" and payload[0] in (codegen.GradModeExit, codegen.ModeReentry)


# Entries whose identity guards name objects that may be freed (a model, a user object):
# the weak references below drop the entry from both caches when any of them dies, so a
# script that builds a new model per run neither leaks entries nor fills the cache.
_watchers: dict[int, list[weakref.ref[Any]]] = {}


def _drop_when_freed(
    code: types.CodeType,
    cache: CodeCache[Any],
    cache_entry: Any,
    entry: CacheEntry,
    guards: GuardSet,
    also: tuple[Any, ...] = (),
) -> None:
    watched = [
        obj
        for g in guards.guards
        if isinstance(g.expected, WeakIdentity)
        and (obj := g.expected.get()) is not None
        and not isinstance(obj, type | types.ModuleType | types.BuiltinFunctionType)
    ] + list(also)
    if not watched:
        return
    key = id(entry)
    code_ref, cache_ref = weakref.ref(code), weakref.ref(cache)
    # Bound now: at interpreter exit the objects die after module globals are cleared, and
    # then there is nothing left to keep consistent.
    watchers, remove_entry, finalizing = _watchers, hook.remove_entry, sys.is_finalizing

    def freed(_: weakref.ref[Any]) -> None:
        if finalizing() or watchers.pop(key, None) is None:
            return
        live_code, live_cache = code_ref(), cache_ref()
        if live_code is not None:
            remove_entry(live_code, entry)
        if live_cache is not None:
            live_cache.remove(cache_entry)

    _watchers[key] = [weakref.ref(obj, freed) for obj in watched]


def _backend_failed(backend: str, error: Exception) -> Unsupported:
    """A backend that raised while compiling a graph, turned into a reason to run eagerly."""
    from ember.capture.tracer import Unsupported

    e = Unsupported(f"backend {backend!r} failed: {type(error).__name__}: {error}", "backend")
    others = ", ".join(b for b in ("eager", "aot_eager") if b != backend)
    e.hint = f"the frame ran eagerly; another backend ({others}) may take this graph"
    e.__cause__ = error  # what suppress_errors=False raises from, and verbose prints
    return e


def _internal(bug: Exception) -> Unsupported:
    """An unexpected error in ember itself, turned into a reason to run the frame eagerly."""
    from ember.capture.tracer import Unsupported

    e = Unsupported(f"internal error in ember: {type(bug).__name__}: {bug}", "internal")
    e.hint = "please report it; the frame ran eagerly, so results are unaffected"
    e.__cause__ = bug
    return e


# Failures that are errors (of ember or the backend), not limits of capture: what the
# suppress_errors setting turns into exceptions.
_ERRORS = frozenset({"internal", "backend"})


def _report(failure: Failure, e: Unsupported) -> None:
    """Raise an error failure under ``suppress_errors=False``; warn under ``verbose``."""
    now = settings.section.get()
    cause = e.__cause__
    if not now.suppress_errors and failure.category in _ERRORS:
        raise InternalError(
            f"{failure.reason}\nwhile compiling {failure.code}\n{failure.location}\n"
            "(suppress_errors=False; set it True to run such frames eagerly instead)"
        ) from cause
    if now.verbose:
        trace = "".join(traceback.format_exception(cause)) if cause is not None else ""
        warnings.warn(
            f"ember: {failure.code} runs eagerly: {failure.reason}\n{failure.location}\n{trace}",
            FallbackWarning,
            stacklevel=2,
        )


def _fail_on_recompile(frame: Frame) -> Decision | None:
    """The ``fail_on_recompile`` stance: a miss that would compile is an error."""
    cache = code_cache(frame.code)
    why = "; ".join(entry.guards.explain_failure(*frame.args) or "?" for entry in cache.entries)
    raise stance.RecompileError(
        f"{cache.name} would be compiled under the stance 'fail_on_recompile'"
        + (f": its guards failed: {why}" if why else ": it has no compiled entry yet")
    )


# What each stance does on a cache miss (before any compile): a Decision, or None to
# compile as usual. force_eager's calls never reach here (the C hook is off for them),
# except those in flight when the stance changed.
_STANCE_RULES: dict[str, Callable[[Frame], Decision | None]] = {
    "default": lambda frame: None,
    "force_eager": lambda frame: Decision.RUN,
    "eager_on_recompile": lambda frame: Decision.RUN,
    "fail_on_recompile": _fail_on_recompile,
    "eager_then_compile": lambda frame: Decision.RUN if stance.first_call(frame.code) else None,
}


def reset() -> None:
    """Forget every cache entry, skip decision and recompilation record."""
    from ember import guards

    global _generation

    with _COMPILE_LOCK:  # never between a compile's cache lookups and its cache writes
        hook.reset()
        guards.reset()
        breaks.clear_cache()
        _caches.clear()
        _watchers.clear()
        _RULE_SKIPPED.clear()
        shapes.forget()  # automatic dynamic starts again
        prebuilt.clear()  # a loaded pack's entries not installed yet
        stance.reset()
        _generation += 1
