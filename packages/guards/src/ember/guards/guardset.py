"""GuardSet: deduplicated, ordered guards, compiled into one check per frame.

>>> import torch
>>> from ember.guards import FrameSpec, Local, equals, tensor_match
>>> def f(x, k):
...     return x * k
>>> guards = GuardSet([tensor_match(Local("x"), torch.zeros(8, 4)), equals(Local("k"), 2),
...                    equals(Local("k"), 2)])
>>> len(guards)
2
>>> compiled = guards.compile(FrameSpec.from_function(f))
>>> compiled.check(torch.ones(8, 4), 2), compiled.check(torch.ones(12, 4), 2)
(True, False)
>>> compiled.explain_failure(torch.ones(12, 4), 2)
'x: size[0] expected 8, got 12'
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from types import FunctionType
from typing import Any

from ember.guards import log, settings
from ember.guards.codegen import build_check, build_explainer, build_fetch
from ember.guards.frame import FrameSpec
from ember.guards.kinds import KINDS, Guard
from ember.guards.sources import Source
from ember.guards.stamps import StampState, candidates
from ember.guards.timing import TIMES

__all__ = ["CompiledGuards", "GuardSet"]


def _order(indexed: tuple[int, Guard]) -> tuple[int, ...]:
    """Check order: no-fetch state first; then shallow sources before deep ones
    (a base's type is checked before its attributes are read); costly batched
    kinds (module state, then tensors) last."""
    index, guard = indexed
    rule = KINDS[guard.kind]
    depth = max(source.depth() for source in rule.sources(guard))
    if rule.tier == 1:
        return (rule.tier, depth, rule.rank, index)
    return (rule.tier, rule.rank, depth, index)


def _normalize(guards: Iterable[Guard]) -> tuple[Guard, ...]:
    unique: dict[Hashable, Guard] = {}
    for guard in guards:
        unique.setdefault(guard.key(), guard)
    return tuple(guard for _, guard in sorted(enumerate(unique.values()), key=_order))


@dataclass(frozen=True, slots=True, init=False)
class GuardSet:
    """An immutable set of guards, deduplicated (the first ``where`` wins) and
    in check order: cheapest and most likely to fail first.

    >>> from ember.guards import Local, is_none, equals
    >>> print(GuardSet([is_none(Local("mask")), equals(Local("k"), 1, where="m.py:3")]))
    GuardSet of 2 guards:
      EQUALS        k == 1  # m.py:3
      IS_NONE       mask is None
    """

    guards: tuple[Guard, ...]

    def __init__(self, guards: Iterable[Guard] = ()) -> None:
        object.__setattr__(self, "guards", _normalize(guards))

    def __len__(self) -> int:
        return len(self.guards)

    def __iter__(self) -> Iterator[Guard]:
        return iter(self.guards)

    def __or__(self, other: GuardSet | Iterable[Guard]) -> GuardSet:
        """The union of two guard sets.

        >>> from ember.guards import Local, is_none
        >>> len(GuardSet([is_none(Local("a"))]) | [is_none(Local("b"))])
        2
        """
        return GuardSet([*self.guards, *other])

    def __str__(self) -> str:
        lines = [f"GuardSet of {len(self.guards)} guards:"]
        for guard in self.guards:
            text = f"  {guard.kind.name:<13} {KINDS[guard.kind].describe(guard)}"
            lines.append(text if guard.where is None else f"{text}  # {guard.where}")
        return "\n".join(lines)

    def compile(self, frame: FrameSpec | FunctionType) -> CompiledGuards:
        """Compile into one check over the argument slots of ``frame`` (a
        :class:`FrameSpec`, or a function to build one from).

        Raises ValueError when a guard names an argument or a closure variable
        the frame does not have.
        """
        if isinstance(frame, FunctionType):
            frame = FrameSpec.from_function(frame)
        log.artifact("guards", lambda: f"guards of {frame.name}: {self}")
        with TIMES.timed("guards"):
            resolved: dict[str, bool] = {}
            stamps = None
            if settings.section.get().stamps and candidates(self.guards) >= StampState.MINIMUM:
                stamps = StampState(self.guards, frame, resolved)
            source, check = build_check(self.guards, frame, resolved, stamps)
            return CompiledGuards(self, frame, check, source, resolved, stamps)


@dataclass(frozen=True, slots=True, eq=False)
class CompiledGuards:
    """A guard set compiled for one frame spec.

    ``check(*args) -> bool`` is the hot function ``ember.capture`` stores in
    its per-code cache: ``args`` are the frame's argument slots in
    ``co_varnames`` order; it never raises an ``Exception``. ``source`` is its
    Python source, for debugging. ``resolved`` records how the check read each
    global name (see :class:`~ember.guards.codegen.CheckEmitter`): the explainer,
    built on first use, reads them the same way. ``stamps``, where the set has
    enough guards on long-lived objects, is the state of the check's stamp program
    (:mod:`ember.guards.stamps`).

    >>> from ember.guards import FrameSpec, Local, equals
    >>> compiled = GuardSet([equals(Local("k"), 1)]).compile(FrameSpec("f", ("k",), {}, {}))
    >>> compiled.check(1), compiled.explain_failure(2)
    (True, 'k: expected 1, got 2')
    """

    guards: GuardSet
    frame: FrameSpec
    check: Callable[..., bool]
    source: str
    resolved: dict[str, bool] = field(default_factory=dict, repr=False)
    stamps: StampState | None = field(default=None, repr=False)
    _explainer: Callable[..., tuple[int, BaseException | None]] | None = field(
        default=None, init=False, repr=False
    )
    _fetchers: dict[Source, Callable[..., Any]] = field(
        default_factory=dict, init=False, repr=False
    )

    @property
    def explainer(self) -> Callable[..., tuple[int, BaseException | None]]:
        """``explain(*args) -> (index of the first failing guard or -1, exception)``,
        built on first use: only a failed check, or a diagnostic, asks why (building it
        costs about what the check cost; a cache hit never needs it).

        >>> from ember.guards import FrameSpec, Local, equals
        >>> compiled = GuardSet([equals(Local("k"), 1)]).compile(FrameSpec("f", ("k",), {}, {}))
        >>> compiled.explainer(1), compiled.explainer(2)
        ((-1, None), (0, None))
        """
        explain = self._explainer
        if explain is None:  # two threads may both build it: either result is the same
            explain = build_explainer(self.guards.guards, self.frame, self.resolved)
            object.__setattr__(self, "_explainer", explain)
        return explain

    def explain_failure(self, *args: object) -> str | None:
        """Which guard fails for these argument slots and why, or None if all pass.

        >>> from ember.guards import FrameSpec, Attr, Local, equals
        >>> compiled = GuardSet([equals(Attr(Local("cfg"), "eps"), 0.1)]).compile(
        ...     FrameSpec("f", ("cfg",), {}, {}))
        >>> compiled.explain_failure(object())
        "cfg.eps: AttributeError: 'object' object has no attribute 'eps'"
        """
        index, error = self.explainer(*args)
        if index < 0:
            return None
        guard = self.guards.guards[index]
        if error is not None:
            return f"{guard.source}: {type(error).__name__}: {error}"
        rule = KINDS[guard.kind]
        try:
            detail = rule.message(guard, lambda source: self._fetch(source, args))
        except Exception as failure:
            return f"{guard.source}: check failed ({type(failure).__name__}: {failure})"
        return f"{guard.source}: {detail}" if rule.headed else detail

    def _fetch(self, source: Source, args: tuple[object, ...]) -> Any:
        fetch = self._fetchers.get(source)
        if fetch is None:
            fetch = self._fetchers[source] = build_fetch(source, self.frame, self.resolved)
        return fetch(*args)
