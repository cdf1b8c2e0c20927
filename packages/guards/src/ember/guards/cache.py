"""Cache policy: which translations a code object keeps, and when to give up.

A :class:`CodeCache` holds, for one code object, an ordered list of entries
(compiled guards, translation), newest first. ``ember.capture`` keeps
:attr:`CodeCache.hook_entries` (the same entries as ``(check, translation)``
pairs, updated in place) in the code object's ``co_extra`` slot; on a miss
it asks :meth:`CodeCache.on_miss` whether to compile again. Every
recompilation records a :class:`RecompileReason`; once ``cache_size_limit``
translations exist, the next miss warns once and the code runs eagerly from
then on. :func:`reset` forgets everything.

>>> import warnings
>>> from ember.guards import FrameSpec, GuardSet, Local, equals
>>> frame = FrameSpec("step", ("n",), {}, {})
>>> cache = CodeCache("step", cache_size_limit=2)
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     for n in (1, 2, 3):
...         if cache.lookup(n) is None and cache.on_miss(n) is Decision.RECOMPILE:
...             _ = cache.add(GuardSet([equals(Local("n"), n)]).compile(frame), f"graph {n}")
>>> print(caught[0].message)
step: cache_size_limit (2) reached; running eagerly from now on. \
Last miss: n: expected 2, got 3; n: expected 1, got 3
>>> print(cache.reasons[0])
step: n: expected 1, got 2
>>> cache.lookup(2), cache.eager
('graph 2', True)
"""

from __future__ import annotations

import enum
import itertools
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Generic, TypeVar

from ember.guards import log, settings
from ember.guards.guardset import CompiledGuards

__all__ = [
    "CacheEntry",
    "CacheLimitWarning",
    "CodeCache",
    "Decision",
    "RecompileReason",
    "all_caches",
    "recompile_reasons",
    "reset",
]

T = TypeVar("T")

# The limits are settings (ember.guards.settings: cache_size_limit, and
# accumulated_cache_size_limit, the translations made per code object over its life:
# entries dropped when what they guard dies make room for new ones, but a code that makes
# a new closure on every call would then compile on every call), read at each miss.

_REGISTRY: weakref.WeakSet[CodeCache[object]] = weakref.WeakSet()
_SERIAL = itertools.count()


class CacheLimitWarning(UserWarning):
    """Warned once per code object when its cache is full and it turns eager.

    Turn it into an error to find recompiling code in tests:

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", CacheLimitWarning)
    ...     cache = CodeCache("f", cache_size_limit=1)
    ...     cache.add(GuardSet().compile(FrameSpec("f", (), {}, {})), "graph").translation
    ...     cache.on_miss()
    Traceback (most recent call last):
    ember.guards.cache.CacheLimitWarning: f: cache_size_limit (1) reached; running eagerly \
from now on. Last miss: guards passed on re-check
    """


class Decision(enum.Enum):
    """What to do after a cache miss.

    >>> Decision.RECOMPILE.value
    'recompile'
    """

    RECOMPILE = "recompile"
    RUN_EAGER = "run eagerly"


@dataclass(frozen=True, slots=True)
class RecompileReason:
    """Why a code object was compiled again: the failure of each existing
    entry, newest entry first.

    >>> print(RecompileReason("f (m.py:3)", ("x: size[0] expected 8, got 12",)))
    f (m.py:3): x: size[0] expected 8, got 12
    """

    code: str
    failures: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.code}: {'; '.join(self.failures)}"


@dataclass(frozen=True, slots=True, eq=False)
class CacheEntry(Generic[T]):
    """One translation and the guards under which it is valid.

    >>> from ember.guards import FrameSpec, GuardSet
    >>> entry = CacheEntry(GuardSet().compile(FrameSpec("f", (), {}, {})), "graph")
    >>> entry.guards.check(), entry.translation
    (True, 'graph')
    """

    guards: CompiledGuards
    translation: T


def code_name(code: CodeType) -> str:
    """How caches and messages name a code object.

    >>> code_name(code_name.__code__).startswith("code_name (")
    True
    """
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


class CodeCache(Generic[T]):
    """The translations of one code object and the policy that governs them.

    Without ``cache_size_limit``, the limit is the ``cache_size_limit`` setting in effect
    at each miss (``ember.compiler.config.guards``):

    >>> cache = CodeCache("f")
    >>> cache.lookup(), cache.on_miss(), cache.reasons
    (None, <Decision.RECOMPILE: 'recompile'>, [])
    >>> with settings.section.patch(cache_size_limit=3):
    ...     cache.limit
    3
    """

    __slots__ = ("__weakref__", "_limit", "_made", "_serial", "_warned", "eager", "entries",
                 "hook_entries", "name", "reasons")  # fmt: skip

    def __init__(self, name: str | CodeType, cache_size_limit: int | None = None):
        if cache_size_limit is not None and cache_size_limit < 1:
            raise ValueError("cache_size_limit must be at least 1")
        self.name = name if isinstance(name, str) else code_name(name)
        self._limit = cache_size_limit
        self.entries: list[CacheEntry[T]] = []
        #: ``(check, translation)`` per entry, in entry order, updated in place:
        #: the list ``ember.capture`` stores in ``co_extra``.
        self.hook_entries: list[tuple[Callable[..., bool], T]] = []
        self.reasons: list[RecompileReason] = []
        self.eager = False
        self._warned = False
        self._made = 0  # translations added over the cache's life (reset by clear)
        self._serial = next(_SERIAL)
        _REGISTRY.add(self)  # type: ignore[arg-type]

    @property
    def limit(self) -> int:
        """The most entries this cache keeps (its own limit, else the setting in effect)."""
        return self._limit or settings.section.get().cache_size_limit

    def lookup(self, *args: object) -> T | None:
        """The translation of the first entry whose check passes, else None.
        (The capture hook does the same in C over :attr:`hook_entries`.)"""
        for check, translation in self.hook_entries:
            if check(*args):
                return translation
        return None

    def on_miss(self, *args: object) -> Decision:
        """Decide after a miss with these argument slots: record the reason and
        recompile, or, with ``cache_size_limit`` entries, warn once and run eagerly
        (until entries are removed, up to ``accumulated_cache_size_limit`` made in all)."""
        now = settings.section.get()
        limit = self._limit or now.cache_size_limit
        full = len(self.entries) >= limit or self._made >= now.accumulated_cache_size_limit
        if self.eager and full:
            return Decision.RUN_EAGER
        failures = tuple(self._failure(entry, args) for entry in self.entries)
        if full:
            self.eager = True
            log.artifact("recompiles", lambda: f"{self.name}: cache_size_limit ({self.limit})"
                         " reached; the frame runs eagerly from now on")  # fmt: skip
            if not self._warned:
                self._warned = True
                message = (
                    f"{self.name}: cache_size_limit ({limit}) reached; running eagerly"
                    f" from now on. Last miss: {'; '.join(failures)}"
                )
                warnings.warn(message, CacheLimitWarning, stacklevel=2)
            return Decision.RUN_EAGER
        self.eager = False
        if self.entries:
            self.reasons.append(RecompileReason(self.name, failures))
            log.artifact("recompiles", lambda: self._recompile_text(args))
        return Decision.RECOMPILE

    def add(self, guards: CompiledGuards, translation: T) -> CacheEntry[T]:
        """Add a new translation; it is tried first from now on."""
        entry = CacheEntry(guards, translation)
        self._made += 1
        self.entries.insert(0, entry)
        self.hook_entries.insert(0, (guards.check, translation))
        return entry

    def remove(self, entry: CacheEntry[T]) -> bool:
        """Drop ``entry`` (an object :meth:`add` returned); whether it was there.

        >>> from ember.guards import FrameSpec, GuardSet
        >>> cache = CodeCache("f")
        >>> entry = cache.add(GuardSet().compile(FrameSpec("f", (), {}, {})), "graph")
        >>> cache.remove(entry), cache.remove(entry), cache.hook_entries
        (True, False, [])
        """
        for i, existing in enumerate(self.entries):
            if existing is entry:
                del self.entries[i]
                del self.hook_entries[i]
                return True
        return False

    def clear(self) -> None:
        """Forget entries, reasons and the eager decision."""
        self.entries.clear()
        self.hook_entries.clear()
        self.reasons.clear()
        self.eager = self._warned = False
        self._made = 0

    def _recompile_text(self, args: tuple[object, ...]) -> str:
        """The recompiles artifact: each entry's failed guard, with the line that made it."""
        lines = [f"recompiling {self.name}: no entry's guards hold"]
        for n, entry in enumerate(self.entries, 1):
            index, _ = entry.guards.explainer(*args)
            guard = entry.guards.guards.guards[index] if index >= 0 else None
            where = f"  (guard from {guard.where})" if guard is not None and guard.where else ""
            lines.append(f"  entry {n}: {self._failure(entry, args)}{where}")
        return "\n".join(lines)

    @staticmethod
    def _failure(entry: CacheEntry[T], args: tuple[object, ...]) -> str:
        return entry.guards.explain_failure(*args) or "guards passed on re-check"


def all_caches() -> list[CodeCache[object]]:
    """Every live :class:`CodeCache`, oldest first.

    >>> cache = CodeCache("g")
    >>> cache in all_caches()
    True
    """
    return sorted(_REGISTRY, key=lambda cache: cache._serial)


def recompile_reasons() -> list[RecompileReason]:
    """Every recorded recompilation, for a profiler to report.

    >>> reset(); recompile_reasons()
    []
    """
    return [reason for cache in all_caches() for reason in cache.reasons]


def reset() -> None:
    """Forget everything: every cache's entries, reasons and eager decisions.

    >>> cache = CodeCache("h"); cache.eager = True
    >>> reset(); cache.eager
    False
    """
    for cache in all_caches():
        cache.clear()
