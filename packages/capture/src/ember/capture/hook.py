"""The frame hook: intercept Python function calls and serve them from a cache.

This is the lowest layer of ember.capture, a typed wrapper over the C
extension ``_eval_frame`` (a PEP 523 eval-frame function). While a thread has
a *callback*, every fresh call of a plain Python function on that thread goes
through the hook:

1. Each code object carries a cache in its ``co_extra`` slot: an ordered list
   of :class:`CacheEntry` ``(check_fn, fn)``, most recently hit first.
2. The hook tries the entries in order with ``check_fn(*args)``. On the first
   true result it returns ``fn(*args)`` in place of running the frame. ``args``
   are *every argument slot* in ``co_varnames`` order: positional, keyword-only,
   then the ``*args`` tuple and the ``**kwargs`` dict (:func:`argument_names`).
3. On a miss it calls ``callback(frame)`` with the hook disabled on this
   thread. The callback returns a new :class:`CacheEntry` (stored, and it
   serves this very call), :attr:`Decision.RUN` (run the frame normally this
   time), :attr:`Decision.SKIP` (never intercept this code again) or
   :attr:`Decision.SKIP_FOR_CALLBACK` (never again while this callback runs;
   another callback still sees the code's frames).

>>> from ember.capture import hook
>>> def scale(x, factor=2):
...     return x * factor
>>> def check(x, factor):                 # same argument slots as scale
...     return isinstance(x, int)
>>> def fast_scale(x, factor):
...     return ("cached", x * factor)
>>> def on_miss(frame):
...     if frame.code is scale.__code__:
...         return hook.CacheEntry(check, fast_scale)
...     return hook.Decision.RUN
>>> with hook.intercepting(on_miss):
...     scale(3), scale(2.5), scale(4, factor=10)
(('cached', 6), ('cached', 5.0), ('cached', 40))

``scale(2.5)`` missed (the check wants an int), so the callback ran again and
its second entry served the call. The cache now has two entries:

>>> [e.fn.__name__ for e in hook.entries(scale.__code__)]
['fast_scale', 'fast_scale']
>>> hook.reset(); hook.entries(scale.__code__)
[]

Rules the hook follows (see docs/architecture.md):

- An entry whose ``fn`` is a Python function serves only frames of functions
  with the very same globals dict and closure cells as ``fn``: ``fn`` runs with
  its own globals and closure, so build it from the original function
  (:func:`function_like`).
- The entry's own ``fn`` frame is not intercepted; frames of the functions it
  calls are (that is how code after a graph break gets compiled).
- Generators, coroutines, class bodies, module code, frames resumed by
  ``throw()`` and ember's own code are never intercepted.
- The eval function is installed while at least one thread has a callback and
  restored when none has; it chains to the eval function installed before it.
- Run-only mode (:data:`RUN_ONLY`) serves hits and never calls a callback.
- Another frame evaluator's regions are left to it: a frame whose code is not its
  function's own (the other evaluator runs its compiled code in its place), everything
  that code calls, and, while another evaluator is in the chain, every frame with a
  frame of a :func:`foreign_compilers` package below it on the stack.

Entries must not hold strong references to their own code object or function
(use weak references): the cache lives inside the code object, so such a cycle
is invisible to the garbage collector and the code would never be freed.
"""

from __future__ import annotations

import contextvars
import enum
import functools
import os
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, Protocol, TypeAlias

from ember.capture import _eval_frame

__all__ = [
    "EVALUATOR_SETTER",
    "RUN_ONLY",
    "CacheEntry",
    "Callback",
    "Decision",
    "Frame",
    "HookState",
    "MadeFrame",
    "RunOnly",
    "add_entry",
    "argument_names",
    "bound_call",
    "clear",
    "entries",
    "foreign_compilers",
    "function_like",
    "get_callback",
    "intercepting",
    "is_skipped",
    "own",
    "remove_entry",
    "reset",
    "set_callback",
    "skip",
    "skip_files",
    "state",
]


class Frame(Protocol):
    """What the callback learns about the intercepted call (valid during the callback).

    >>> from ember.capture import hook
    >>> got = []
    >>> def on_miss(frame):
    ...     got.append((frame.code.co_name, frame.args, frame.function.__name__))
    ...     return hook.Decision.RUN
    >>> def add(a, *rest, k=1):
    ...     return a + sum(rest) + k
    >>> with hook.intercepting(on_miss):
    ...     add(1, 2, 3, k=4)
    10
    >>> got
    [('add', (1, 4, (2, 3)), 'add')]
    """

    @property
    def code(self) -> types.CodeType: ...
    @property
    def function(self) -> Any: ...  # a types.FunctionType
    @property
    def globals(self) -> dict[str, object]: ...
    @property
    def builtins(self) -> dict[str, object]: ...
    @property
    def args(self) -> tuple[object, ...]: ...


@dataclass(frozen=True, slots=True)
class MadeFrame:
    """A :class:`Frame` made by hand for a call that never runs through the hook: a replay
    record's call, an export's (``lead``: the bound ``self`` the caller did not pass).

    >>> def add(a, b):
    ...     return a + b
    >>> MadeFrame(add.__code__, add, add.__globals__, {}, (1, 2)).args
    (1, 2)
    """

    code: types.CodeType
    function: types.FunctionType
    globals: dict[str, Any]
    builtins: dict[str, Any]
    args: tuple[Any, ...]
    lead: tuple[Any, ...] = ()


class CacheEntry(NamedTuple):
    """One cached translation of a code object: ``check_fn(*args)`` guards ``fn(*args)``.

    >>> entry = CacheEntry(check_fn=lambda x: x > 0, fn=lambda x: -x)
    >>> entry.check_fn(3), entry.fn(3)
    (True, -3)
    """

    check_fn: Callable[..., object]
    fn: Callable[..., object]


class Decision(enum.Enum):
    """What a callback may return instead of a :class:`CacheEntry`.

    >>> Decision.RUN.value, Decision.SKIP.value, Decision.SKIP_FOR_CALLBACK.value
    ('run', 'skip', 'skip-for-callback')
    """

    RUN = "run"  # run this frame normally, ask again next time
    SKIP = "skip"  # run this frame normally and never intercept its code again
    # ... and never intercept it again while this callback runs (a decision that depends on
    # the callback, e.g. its backend failed: another callback must still get to decide)
    SKIP_FOR_CALLBACK = "skip-for-callback"


class RunOnly(enum.Enum):
    """The type of :data:`RUN_ONLY` (an enum so that it is a typed singleton).

    >>> RUN_ONLY is RunOnly.RUN_ONLY
    True
    """

    RUN_ONLY = "run-only"


RUN_ONLY: Final = RunOnly.RUN_ONLY
"""Pass to :func:`set_callback` to serve cache hits and never compile (frozen deployment)."""

Callback: TypeAlias = Callable[[Frame], CacheEntry | Decision]


@dataclass(frozen=True, slots=True)
class HookState:
    """Where the eval-frame function stands, for tests and diagnostics.

    >>> state().installed in ("top", "chained", "absent")
    True
    """

    installed: str  # "top": ours is the interpreter's; "chained": another hook calls ours
    active_threads: int  # threads with a callback (normal or run-only)
    live_caches: int  # code objects that carry an ember cache


class _Dispatch:
    """The callable the C hook holds: screens ember's own code, translates decisions.

    One per callback (:func:`_dispatch`): the C hook records a callback's own skips
    against this object, by weak reference."""

    __slots__ = ("__weakref__", "callback")

    def __init__(self, callback: Callback) -> None:
        self.callback = callback

    def __call__(self, frame: Frame) -> tuple[object, object] | bool | None:
        if frame.code.co_filename.startswith(_skipped_prefixes()) or _is_own(frame.code):
            return False
        decision = self.callback(frame)
        if decision is Decision.RUN:
            return None
        if decision is Decision.SKIP:
            return False
        if decision is Decision.SKIP_FOR_CALLBACK:
            return True
        if isinstance(decision, tuple) and len(decision) == 2:
            return decision  # the C side checks that both items are callable
        raise TypeError(
            f"ember frame callback {self.callback!r} returned {decision!r}; "
            "expected a CacheEntry or a Decision"
        )


# id(callback) -> its live _Dispatch: the same callback set twice at once (nested, on two
# threads, bound and intercepting) shares the skips it made. Weak values: a dispatch (and
# the skips recorded against it) lives while a thread or a bound call holds it.
_DISPATCHES: dict[int, weakref.ref[_Dispatch]] = {}


def _dispatch(callback: Callback) -> _Dispatch:
    ref = _DISPATCHES.get(id(callback))
    found = ref() if ref is not None else None
    if found is not None and found.callback is callback:
        return found
    made, key = _Dispatch(callback), id(callback)

    def forget(dead: weakref.ref[_Dispatch]) -> None:
        if _DISPATCHES.get(key) is dead:
            del _DISPATCHES[key]

    _DISPATCHES[key] = weakref.ref(made, forget)
    return made


def set_callback(callback: Callback | RunOnly | None) -> Callback | RunOnly | None:
    """Set this thread's callback and return the previous one.

    ``None`` disables the hook on this thread, :data:`RUN_ONLY` serves cache
    hits without compiling, and a callable compiles on misses. Other threads
    are not affected. Prefer the :func:`intercepting` context manager.

    >>> previous = set_callback(RUN_ONLY)
    >>> get_callback() is RUN_ONLY
    True
    >>> set_callback(previous) is RUN_ONLY
    True
    """
    return _from_raw(_eval_frame.set_callback(_to_raw(callback)))


def _to_raw(callback: Callback | RunOnly | None) -> object:
    if callback is None:
        return None
    if callback is RUN_ONLY:
        return False
    if callable(callback):
        return _dispatch(callback)
    raise TypeError(f"callback must be callable, RUN_ONLY or None, not {callback!r}")


def bound_call(
    callback: Callback | RunOnly,
    fn: Callable[..., Any],
    var: contextvars.ContextVar[Any] | None = None,
    value: object = None,
) -> functools.partial[Any]:
    """``fn`` wrapped so that each call runs with ``callback`` (and ``var`` set to ``value``).

    The same as ``with intercepting(callback): fn(...)``, in one C call: this is
    how ember's compiled callables keep their per-call cost low.

    >>> def double(x):
    ...     return 2 * x
    >>> seen = []
    >>> run = bound_call(lambda frame: (seen.append(frame.code.co_name), Decision.RUN)[1], double)
    >>> run(21), seen, get_callback() is None
    (42, ['double'], True)
    """
    return functools.partial(_eval_frame.call_with_callback, _to_raw(callback), var, value, fn)


def get_callback() -> Callback | RunOnly | None:
    """This thread's callback: a callable, :data:`RUN_ONLY`, or ``None``.

    >>> get_callback() is None
    True
    """
    return _from_raw(_eval_frame.get_callback())


def _from_raw(raw: object) -> Callback | RunOnly | None:
    if raw is None:
        return None
    if raw is False:
        return RUN_ONLY
    assert isinstance(raw, _Dispatch), raw
    return raw.callback


class intercepting:
    """Run the body with ``callback`` as this thread's callback; restore the previous after.

    Nests: an inner block replaces the callback and the outer one comes back
    when it exits, also when the body raises. (A class in ember's own file,
    not a ``contextlib`` generator, so that its ``__exit__`` is never intercepted.)

    >>> with intercepting(RUN_ONLY):
    ...     get_callback() is RUN_ONLY
    True
    >>> get_callback() is None
    True
    """

    __slots__ = ("_callback", "_previous")

    def __init__(self, callback: Callback | RunOnly) -> None:
        self._callback = callback
        # the outer blocks' callbacks as the C hook holds them: restoring the very object
        # keeps the skips recorded against it (SKIP_FOR_CALLBACK) while the body runs
        self._previous: list[object] = []

    def __enter__(self) -> None:
        self._previous.append(_eval_frame.set_callback(_to_raw(self._callback)))

    def __exit__(self, *exc: object) -> None:
        _eval_frame.set_callback(self._previous.pop())


def entries(code: types.CodeType) -> list[CacheEntry]:
    """A copy of the code's cache entries, most recently hit first.

    >>> def f(x): return x
    >>> entries(f.__code__)
    []
    """
    return [
        e if isinstance(e, CacheEntry) else CacheEntry(*e) for e in _eval_frame.get_entries(code)
    ]


def add_entry(code: types.CodeType, entry: CacheEntry) -> None:
    """Put ``entry`` at the front of the code's cache (e.g. to preload a deployment).

    >>> def f(x): return x
    >>> add_entry(f.__code__, CacheEntry(lambda x: True, lambda x: x + 1))
    >>> with intercepting(RUN_ONLY):
    ...     f(1)
    2
    >>> clear(f.__code__)
    """
    if not isinstance(entry, tuple) or len(entry) != 2:
        raise TypeError(f"entry must be a CacheEntry(check_fn, fn), not {entry!r}")
    _eval_frame.add_entry(code, entry if isinstance(entry, CacheEntry) else CacheEntry(*entry))


def remove_entry(code: types.CodeType, entry: CacheEntry) -> bool:
    """Drop ``entry`` (the very object added) from the code's cache; whether it was there.

    >>> def f(x): return x
    >>> e = CacheEntry(lambda x: True, lambda x: x)
    >>> add_entry(f.__code__, e)
    >>> stored = entries(f.__code__)[0]
    >>> remove_entry(f.__code__, stored), remove_entry(f.__code__, stored)
    (True, False)
    """
    return bool(_eval_frame.remove_entry(code, entry))


def clear(code: types.CodeType) -> None:
    """Forget the code's entries and its skip decisions (every callback's).

    >>> def f(x): return x
    >>> skip(f.__code__); clear(f.__code__); is_skipped(f.__code__)
    False
    """
    _eval_frame.clear_code(code)


def skip(code: types.CodeType, flag: bool = True) -> None:
    """Never intercept frames of ``code`` (``flag=False`` undoes it).

    >>> def f(x): return x
    >>> skip(f.__code__); is_skipped(f.__code__)
    True
    >>> skip(f.__code__, False); is_skipped(f.__code__)
    False
    """
    _eval_frame.set_skip(code, flag)


# id(code) -> a weak reference to it: the codes reset() keeps skipped. By identity: code
# objects compare by value, and an equal code made later must not share (and lose) a slot.
_OWN: dict[int, weakref.ref[types.CodeType]] = {}


def own(code: types.CodeType) -> None:
    """Mark ``code`` as ember's own (code it generated): never intercepted, also after
    :func:`reset` (which forgets other skip flags), so that a call in flight on another
    thread never has ember compile ember's code.

    >>> def prefix(x): return x
    >>> own(prefix.__code__); reset(); is_skipped(prefix.__code__)
    True
    """
    key = id(code)

    def forget(ref: weakref.ref[types.CodeType]) -> None:
        if _OWN.get(key) is ref:
            del _OWN[key]

    _OWN[key] = weakref.ref(code, forget)
    _eval_frame.set_skip(code, True)


def _is_own(code: types.CodeType) -> bool:
    ref = _OWN.get(id(code))
    return ref is not None and ref() is code


def is_skipped(code: types.CodeType, callback: Callback | None = None) -> bool:
    """Whether frames of ``code`` are never intercepted (by any callback), or, given
    ``callback``, never by that one (it returned :attr:`Decision.SKIP_FOR_CALLBACK`).

    A callback's own skips last while something holds it as a callback: a thread
    (in :func:`intercepting`) or a :func:`bound_call`.

    >>> def f(x): return x
    >>> def mine(frame): return Decision.SKIP_FOR_CALLBACK
    >>> with intercepting(mine):
    ...     f(1), is_skipped(f.__code__), is_skipped(f.__code__, mine)
    (1, False, True)
    """
    if callback is None:
        return bool(_eval_frame.is_skipped(code))
    ref = _DISPATCHES.get(id(callback))
    raw = ref() if ref is not None else None
    return raw is not None and raw.callback is callback and _eval_frame.is_skipped_by(code, raw)


def reset() -> None:
    """Forget every cache entry and skip decision (every callback's) of every code object.

    >>> reset(); state().live_caches >= 0
    True
    """
    _eval_frame.reset()
    for ref in list(_OWN.values()):
        if (code := ref()) is not None:
            _eval_frame.set_skip(code, True)


def state() -> HookState:
    """Whether the eval function is installed, how many threads use it, how many caches live.

    >>> with intercepting(RUN_ONLY):
    ...     state().installed, state().active_threads >= 1
    ('top', True)
    """
    return HookState(**_eval_frame.hook_state())


def argument_names(code: types.CodeType) -> tuple[str, ...]:
    """The argument slots the hook passes to ``check_fn`` and ``fn``, in order.

    >>> def f(a, b=1, *args, c, **kwargs): pass
    >>> argument_names(f.__code__)
    ('a', 'b', 'c', 'args', 'kwargs')
    """
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # CO_VARARGS, CO_VARKEYWORDS
    return code.co_varnames[:n]


def function_like(code: types.CodeType, original: types.FunctionType) -> types.FunctionType:
    """A function running ``code`` with ``original``'s globals, closure and defaults.

    ``code`` must name the same free variables, in the same order, as the
    original's code. Use it to build an entry's ``fn``:

    >>> def make():
    ...     k = 10
    ...     def f(x): return x + k
    ...     def g(x): return ("fast", x + k)
    ...     return f, g
    >>> f, g = make()
    >>> function_like(g.__code__, f)(1)
    ('fast', 11)
    """
    if code.co_freevars != original.__code__.co_freevars:
        raise ValueError(
            f"{code.co_name} has free variables {code.co_freevars}, "
            f"{original.__name__} has {original.__code__.co_freevars}"
        )
    fn = types.FunctionType(
        code, original.__globals__, code.co_name, original.__defaults__, original.__closure__
    )
    fn.__kwdefaults__ = original.__kwdefaults__
    fn.__qualname__ = original.__qualname__
    fn.__module__ = original.__module__
    return fn


# -- other frame evaluators ---------------------------------------------------------------

#: The name of the function a PEP 523 compiler calls to install its frame evaluator. A
#: Python module whose globals hold a builtin of that name installs one, and its package
#: is that compiler's: its compiler, the code it generates (bytecode, guards, dataclass
#: methods) and the frames its compiled code calls are its own, and ember compiling them
#: would compile the other compiler. Found by what they hold, not by name, so any such
#: compiler loaded in the process is stood aside for.
EVALUATOR_SETTER: Final[str] = "set_eval_frame"
_scanned: set[str] = set()
_foreign: tuple[str, ...] = ()


def foreign_compilers() -> tuple[str, ...]:
    """Packages of the other frame evaluators' compilers loaded so far. While one of their
    frames is on a thread's stack and their evaluator is chained with ember's, ember
    passes every frame through (the C hook reads this list; misses refresh it).

    >>> import types, sys
    >>> m = types.ModuleType("otherjit.evaluator"); m.__file__ = "otherjit/evaluator.py"
    >>> m.set_eval_frame = len  # any builtin of that name
    >>> sys.modules[m.__name__] = m; _invalidate()
    >>> "otherjit" in (_skipped_prefixes() and foreign_compilers())
    True
    >>> del sys.modules[m.__name__]
    """
    return _foreign


def _scan_for_evaluators() -> None:
    """Look at modules loaded since the last scan for one that installs a frame evaluator."""
    global _foreign
    found = list(_foreign)
    for name, module in sys.modules.copy().items():
        if name in _scanned:
            continue
        _scanned.add(name)
        if not str(getattr(module, "__file__", "") or "").endswith(".py"):
            continue  # a C extension defines the setter; a Python module uses it
        setter = getattr(module, "__dict__", {}).get(EVALUATOR_SETTER)
        package = name.rpartition(".")[0]
        if isinstance(setter, types.BuiltinFunctionType) and package and package not in found:
            found.append(package)
    if len(found) != len(_foreign):
        _foreign = tuple(found)
        _eval_frame.set_foreign_modules(_foreign)


_scan_for_evaluators()

# -- code that is never intercepted ------------------------------------------------------------

_extra_prefixes: tuple[str, ...] = ()
# File names of the code ember generates at run time (replacements, guard checks, the
# inductor's wrappers): ember's own code too, though it lives in no ember directory.
# autograd calls a compiled backward natively, inside a compiled call's region.
_GENERATED = ("<ember replacement of ", "<ember guards for ", "<ember.inductor ")
_prefix_cache: tuple[int, tuple[str, ...]] = (-1, ())


def skip_files(*prefixes: str) -> None:
    """Never intercept code whose file name starts with one of ``prefixes``.

    ember's own packages are always skipped; this adds more (a library you
    never want traced, say).

    >>> skip_files("/opt/vendored/")
    >>> "/opt/vendored/" in _skipped_prefixes()
    True
    """
    global _extra_prefixes
    _extra_prefixes = tuple(dict.fromkeys(_extra_prefixes + prefixes))
    _invalidate()


def _invalidate() -> None:
    global _prefix_cache
    _prefix_cache = (-1, ())


def _skipped_prefixes() -> tuple[str, ...]:
    """Directories of every imported ember distribution, plus :func:`skip_files` prefixes."""
    global _prefix_cache
    count = len(sys.modules)
    if _prefix_cache[0] != count:
        dirs = {
            os.path.dirname(path) + os.sep
            # copy(), as inspect.getmodule does: iterating the live dict raises when a
            # collection run inside the loop lets another thread import meanwhile
            for name, mod in sys.modules.copy().items()
            if name.startswith("ember.") and name.count(".") == 1
            for path in [getattr(mod, "__file__", None)]
            if path
        }
        _prefix_cache = (count, tuple(sorted(dirs)) + _GENERATED + _extra_prefixes)
        _scan_for_evaluators()  # new modules: maybe another compiler
    return _prefix_cache[1]
